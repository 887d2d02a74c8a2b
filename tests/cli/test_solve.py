"""`repack solve` and `repack validate` as subprocesses on real request files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from solver.schema import Plan
from tests.cli.helpers import EXAMPLE_REQUEST, REQUEST_DIR, Repack, assert_one_line_error


def test_solve_writes_plan_and_prints_summary(repack: Repack, tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    proc = repack("solve", EXAMPLE_REQUEST, "--out", out)
    assert proc.returncode == 0, proc.stderr
    plan = Plan.model_validate_json(out.read_text())
    assert plan.mode == "repack"
    for word in ("parents", "children", "baseline", "speed-up", "gap", plan.status):
        assert word in proc.stdout
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]  # no temporary file left


def test_solve_without_out_prints_plan_json_on_stdout(repack: Repack) -> None:
    proc = repack("solve", REQUEST_DIR / "step-000.json", "--mode", "baseline")
    assert proc.returncode == 0, proc.stderr
    plan = Plan.model_validate_json(proc.stdout)
    assert plan.mode == "baseline"
    assert plan.metrics.step_time_ms == plan.metrics.baseline_step_time_ms
    assert "speed-up" in proc.stderr


def test_solve_reads_yaml_like_json(repack: Repack, tmp_path: Path) -> None:
    request = tmp_path / "request.yaml"
    request.write_text(yaml.safe_dump(json.loads(EXAMPLE_REQUEST.read_text())))
    from_yaml = repack("solve", request, "--deadline-ms", "500")
    from_json = repack("solve", EXAMPLE_REQUEST, "--deadline-ms", "500")
    assert from_yaml.returncode == from_json.returncode == 0
    a, b = (json.loads(p.stdout) for p in (from_yaml, from_json))
    for plan in (a, b):
        plan["metrics"].pop("solve_ms")
    assert a == b


def test_validate_accepts_solved_plan(repack: Repack, tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    assert repack("solve", EXAMPLE_REQUEST, "--out", out).returncode == 0
    proc = repack("validate", EXAMPLE_REQUEST, out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == ""


def test_validate_reports_each_violation(repack: Repack, tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    assert repack("solve", EXAMPLE_REQUEST, "--out", out).returncode == 0
    plan = json.loads(out.read_text())
    dropped = plan["children"][0]["samples"].pop()
    plan["tokens"][0] += 1
    out.write_text(json.dumps(plan))
    proc = repack("validate", EXAMPLE_REQUEST, out)
    assert proc.returncode == 1
    lines = proc.stdout.strip().splitlines()
    assert lines and any(str(dropped) in line for line in lines)


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("broken.json", '{"lengths": [1, 2', ("invalid JSON at line 1", "broken.json")),
        ("broken.yaml", "lengths: [1, 2\ncluster: {", ("invalid YAML", "broken.yaml")),
        ("extra.json", '{"lengths": [5], "colour": 1}', ("unknown field colour",)),
        ("zero.json", '{"lengths": [5, 6, 7, 0]}', ("lengths[3] = 0 must be >= 1",)),
        ("nodes.json", '{"lengths": [5], "cluster": {"nodes": 0}}', ("cluster.nodes",)),
        ("list.json", "[1, 2]", ("valid dictionary",)),
        (
            "fit.json",
            '{"lengths": [5], "cluster": {"nodes": 1}, "parent_sizes": [16]}',
            ("parent_sizes",),
        ),
    ],
)
def test_bad_request_is_one_line_exit_2(
    repack: Repack, tmp_path: Path, name: str, text: str, expected: tuple[str, ...]
) -> None:
    assert_one_line_error(repack("solve", _write(tmp_path, name, text)), *expected)


def test_missing_file_is_one_line_exit_2(repack: Repack, tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    assert_one_line_error(repack("solve", missing), str(missing), "No such file")
    assert_one_line_error(repack("validate", missing, missing), "No such file")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--mode", "fastest"), "argument --mode: invalid choice: 'fastest'"),
        (("--deadline-ms", "0"), "argument --deadline-ms: must be >= 1, got 0"),
        (("--deadline-ms", "soon"), "argument --deadline-ms: expected an integer"),
    ],
)
def test_bad_option_is_one_line_exit_2(
    repack: Repack, args: tuple[str, ...], expected: str
) -> None:
    assert_one_line_error(repack("solve", EXAMPLE_REQUEST, *args), expected)


def test_failed_solve_leaves_existing_output_untouched(repack: Repack, tmp_path: Path) -> None:
    out = _write(tmp_path, "plan.json", "previous plan\n")
    bad = _write(tmp_path, "zero.json", '{"lengths": [0]}')
    assert_one_line_error(repack("solve", bad, "--out", out))
    assert out.read_text() == "previous plan\n"


def test_unwritable_output_names_the_target(repack: Repack, tmp_path: Path) -> None:
    target = tmp_path / "no-such-dir" / "plan.json"
    assert_one_line_error(repack("solve", EXAMPLE_REQUEST, "--out", target), str(target))


def test_validate_bad_plan_file_names_it(repack: Repack, tmp_path: Path) -> None:
    bad = _write(tmp_path, "plan.json", '{"version": "v1"}')
    assert_one_line_error(repack("validate", EXAMPLE_REQUEST, bad), "in " + str(bad))
