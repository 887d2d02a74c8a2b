"""Speculative memberships stop at a small fill cap (``membership.balance(exhaustive=False)``).

A candidate tiling or a from-scratch LPT of the upstream sizes is one option among several; on
a step full to 99.7% its greedy runs out of memory, and the fill to the token that follows is
the search a request cannot do without only for the membership it must have. Found by the
2026-12-07 evening fuzz: 256 GPUs of 32-GPU nodes, 906 samples, thirty-two 8-rank loader
parents: two candidate tilings of `repack+sizing` spent bin completion's full work cap and
CP-SAT's packing search each (~2.5 s of the mode's ~2.5 s CPU at the time), and found nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import solver.membership as membership
from solver.bin_completion import WORK_LIMIT, complete_bins
from solver.budget import Budget
from solver.errors import InfeasibleRequestError
from solver.membership import SPECULATIVE_FILL_WORK, balance
from solver.packing_search import search_packing
from solver.planner import plan
from solver.problem import Problem
from solver.schema import PlanRequest, allowed_parent_sizes
from solver.tilings import candidate_tilings, tiling_memberships
from solver.validate import validate_plan

DATA = Path(__file__).parent / "data"


def _request() -> PlanRequest:
    return PlanRequest.model_validate(json.loads((DATA / "fuzz-8x32-packed-906.json").read_text()))


class _Calls:
    """The real fill searches, with what they were asked recorded."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.limits: list[int] = []
        self.searches = 0

        def spied_complete(*args: Any, **kwargs: Any) -> Any:
            self.limits.append(args[4] if len(args) > 4 else kwargs.get("work_limit", WORK_LIMIT))
            return complete_bins(*args, **kwargs)

        def spied_search(*args: Any, **kwargs: Any) -> Any:
            self.searches += 1
            return search_packing(*args, **kwargs)

        monkeypatch.setattr(membership, "complete_bins", spied_complete)
        monkeypatch.setattr(membership, "search_packing", spied_search)


def test_candidate_tilings_never_run_the_full_fill_search(monkeypatch: pytest.MonkeyPatch) -> None:
    request = _request()
    problem = Problem.from_request(request)
    calls = _Calls(monkeypatch)
    allowed = allowed_parent_sizes(request.cluster, request.model, uniform=False)
    tilings = candidate_tilings(problem, allowed, request.cluster.world_size)
    assert tilings
    for sizes in tilings:
        tiling_memberships(problem, sizes, Budget(600_000))
    assert calls.limits, "no tiling of this step reached the fill to the token"
    assert max(calls.limits) <= SPECULATIVE_FILL_WORK
    assert calls.searches == 0


def test_the_membership_a_request_needs_keeps_the_full_search(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only exact partitions fit ({21, 8}, {17, 6, 6}, {13, 11, 5} thousand tokens in ranks of
    29,000): the greedy fills strand a sample and the default ``balance`` goes on to the
    full searches; the speculative one gives up with ``InfeasibleRequestError`` once its
    capped search fails, never asking CP-SAT."""
    request = PlanRequest(
        cluster={"nodes": 3, "gpus_per_node": 1, "max_tokens_per_rank": 29000},
        lengths=[13000, 6000, 11000, 5000, 17000, 21000, 6000, 8000],
    )
    problem = Problem.from_request(request)
    calls = _Calls(monkeypatch)
    members = balance(problem, [1, 1, 1], "baseline")
    assert sorted(s for group in members for s in group) == list(range(8))
    assert all(sum(request.lengths[s] for s in group) <= 29000 for group in members)
    assert calls.limits and calls.limits[0] == WORK_LIMIT
    calls.limits.clear()
    searches = calls.searches
    try:
        found: list[list[int]] | None = balance(problem, [1, 1, 1], "baseline", exhaustive=False)
    except InfeasibleRequestError:
        found = None
    assert calls.limits == [SPECULATIVE_FILL_WORK]
    assert calls.searches == searches  # CP-SAT not asked
    if found is not None:  # the capped completion found it
        assert all(sum(request.lengths[s] for s in group) <= 29000 for group in found)


def test_the_fuzzed_step_is_planned_in_every_mode() -> None:
    request = _request()
    for mode in ("sizing", "repack+parent", "repack+sizing"):
        got = plan(request.model_copy(update={"mode": mode}), 600_000)
        assert validate_plan(request, got) == []
        assert got.metrics.step_time_ms <= got.metrics.baseline_step_time_ms
