"""The latency cuts at scale keep plans: vectorised per-sample bounds equal their definition,
and every prune (bounds, early stops) only drops candidates that could not win."""

from __future__ import annotations

import math
from itertools import islice

import pytest

from solver.budget import Budget
from solver.children import children_below, membership_bounds, solve_children
from solver.cost_model import child_layer_seconds
from solver.planner import _baseline_parents, _repack_parent
from solver.problem import Problem
from solver.schema import PlanRequest
from solver.trace import load_trace
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
