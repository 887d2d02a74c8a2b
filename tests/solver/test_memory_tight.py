"""Memory-tight steps: parents a loader filled to ~100% of their ranks' token budget."""

from __future__ import annotations

import random

import pytest

from solver.node_packing import pack_by_nodes, segments_fit
from solver.planner import plan
from solver.problem import Problem
from solver.schema import PlanRequest
from solver.validate import validate_plan

CAP = 32 * 32768
"""Tokens a 32-rank parent of the default cluster holds."""


def packed_request(seed: int, longest: int, slack: int = 50) -> PlanRequest:
    """Two 32-rank parents on 64 GPUs as a packing loader leaves them: parent 0 holds the
    longest sample (more than a node can hold) and a few short ones; parent 1 is ~200 short
    samples filling all but ``slack`` tokens of its memory."""
    rng = random.Random(seed)
    first = [longest] + [rng.randint(1000, 4000) for _ in range(6)]
    raw = [rng.randint(1000, 9000) for _ in range(200)]
    scale = (CAP - slack) / sum(raw)
    second = [max(1, int(x * scale)) for x in raw]
    second[0] += CAP - slack - sum(second)
    return PlanRequest.model_validate(
        {
            "cluster": {"nodes": 8},
            "lengths": first + second,
            "parent_sizes": [32, 32],
            "parent_of": [0] * len(first) + [1] * len(second),
        }
    )


def test_full_parent_cannot_be_packed_by_nodes_as_given() -> None:
    req = packed_request(0, 400_000)
    problem = Problem.from_request(req)
    full = [s for s, j in enumerate(req.parent_of or []) if j == 1]
    assert sum(problem.tokens[s] for s in full) == CAP - 50
    assert not segments_fit(problem, 32, full)
    assert pack_by_nodes(problem, 32, 32, full) is None
    # one sample fewer and the node-level packing fits
    assert segments_fit(problem, 32, full[1:])
    assert pack_by_nodes(problem, 32, 32, full[1:]) is not None


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("longest", [350_000, 400_000])
def test_parent_solver_makes_room_in_a_full_parent(seed: int, longest: int) -> None:
    req = packed_request(seed, longest)
    p = plan(req.model_copy(update={"mode": "repack+parent"}), deadline_ms=60_000)
    assert validate_plan(req, p) == []
    # moving a few short samples to the long sample's parent lets the full one repack
    assert p.metrics.speedup > 1.2
    assert sum(req.lengths[s] for s in p.parents[1].samples) < CAP - 50
    sizing = plan(req.model_copy(update={"mode": "repack+sizing"}), deadline_ms=60_000)
    assert sizing.metrics.step_time_ms <= p.metrics.step_time_ms + 1e-6
    # the memory bound: the long sample's parent must also hold what the full one cannot
    assert p.metrics.gap is not None and p.metrics.gap < 0.05
