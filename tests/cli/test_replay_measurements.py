"""`repack replay --measurements FILE`: the trace re-scored with the profile measurements imply."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from solver.cost_model import CostModel, SampleCosts
from solver.measurement_schema import MeasuredStep
from solver.planner import plan
from solver.profile_feedback import constants_of, with_constants
from solver.step_terms import step_terms
from solver.trace import load_trace
from solver.validate import step_seconds
from tests.cli.helpers import SMALL_TRACE, Repack, assert_one_line_error


def _measured_file(tmp_path: Path, slowdown: float) -> Path:
    """What the small trace's steps would measure on links ``slowdown`` times slower."""
    lines = []
    for i, request in enumerate(load_trace(SMALL_TRACE)):
        start = constants_of(request)
        truth = with_constants(
            request,
            {
                "intra_node_gbps": start["intra_node_gbps"] / slowdown,
                "inter_node_gbps": start["inter_node_gbps"] / slowdown,
            },
        )
        p = plan(request)
        cost = CostModel.from_request(truth)
        terms = step_terms(truth, p, cost)
        step_s = step_seconds(truth, p, cost, SampleCosts.build(cost, truth.lengths))
        m = MeasuredStep(
            job_id="j",
            step=request.step if request.step is not None else i,
            step_time_ms=step_s * 1e3,
            all_to_all_ms=(terms.intra + terms.inter) * 1e3,
        )
        lines.append(m.model_dump_json())
    path = tmp_path / "measured.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.timeout(300)
def test_replay_with_measurements_fits_the_slower_links(repack: Repack, tmp_path: Path) -> None:
    measured = _measured_file(tmp_path, slowdown=2.0)
    args = ("replay", SMALL_TRACE, "--modes", "repack+sizing", "--workers", "1", "--json")
    base = repack(*args, "--no-progress", timeout=240)
    got = repack(*args, "--no-progress", "--measurements", measured, timeout=240)
    assert got.returncode == 0, got.stderr
    report = json.loads(got.stdout)
    start = constants_of(next(iter(load_trace(SMALL_TRACE))))
    fitted = report["measured_profile"]
    assert fitted["intra_node_gbps"] == pytest.approx(start["intra_node_gbps"] / 2, rel=0.05)
    assert fitted["efficiency_linear"] == pytest.approx(start["efficiency_linear"], rel=0.05)
    assert "measured profile from 4 steps" in got.stderr
    slow = report["groups"]["all"][0]["step_time_ms"]
    fast = json.loads(base.stdout)["groups"]["all"][0]["step_time_ms"]
    assert slow > fast  # slower links, slower predicted steps


def test_replay_refuses_a_bad_measurements_file(repack: Repack, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"job_id": "j", "step": 0, "step_time_ms": -3}\n')
    proc = repack("replay", SMALL_TRACE, "--workers", "1", "--measurements", bad)
    assert_one_line_error(proc, "step_time_ms", "bad.jsonl")
    unknown = tmp_path / "far.jsonl"
    unknown.write_text('{"job_id": "j", "step": 99, "step_time_ms": 3}\n')
    proc = repack("replay", SMALL_TRACE, "--workers", "1", "--measurements", unknown)
    assert_one_line_error(proc, "measured step 99 is not in the trace")
