"""Children of every parent for a fixed membership: greedy packing, then CP-SAT on the
critical parent.

Parents are independent subproblems given the membership (the step waits for the slowest), so
the work goes where the step time is decided: the parent with the largest bound is packed with
the full search, the others with a single pack aimed at the running step time, and CP-SAT then
polishes whichever parent is critical until it is proven, stops improving, or time runs out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from solver.bounds import parent_bound, unrepacked_seconds
from solver.budget import Budget
from solver.child_cpsat import DETERMINISTIC_SECONDS, ChildModel, slot_count
from solver.child_packer import ChildPacker
from solver.critical import first_max
from solver.layout import (
    Layout,
    LayoutEval,
    Parent,
    evaluate,
    parent_starts,
    parent_time,
    unrepacked,
)
from solver.problem import Problem

MAX_MODEL_ASSIGNMENTS = 2_500
"""CP-SAT is skipped for a parent with more sample-to-slot pairs than this: building the model
in Python alone would cost more than the latency budget of a 64-GPU step."""

POLISH_ROUNDS = 1
"""At most this many CP-SAT solves per request."""

MIN_POLISH_SECONDS = 0.01
"""CP-SAT polish is skipped when the request's share of ``DETERMINISTIC_SECONDS`` is below
this (a requested deadline under two thirds of the default): measured on 64-GPU bench steps,
the solves changed step times by 0.000-0.008% at 50 and 200 ms deadlines in every repacking
mode while costing 4-20 ms of CPU per request (model build and solve), which the child swaps
and the node stage's moves turn into step time instead (``Budget.move_evals``). At the full
budget it is worth 0.06% in mode ``repack`` and keeps the critical parent's proven bound."""

POLISH_MIN_GAP = 0.005
"""CP-SAT runs only on a critical parent whose time is this far (relative) above its bound:
closer than that, the solve costs more latency than it can win."""


@dataclass(frozen=True)
class ChildrenSolution:
    layout: Layout
    evaluation: LayoutEval
    parent_bounds: tuple[float, ...]
    """True lower bound of each parent's time for this membership."""


def membership_bounds(
    problem: Problem, sizes: Sequence[int], members: Sequence[Sequence[int]]
) -> tuple[float, ...]:
    """True lower bound of each parent's time for this membership, whatever its children: the
    largest is a floor under every layout of the membership, so a planner holding a layout at
    least that fast can skip its child search."""
    return tuple(
        parent_bound(problem, n, m, repack=True) for n, m in zip(sizes, members, strict=True)
    )


def solve_children(
    problem: Problem,
    sizes: Sequence[int],
    members: Sequence[Sequence[int]],
    budget: Budget,
    bounds: Sequence[float] | None = None,
) -> ChildrenSolution:
    """Greedy children for every parent, the one with the largest bound searched hardest.
    ``bounds``: the membership's ``membership_bounds`` if the caller has them already."""
    solution = children_below(problem, sizes, members, budget, math.inf, bounds)
    assert solution is not None  # nothing is slower than no limit
    return solution


def children_below(
    problem: Problem,
    sizes: Sequence[int],
    members: Sequence[Sequence[int]],
    budget: Budget,
    limit_s: float,
    bounds: Sequence[float] | None = None,
) -> ChildrenSolution | None:
    """``solve_children``, given up (None) as soon as one parent's greedy time exceeds
    ``limit_s``: a candidate only worth having if it beats a layout of that time stops costing
    child searches once it cannot."""
    starts = parent_starts(sizes)
    if budget.expired():  # out of time: every parent stays unrepacked (valid, no search)
        layout = tuple(
            unrepacked(start, size, group)
            for start, size, group in zip(starts, sizes, members, strict=True)
        )
        evaluation = evaluate(layout, problem.cost, problem.costs)
        if evaluation.step_s > limit_s:
            return None
        known = tuple(bounds) if bounds is not None else (0.0,) * len(sizes)
        return ChildrenSolution(layout, evaluation, known)  # 0 is a true bound too
    if bounds is None:
        bounds = membership_bounds(problem, sizes, members)
    order = sorted(range(len(sizes)), key=lambda j: (-bounds[j], j))
    parents: list[Parent | None] = [None] * len(sizes)
    step = 0.0
    for j in order:
        if budget.expired():  # out of time: the baseline layout is valid and free
            parents[j] = unrepacked(starts[j], sizes[j], members[j])
            continue
        packer = ChildPacker(problem, starts[j], sizes[j], members[j])
        solution = packer.solve(target=step if step > bounds[j] else None)
        parents[j] = solution.parent
        step = max(step, solution.seconds)
        if step > limit_s:
            return None
    layout = tuple(p for p in parents if p is not None)
    return ChildrenSolution(layout, evaluate(layout, problem.cost, problem.costs), tuple(bounds))


def polish(problem: Problem, solution: ChildrenSolution, budget: Budget) -> ChildrenSolution:
    """CP-SAT on the critical parent: a better layout, a tighter bound, or both; repeated on
    the next critical parent while the previous one was settled."""
    parents, bounds = list(solution.layout), list(solution.parent_bounds)
    times = list(solution.evaluation.parent_s)
    solved = False
    for _ in range(POLISH_ROUNDS):
        c = first_max(times)
        settled = bounds[c] >= times[c] * (1 - POLISH_MIN_GAP)
        short = budget.cpsat_seconds(DETERMINISTIC_SECONDS) < MIN_POLISH_SECONDS
        if settled or short or not budget.use_cpsat or budget.expired():
            break
        p = parents[c]
        if not p.samples:  # only its collectives' fixed cost: no layout of it is faster
            break
        if len(p.samples) * slot_count(problem, p.size) > MAX_MODEL_ASSIGNMENTS:
            break
        model = ChildModel(problem, p.start, p.size, p.samples, incumbent_s=times[c])
        if p.repacked:
            model.hint(p)
        result = model.solve(budget.remaining_s(), budget.cpsat_seconds(DETERMINISTIC_SECONDS))
        solved = True
        if result.stopped_by_time:
            budget.fired = True
        unrepacked = unrepacked_seconds(problem, p.size, p.samples)
        bounds[c] = max(bounds[c], min(unrepacked, result.lower_bound_s))
        if result.parent is not None:
            t = parent_time(result.parent, problem.cost, problem.costs)
            if t < times[c]:
                parents[c], times[c] = result.parent, t
        if bounds[c] < times[c] * (1 - POLISH_MIN_GAP):
            break  # the critical parent stays open: another parent cannot change the step
    if not solved:
        return solution  # nothing to solve (settled, short budget, out of time): as it was
    layout = tuple(parents)
    return ChildrenSolution(layout, evaluate(layout, problem.cost, problem.costs), tuple(bounds))
