"""The installed `repack` outside the checkout: version, shipped scenarios, missing extras,
progress bars, compact JSON, and no reference to files beside the repository."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from solver.trace import SHIPPED_SCENARIOS, resolve_trace
from solver.version import package_version
from tests.cli.helpers import EXAMPLE_REQUEST, assert_one_line_error
from tests.helpers import ROOT

REPACK = Path(sys.executable).parent / "repack"
"""The console script pip installed into this interpreter's environment."""


def installed(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(REPACK), *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_version_is_the_installed_package_version(tmp_path: Path) -> None:
    proc = installed("--version", cwd=tmp_path)
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"repack {package_version()}"
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", package_version())


def test_documented_scenario_paths_work_outside_the_checkout(tmp_path: Path) -> None:
    """`repack replay scenarios/...` (README) and the bare name resolve to shipped files."""
    for name in ("scenarios/gpu16-small.yaml", "gpu16-small"):
        proc = installed("replay", name, "--modes", "baseline", "--json", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["steps"] == 4
    missing = installed("replay", "scenarios/nope.yaml", cwd=tmp_path)
    assert_one_line_error(missing, "scenarios/nope.yaml")


def test_a_local_file_wins_over_a_shipped_scenario(tmp_path: Path) -> None:
    local = tmp_path / "scenarios" / "gpu16-small.yaml"
    local.parent.mkdir()
    local.write_text("not: [a scenario")
    assert resolve_trace(Path("gpu16-small")) == SHIPPED_SCENARIOS / "gpu16-small.yaml"
    proc = installed("replay", "scenarios/gpu16-small.yaml", cwd=tmp_path)
    assert_one_line_error(proc, "invalid YAML")


@pytest.mark.slow
def test_the_wheel_ships_the_scenarios_and_dashboard_assets(tmp_path: Path) -> None:
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    proc = subprocess.run(
        [*pip_wheel, "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if proc.returncode != 0 and "No module named" in proc.stderr:
        pytest.skip(f"cannot build a wheel here: {proc.stderr.strip()[-200:]}")
    assert proc.returncode == 0, proc.stderr
    (wheel,) = tmp_path.glob("repack-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {
        "solver/scenarios/gpu64-200steps.yaml",
        "solver/scenarios/gpu16-small.yaml",
        "solver/scenarios/gpu16-requests/step-000.json",
        "api/templates/base.html",
        "api/static/dashboard.js",
    }
    assert shipped <= names


def test_a_missing_extra_is_one_line_naming_the_install(tmp_path: Path) -> None:
    """Without the api extra, `repack serve` says what to install instead of a traceback."""
    hide = "import sys; sys.modules['fastapi'] = None; sys.modules['uvicorn'] = None; "
    run = "from cli.main import main; sys.exit(main(['serve', '--port', '0']))"
    proc = subprocess.run(
        [sys.executable, "-c", hide + run],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert_one_line_error(proc, "pip install 'repack[api]'")
    help_text = subprocess.run(
        [sys.executable, "-c", hide + "from cli.main import main; main(['--help'])"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert help_text.returncode == 0, help_text.stderr  # the CLI itself needs no extra


def test_no_progress_bar_when_stderr_is_not_a_terminal(tmp_path: Path) -> None:
    proc = installed("replay", "gpu16-small", "--modes", "baseline", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "plan/s" not in proc.stderr and "it/s" not in proc.stderr
    assert "\r" not in proc.stderr


def test_plan_json_is_compact_unless_indented(tmp_path: Path) -> None:
    compact = installed("solve", EXAMPLE_REQUEST, cwd=tmp_path)
    pretty = installed("solve", EXAMPLE_REQUEST, "--indent", "2", cwd=tmp_path)
    assert compact.returncode == pretty.returncode == 0
    assert compact.stdout.count("\n") == 1
    assert pretty.stdout.count("\n") > 100
    assert len(compact.stdout) * 2 < len(pretty.stdout)
    plans = [json.loads(proc.stdout) for proc in (compact, pretty)]
    for p in plans:
        del p["metrics"]["solve_ms"]  # wall time: the only field two solves may differ in
    assert plans[0] == plans[1]
    bad = installed("solve", EXAMPLE_REQUEST, "--indent", "-1", cwd=tmp_path)
    assert_one_line_error(bad, "--indent")


def test_a_misspelled_field_is_named(tmp_path: Path) -> None:
    request = tmp_path / "typo.json"
    request.write_text(json.dumps({"cluster": {"nodes": 2}, "lenghts": [100, 200]}))
    proc = installed("solve", request, cwd=tmp_path)
    assert_one_line_error(proc, "unknown field lenghts", "lengths: required field is missing")
    assert proc.stdout == ""


def test_nothing_points_outside_the_repository() -> None:
    """Code and docs cite docs/design.md, never files beside the checkout."""
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.split()
    if not tracked or shutil.which("git") is None:
        pytest.skip("not a git checkout")
    outside = "../" + "shared"  # spelled apart so that this file does not match itself
    offenders = []
    for name in tracked:
        path = ROOT / name
        text_file = path.suffix in {".py", ".md", ".yaml", ".toml", ".html", ".js", ".sh"}
        if text_file and path.exists() and outside in path.read_text(errors="replace"):
            offenders.append(name)
    assert offenders == []
    assert (ROOT / "docs" / "design.md").read_text().startswith("# repack")
