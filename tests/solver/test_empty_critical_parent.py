"""A parent with no samples can be the critical one: with a collective latency of 100 ms per
peer its collectives alone outlast every other parent. ``children.polish`` built a CP-SAT
model of it and crashed (``max()`` of no tokens) in modes ``repack`` and ``repack+parent``
(a randomised hunt over the accepted ranges of the profile, 2026-12-07: 1,336 of ~23,000
requests)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from solver.planner import plan
from solver.schema import PlanRequest
from solver.validate import validate_plan

DATA = Path(__file__).resolve().parent / "data"
MODES = ("baseline", "sizing", "repack", "repack+parent", "repack+sizing")

REQUESTS = [
    {
        "cluster": {"nodes": 1, "gpus_per_node": 4},
        "profile": {"collective_latency_us_per_peer": 100000.0},
        "parent_sizes": [1, 1, 2],
        "parent_of": [0],
        "lengths": [1],
    },
    {
        "cluster": {"nodes": 3, "gpus_per_node": 8, "max_tokens_per_rank": 2},
        "model": {"heads": 2, "kv_heads": 2, "layers": 4, "pattern": "SF"},
        "profile": {
            "collective_latency_us_per_peer": 100000.0,
            "sample_overhead_us_full": 100.0,
            "intra_node_gbps": 0.01,
            "efficiency_full_attention": 0.011,
        },
        "lengths": [1, 1, 1],
        "parent_sizes": [1, 1, 1, 1, 2, 1, 1, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 2, 1, 1],
        "parent_of": [13, 12, 2],
    },
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("data", REQUESTS)
def test_an_empty_critical_parent_is_planned(data: dict[str, object], mode: str) -> None:
    req = PlanRequest.model_validate({**data, "mode": mode})
    got = plan(req, deadline_ms=60_000)
    assert validate_plan(req, got) == []
    assert got.metrics.lower_bound_ms is not None
    assert got.metrics.lower_bound_ms <= got.metrics.step_time_ms * (1 + 1e-9)
    # the parents' collectives are a bound too (``bounds.collectives_floor``): these plans
    # are optimal, where the bounds about samples alone reported a gap of 100%
    assert got.metrics.gap is not None and got.metrics.gap < 1e-9
    if mode != "baseline":
        base = plan(req.model_copy(update={"mode": "baseline"}))
        assert got.metrics.step_time_ms <= base.metrics.step_time_ms * (1 + 1e-9)


def test_a_model_without_sparse_layers_computes_no_nan() -> None:
    """Pattern ``F`` (no sparse layers): the receiver floors multiplied 0 sparse layers by an
    infinite child time, a NaN that only a mask kept out of the plan (a hunt, 2026-12-07)."""
    data = json.loads((DATA / "hunt-16x8-pattern-f-parents-2.json").read_text())
    req = PlanRequest.model_validate({**data, "mode": "repack+parent"})
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        got = plan(req, deadline_ms=60_000)
    assert validate_plan(req, got) == []
