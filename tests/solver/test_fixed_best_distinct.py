"""Mode ``repack``'s finishing (child swaps, node re-packing moves, per-node sizes) runs once
per distinct layout: the polished children and the node stage's seeds often coincide."""

from __future__ import annotations

import pytest

import solver.planner as planner
from bench.hunt_reference import wide_packed
from solver.budget import Budget, WorkPool
from solver.children import ChildrenSolution
from solver.layout import Parent
from solver.problem import Problem


def test_each_layout_is_finished_once(monkeypatch: pytest.MonkeyPatch) -> None:
    finished: list[tuple[Parent, ...]] = []
    real = planner._swapped_and_resized

    def counting(
        problem: Problem, fixed: ChildrenSolution, budget: Budget, pool: WorkPool
    ) -> ChildrenSolution:
        finished.append(fixed.layout)
        return real(problem, fixed, budget, pool)

    monkeypatch.setattr(planner, "_swapped_and_resized", counting)
    # a packed 16-GPU step of one 16-rank parent whose polished children are one of the
    # node stage's seeds (found by counting repeats on that family)
    req = wide_packed(2, 8, [16])(6).model_copy(update={"mode": "repack"})
    result = planner.plan(req, deadline_ms=60_000)
    assert len(finished) >= 2  # the polished children and the node stage's seeds
    assert len(set(finished)) == len(finished)
    assert result.metrics.step_time_ms > 0
