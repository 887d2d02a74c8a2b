"""On clusters whose ranks are not a power of two, the sizing modes also try a parent wider than
half the cluster (``tilings.wide_tilings``): no uniform tiling has it. 96 GPUs of 8-GPU nodes,
a 471,859-token sample that 16 ranks can hold (a hunt over cluster shapes, 2026-12-07):
`sizing` and `repack+sizing` kept [32, 32, 32] at 23,648 ms, while [64, 32], even with the
loader model's membership and no repacking, takes 19,860 ms."""

from __future__ import annotations

from pathlib import Path

import pytest

from solver.planner import plan
from solver.problem import Problem
from solver.schema import PlanRequest, allowed_parent_sizes
from solver.tilings import wide_tilings
from solver.validate import validate_plan

DATA = Path(__file__).resolve().parent / "data"


def _request() -> PlanRequest:
    return PlanRequest.model_validate_json((DATA / "wide-parent-96-gpus.json").read_text())


@pytest.mark.parametrize("mode", ["sizing", "repack+sizing"])
def test_a_parent_wider_than_half_of_96_gpus_is_tried(mode: str) -> None:
    req = _request()
    data = req.model_dump(mode="json")
    data.pop("parent_of", None)
    simple = plan(
        PlanRequest.model_validate({**data, "parent_sizes": [64, 32], "mode": "baseline"})
    )
    got = plan(req.model_copy(update={"mode": mode}))
    assert validate_plan(req, got) == []
    assert got.metrics.step_time_ms <= simple.metrics.step_time_ms, (
        got.metrics.step_time_ms,
        simple.metrics.step_time_ms,
    )


def test_wide_tilings_only_where_no_uniform_tiling_has_the_width() -> None:
    req = _request()
    problem = Problem.from_request(req)
    allowed = allowed_parent_sizes(req.cluster, req.model, uniform=False)
    assert wide_tilings(problem, allowed, 96) == [[64, 32], [64, 16, 16]]
    # 64 ranks: every width up to the cluster tiles it uniformly
    assert wide_tilings(problem, [1, 2, 4, 8, 16, 32, 64], 64) == []
