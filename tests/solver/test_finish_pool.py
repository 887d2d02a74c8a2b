"""The layouts mode ``repack`` finishes for one answer share one pool of work
(``planner.FINISH_POOL``, ``budget.WorkPool``).

Found by the 2026-12-07 evening fuzz: 16 GPUs, one 16-rank parent, 277 samples at 90% of
memory. Mode ``repack`` finished four layouts (the polished children and three node-stage
seeds), each with the child swaps' whole limit: 96,000 tries, ~1 s of CPU for a 16-GPU step,
and `repack+parent`, which computes that answer too, ~1.5 s (its 1 s safety net fired).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import solver.planner as planner
from solver.budget import WorkPool
from solver.child_swaps import SMALL_SWAP_SCALE, SWAP_WORK, swap_children
from solver.planner import FINISH_POOL, plan
from solver.schema import PlanRequest
from solver.validate import validate_plan

DATA = Path(__file__).parent / "data"


def test_a_pool_caps_the_runs_together_and_each_run_at_its_limit() -> None:
    pool = WorkPool(2.0)
    assert pool.cap("a", 100) == 100
    pool.charge("a", 100)
    assert pool.cap("a", 100) == 100
    pool.charge("a", 60)
    assert pool.cap("a", 100) == 40
    pool.charge("a", 40)
    assert pool.cap("a", 100) == 0
    assert pool.cap("b", 100) == 100  # stages are pooled apart
    assert WorkPool(0.5).cap("a", 100) == 50


def test_the_finished_layouts_of_one_answer_share_the_swaps_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    request = PlanRequest.model_validate(
        json.loads((DATA / "fuzz-2x8-one-parent-277.json").read_text())
    ).model_copy(update={"mode": "repack"})
    pools: dict[int, WorkPool] = {}

    def spied(*args: Any, **kwargs: Any) -> Any:
        pool = kwargs.get("pool")
        assert pool is not None  # every finish draws from its answer's pool
        pools[id(pool)] = pool
        return swap_children(*args, **kwargs)

    monkeypatch.setattr(planner, "swap_children", spied)
    got = plan(request, 600_000)
    assert validate_plan(request, got) == []
    limit = SWAP_WORK * SMALL_SWAP_SCALE  # one run's limit on a 16-GPU request
    spent = [p.spent("child_swaps") for p in pools.values()]
    assert len(spent) == 1
    assert limit < spent[0] <= FINISH_POOL * limit  # it binds here, and holds
    assert spent[0] <= 2 * limit  # four finishes took 4x before the pool
