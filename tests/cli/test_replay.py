"""`repack replay` and `repack bench` as subprocesses on real scenario files."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cli.replay import REPLAY_MODES, replay
from cli.replay_stats import StepResult, wide_steps
from solver.trace import load_trace
from tests.cli.helpers import REQUEST_DIR, SCENARIOS, SMALL_TRACE, Repack, assert_one_line_error
from tests.helpers import ROOT


def test_replay_without_baseline_mode_still_classifies_steps() -> None:
    requests = list(load_trace(REQUEST_DIR))
    results = replay(requests, ("repack",), workers=1)
    assert [(r.step, r.mode) for r in results] == [
        (i, mode) for i in range(len(requests)) for mode in ("baseline", "repack")
    ]
    assert wide_steps(results) == wide_steps(replay(requests, ("baseline",), workers=1))
    assert len(wide_steps(results)) == 1  # the directory trace has one step with 16-rank parents


def test_replay_json_on_small_scenario(repack: Repack) -> None:
    proc = repack("replay", SMALL_TRACE, "--steps", "2", "--workers", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["steps"] == 2
    assert report["modes"] == list(REPLAY_MODES)
    for group in ("wide", "all"):
        rows = {row["mode"]: row for row in report["groups"][group]}
        assert list(rows) == list(REPLAY_MODES)
    rows = {row["mode"]: row for row in report["groups"]["all"]}
    assert rows["baseline"]["steps"] == 2
    assert rows["baseline"]["change_pct"] == 0
    assert rows["repack"]["step_time_ms"] <= rows["baseline"]["step_time_ms"]
    assert rows["repack+parent"]["step_time_ms"] <= rows["repack"]["step_time_ms"]


def test_replay_table_on_request_directory(repack: Repack) -> None:
    proc = repack("replay", REQUEST_DIR, "--modes", "baseline", "repack", "--workers", "1")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "3 steps" in lines[0]
    assert sum("| all steps" in line for line in lines) == 2
    assert sum("| wide-parent steps" in line for line in lines) == 2
    assert "step time ms" in proc.stdout and "p99 solve ms" in proc.stdout


def test_replay_parallel_matches_serial() -> None:
    """Every mode, value for value: the search is bounded by deterministic work only (a 60 s
    request deadline buys the default work and keeps the safety net out of the way on a busy
    machine)."""
    requests = list(load_trace(REQUEST_DIR))
    serial = replay(requests, REPLAY_MODES, workers=1, deadline_ms=60_000)
    parallel = replay(requests, REPLAY_MODES, workers=2, deadline_ms=60_000)
    order = [(i, mode) for i in range(len(requests)) for mode in REPLAY_MODES]
    assert [(r.step, r.mode) for r in serial] == [(r.step, r.mode) for r in parallel] == order

    def values(results: list[StepResult]) -> list[tuple[int, str, bool, float, float | None]]:
        return [(r.step, r.mode, r.wide, r.step_time_ms, r.gap) for r in results]

    assert values(serial) == values(parallel)


def test_replay_bad_file_in_directory_is_named(repack: Repack, tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    shutil.copytree(REQUEST_DIR, trace)
    (trace / "step-009.json").write_text('{"lengths": [3, 0]}')
    proc = repack("replay", trace, "--workers", "1")
    assert_one_line_error(proc, "lengths[1] = 0 must be >= 1", "step-009.json")


def test_replay_bad_scenario_is_one_line(repack: Repack, tmp_path: Path) -> None:
    scenario = tmp_path / "bad.yaml"
    scenario.write_text("cluster: {nodes: 2}\ntrace: {steps: 2, fil: 0.5}\n")
    assert_one_line_error(repack("replay", scenario), "trace.fil: unknown field", "bad.yaml")


def test_replay_bad_mode_is_one_line(repack: Repack) -> None:
    assert_one_line_error(repack("replay", SMALL_TRACE, "--modes", "fast"), "--modes")


def test_replay_survives_a_deadline_that_fires() -> None:
    """A deadline that fires mid-search still gives a plan for every step (design section 4)."""
    requests = list(load_trace(SMALL_TRACE))
    results = replay(requests, ("repack",), workers=1, deadline_ms=1)
    assert [r.step for r in results if r.mode == "repack"] == list(range(len(requests)))


def test_bench_tiny_json(repack: Repack) -> None:
    proc = repack("bench", "--sizes", "16:20", "64:60", "--repeats", "3", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["rows"]
    assert [(row["gpus"], row["solver"]) for row in rows] == [
        (16, "full"),
        (16, "greedy"),
        (64, "full"),
        (64, "greedy"),
    ]
    for row in rows:
        assert row["repeats"] == 3
        assert row["p50_ms"] <= row["p95_ms"] <= row["p99_ms"]
    assert 10 <= rows[0]["samples"] <= 40  # about the 20 asked for
    assert 40 <= rows[2]["samples"] <= 90


def test_bench_table_without_greedy(repack: Repack) -> None:
    proc = repack("bench", "--sizes", "16:20", "--repeats", "2", "--no-greedy")
    assert proc.returncode == 0, proc.stderr
    assert "p99 ms" in proc.stdout and "| 16   | full " in proc.stdout
    assert "greedy" not in proc.stdout


@pytest.mark.parametrize("size", ["16", "12:50", "16:x", "16:100000"])
def test_bench_bad_size_is_one_line(repack: Repack, size: str) -> None:
    assert_one_line_error(repack("bench", "--sizes", size, "--repeats", "1"), size)


@pytest.mark.slow
def test_gpu64_scenario_needs_wide_parents_in_about_a_tenth_of_steps() -> None:
    """The documented property of scenarios/gpu64-200steps.yaml, measured with the planner."""
    requests = list(load_trace(SCENARIOS / "gpu64-200steps.yaml"))
    results = replay(requests, ("baseline",), workers=2)
    share = len(wide_steps(results)) / len(requests)
    assert 0.05 <= share <= 0.15


def test_closed_stdout_exits_quietly() -> None:
    """`repack replay ... | head -1`: the reader leaves early; no error line, no traceback."""
    args = ["replay", str(SMALL_TRACE), "--modes", "baseline", "--steps", "1", "--no-progress"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    assert proc.stderr.read() == ""
    assert proc.wait(timeout=60) == 141


def test_bench_quality_vs_deadline(repack: Repack) -> None:
    args = ("--sizes", "16:20", "--repeats", "2", "--no-greedy", "--json", "--no-progress")
    proc = repack("bench", *args, "--deadlines", "50,1000", "--work-only")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["rows"]
    assert [(r["gpus"], r["deadline_ms"]) for r in rows] == [(16, 50), (16, 1000)]
    assert rows[1]["vs_longest_pct"] == 0.0  # the longest deadline is the reference
    for r in rows:
        assert r["change_pct"] <= 0.0  # never slower than the baseline
        assert r["vs_longest_pct"] is not None and "step_times_ms" not in r
        assert r["deadline_hits"] == 0  # --work-only: the safety net is out of reach


@pytest.mark.parametrize("value", ["50,x", "0,100", ""])
def test_bench_bad_deadlines_is_one_line(repack: Repack, value: str) -> None:
    assert_one_line_error(repack("bench", "--deadlines", value), "--deadlines")


def test_bench_deadline_options_exclude_each_other(repack: Repack) -> None:
    proc = repack("bench", "--deadlines", "50", "--deadline-ms", "100")
    assert_one_line_error(proc, "not allowed with argument")
