"""`--profile FILE` on solve, validate, replay and bench, through the real command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from solver.schema import Plan
from tests.cli.helpers import EXAMPLE_REQUEST, SMALL_TRACE, Repack, assert_one_line_error

SLOW_LINKS = {"name": "slow-links", "inter_node_gbps": 2.0, "collective_latency_us": 40.0}


@pytest.fixture
def profile_file(tmp_path: Path) -> Path:
    path = tmp_path / "slow.yaml"
    path.write_text(yaml.safe_dump(SLOW_LINKS))
    return path


def test_solve_and_validate_with_a_profile(
    repack: Repack, tmp_path: Path, profile_file: Path
) -> None:
    default_out, slow_out = tmp_path / "default.json", tmp_path / "slow.json"
    assert repack("solve", EXAMPLE_REQUEST, "--out", default_out).returncode == 0
    proc = repack("solve", EXAMPLE_REQUEST, "--profile", profile_file, "--out", slow_out)
    assert proc.returncode == 0, proc.stderr
    default, slow = (Plan.model_validate_json(p.read_text()) for p in (default_out, slow_out))
    assert slow.metrics.baseline_step_time_ms > default.metrics.baseline_step_time_ms
    checked = repack("validate", EXAMPLE_REQUEST, slow_out, "--profile", profile_file)
    assert checked.returncode == 0, checked.stdout
    # without the profile, the metrics no longer match the cost model
    assert repack("validate", EXAMPLE_REQUEST, slow_out).returncode == 1


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("efficiency_linear: 0.001\n", ("efficiency_linear", "greater than 0.01", "bad.yaml")),
        ("peak_tflops: 1.0e+308\n", ("peak_tflops", "less than or equal to 1000000")),
        ("intra_node_gbps: 1.0e-308\n", ("intra_node_gbps", "greater than or equal to 0.01")),
        ("colour: red\n", ("colour: unknown field",)),
        ("[1, 2]\n", ("valid dictionary",)),
        ("name: [1\n", ("invalid YAML",)),
    ],
)
def test_bad_profile_is_one_line_exit_2(
    repack: Repack, tmp_path: Path, text: str, expected: tuple[str, ...]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    assert_one_line_error(repack("solve", EXAMPLE_REQUEST, "--profile", bad), *expected)


def test_missing_profile_file(repack: Repack, tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    proc = repack("replay", SMALL_TRACE, "--profile", missing, "--steps", "1")
    assert_one_line_error(proc, str(missing), "No such file")


def test_profile_name_alone_is_for_the_service(repack: Repack, tmp_path: Path) -> None:
    request = json.loads(EXAMPLE_REQUEST.read_text())
    path = tmp_path / "named.json"
    path.write_text(json.dumps({**request, "profile_name": "lab-a"}))
    assert_one_line_error(repack("solve", path), "profile_name", "only the service resolves")


def test_replay_and_bench_take_a_profile(repack: Repack, profile_file: Path) -> None:
    args = ("--steps", "1", "--modes", "repack", "--workers", "1", "--json", "--no-progress")
    plain = repack("replay", SMALL_TRACE, *args)
    slow = repack("replay", SMALL_TRACE, *args, "--profile", profile_file)
    assert plain.returncode == slow.returncode == 0, slow.stderr
    times = [
        {row["mode"]: row["step_time_ms"] for row in json.loads(p.stdout)["groups"]["all"]}
        for p in (plain, slow)
    ]
    assert times[1]["repack"] > times[0]["repack"]
    bench_args = ("--sizes", "16:50", "--repeats", "1", "--no-greedy", "--json", "--no-progress")
    bench = repack("bench", *bench_args, "--profile", profile_file)
    assert bench.returncode == 0, bench.stderr
    assert json.loads(bench.stdout)["rows"][0]["repeats"] == 1


@pytest.mark.parametrize(
    ("cluster", "field"),
    [
        ({"peak_tflops": 1e308}, "cluster.peak_tflops"),
        ({"compute_efficiency": 1e-300}, "cluster.compute_efficiency"),
        ({"intra_node_gbps": 1e-308}, "cluster.intra_node_gbps"),
    ],
)
def test_implausible_cluster_is_one_line(
    repack: Repack, tmp_path: Path, cluster: dict[str, float], field: str
) -> None:
    """Values that used to end in a traceback (ZeroDivisionError, CP-SAT overflow)."""
    path = tmp_path / "request.json"
    path.write_text(json.dumps({"cluster": cluster, "lengths": [150000, 9000]}))
    assert_one_line_error(repack("solve", path), field, "request.json")
