"""The latency cuts at scale keep plans: vectorised per-sample bounds equal their definition,
and every prune (bounds, early stops) only drops candidates that could not win."""

from __future__ import annotations

import math
from itertools import islice
from typing import Any

import pytest

from solver import planner
from solver.budget import Budget
from solver.children import children_below, membership_bounds, solve_children
from solver.cost_model import child_layer_seconds
from solver.planner import _baseline_parents, _repack_parent, plan
from solver.problem import Problem
from solver.schema import ClusterSpec, PlanRequest
from solver.trace import PackedLoader, Scenario, TraceSpec, load_trace
from tests.solver.default_profile_golden import scenario_path

NO_CLOCK_MS = 600_000


@pytest.fixture(scope="module", params=[("gpu64-200steps.yaml", 3), ("gpu64-packed.yaml", 0)])
def step(request: pytest.FixtureRequest) -> PlanRequest:
    name, index = request.param
    return next(islice(load_trace(scenario_path(name)), index, None))


def _scalar_choice(problem: Problem, sample: int, size: int) -> tuple[float, int]:
    """``single_choices`` as defined: the least (time, busiest-rank tokens) over the child
    sizes of a parent of ``size`` that hold the sample alone."""
    length, sparse = problem.tokens[sample], problem.sparse_s[sample]
    best: tuple[float, int] = (math.inf, 0)
    for k in problem.child_sizes:
        if k <= size and length <= problem.capacity(k):
            best = min(
                best, (child_layer_seconds(problem.cost, k, sparse, length), -(-length // k))
            )
    return best


def test_vectorised_single_choices_are_the_definition_bit_for_bit(step: PlanRequest) -> None:
    problem = Problem.from_request(step)
    for size in (1, 2, 4, 8, 16, 32, 64):
        expected = tuple(_scalar_choice(problem, s, size) for s in range(problem.num_samples))
        assert problem.single_choices(size) == expected


def test_membership_bounds_bound_the_children_and_early_stop_is_exact(
    step: PlanRequest,
) -> None:
    problem = Problem.from_request(step)
    sizes, members = _baseline_parents(problem, step)
    solved = solve_children(problem, sizes, members, Budget(NO_CLOCK_MS))
    bounds = membership_bounds(problem, sizes, members)
    assert bounds == solved.parent_bounds
    assert max(bounds) <= solved.evaluation.step_s * (1 + 1e-9)
    same = children_below(problem, sizes, members, Budget(NO_CLOCK_MS), math.inf, bounds)
    assert same is not None and same.layout == solved.layout
    # Any limit below the layout's step time: some parent's greedy time exceeds it.
    below = solved.evaluation.step_s * (1 - 1e-6)
    assert children_below(problem, sizes, members, Budget(NO_CLOCK_MS), below) is None


def test_repack_parent_is_pruned_only_when_it_cannot_win(step: PlanRequest) -> None:
    problem = Problem.from_request(step)
    sizes, members = _baseline_parents(problem, step)
    unpruned = _repack_parent(problem, sizes, members, Budget(NO_CLOCK_MS))
    assert unpruned is not None
    # An incumbent above its result: its bounds cannot rule it out, the answer is unchanged.
    above = unpruned.evaluation.step_s * (1 + 1e-6)
    kept = _repack_parent(problem, sizes, members, Budget(NO_CLOCK_MS), above)
    assert kept is not None and kept.layout == unpruned.layout
    # An incumbent below every lower bound: nothing here can beat it, no child search runs.
    assert _repack_parent(problem, sizes, members, Budget(NO_CLOCK_MS), 1e-9) is None


@pytest.mark.parametrize("mode", ["repack+parent", "repack+sizing"])
def test_repack_answer_is_skipped_only_where_node_memory_shows_it_cannot_win(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A packed 32-GPU step of 8-rank loader parents (seed 202, step 24): the re-balanced
    layout already beats every layout of the upstream membership (and of the wide tiling's,
    against `repack+sizing`'s incumbent) by the node-level memory bound, not by the parents'
    own bounds. The planner then skips mode ``repack``'s exact answer; the plan stays the one
    it gives when it computes that answer."""
    spec = TraceSpec(seed=202, steps=1, first_step=24, loader=PackedLoader())
    scenario = Scenario(job_id="c32", cluster=ClusterSpec(nodes=4), trace=spec)
    req = next(scenario.requests()).model_copy(update={"mode": mode})
    calls: list[int] = []
    fixed_best = planner._fixed_best

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return fixed_best(*args, **kwargs)

    monkeypatch.setattr(planner, "_fixed_best", counted)
    fast = plan(req, NO_CLOCK_MS)
    skipped = len(calls)
    monkeypatch.setattr(planner, "fixed_membership_bound", lambda *_: 0.0)
    full = plan(req, NO_CLOCK_MS)
    assert len(calls) - skipped >= 1 > skipped  # computed only without the bound
    assert fast.parents == full.parents and fast.children == full.children
    assert fast.metrics.step_time_ms == full.metrics.step_time_ms


def test_repack_answer_owed_only_where_the_searched_layout_does_not_beat_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Step 4 of the 60%-fill 64-GPU scenario: the re-balanced layout does not beat every
    layout of the upstream membership, but the LNS's layout from it does (its ``_Floor``). The
    searched path (``_searched_parent``) then never computes mode ``repack``'s answer, and
    ends at the layout the eager path (``_repack_parent``, then the LNS) ends at."""
    req = next(islice(load_trace(scenario_path("gpu64-200steps.yaml")), 4, None))
    problem = Problem.from_request(req)
    sizes, members = _baseline_parents(problem, req)
    calls: list[int] = []
    fixed_best = planner._fixed_best

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return fixed_best(*args, **kwargs)

    monkeypatch.setattr(planner, "_fixed_best", counted)
    eager = _repack_parent(problem, sizes, members, Budget(NO_CLOCK_MS))
    assert eager is not None and len(calls) == 1
    eager = planner._improved(problem, eager, Budget(NO_CLOCK_MS), "repack+parent")
    searched = planner._searched_parent(
        problem, sizes, members, Budget(NO_CLOCK_MS), "repack+parent"
    )
    assert searched is not None and len(calls) == 1  # not computed again
    assert searched.layout == eager.layout
    assert searched.evaluation.step_s == eager.evaluation.step_s


def test_the_faster_of_the_two_searches_is_kept_where_repack_answer_restarts_it() -> None:
    """Where mode ``repack``'s answer beats the re-balanced layout, the LNS runs again from it;
    the search from the re-balanced layout is kept where it ended faster (step 176 of
    ``gpu64-200steps.yaml``: 2,394.14 ms against 2,394.93 ms from the restart)."""
    request = next(islice(load_trace(scenario_path("gpu64-200steps.yaml")), 176, None))
    request = request.model_copy(update={"mode": "repack+parent"})
    ends: list[float] = []
    improved = planner._improved

    def recorded(*args: Any, **kwargs: Any) -> Any:
        out = improved(*args, **kwargs)
        ends.append(out.evaluation.step_s)
        return out

    with pytest.MonkeyPatch.context() as m:
        m.setattr(planner, "_improved", recorded)
        result = plan(request, deadline_ms=600_000)
    assert len(ends) == 2 and ends[0] < ends[1]  # the restart ended slower on this step
    assert result.metrics.step_time_ms == pytest.approx(min(ends) * 1e3, abs=1e-5)
