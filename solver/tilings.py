"""Simple parent tilings the sizing modes also try: uniform sizes and "one wide + rest narrow".

The parent packer (``parent_packer``) bisects on a target step time and opens parents as samples
need them. When a loader packed every rank to ~100% of its token budget, that greedy runs out of
room at the tight targets and settles on a slow layout, while a plain uniform tiling with a
membership balanced by exact time (what a careful loader could do itself) is much faster. These
tilings are that simple alternative, so the sizing modes are never beaten by it:

* every allowed uniform size at least the size the longest sample needs (memory), and
* the longest sample's minimal parent first, the rest of the cluster at one narrower uniform size
  (aligned: every size is a power of two dividing the wider one, as the buddy allocator hands
  them out).

Each tiling gets membership balanced by exact unrepacked time (LPT + local search; where LPT
runs out of packed memory, the node-level LPT with every parent whole, which fits where LPT does
not); tilings whose cheap lower bound (mean rank-seconds, the longest sample alone in the first
parent) cannot beat the incumbent are skipped before any balancing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

from solver.bounds import aggregate_bound, unrepacked_seconds
from solver.buddy import Buddy
from solver.budget import Budget
from solver.errors import InfeasibleRequestError
from solver.layout import Layout, LayoutEval, baseline_layout, evaluate
from solver.membership import balance
from solver.node_membership import node_seed
from solver.problem import Problem

TILING_EVALS = 500
"""Local-search evaluations per tiling (full budget): LPT by exact time is already close."""
MAX_TILINGS = 6
"""Tilings tried per request, widest-needed first: keeps the stage's work bounded."""


@dataclass(frozen=True)
class Tiled:
    sizes: list[int]
    members: list[list[int]]
    layout: Layout
    evaluation: LayoutEval


def _aligned(world: int, sizes: Sequence[int]) -> bool:
    """Whether ``sizes`` in rank order are handed out by a buddy allocator at those starts."""
    buddy = Buddy(0, world)
    at = 0
    for size in sizes:
        start = buddy.take(size)
        if start != at:
            return False
        at += size
    return at == world


def candidate_tilings(problem: Problem, allowed: Sequence[int], world: int) -> list[list[int]]:
    """Uniform tilings from the longest sample's minimal size up, then that size + each
    narrower uniform size (widest narrow size first), at most ``MAX_TILINGS``."""
    longest = max(problem.tokens)
    fitting = [p for p in allowed if longest <= problem.capacity(p)]
    if not fitting:
        return []
    need = min(fitting)
    out = [[p] * (world // p) for p in sorted(fitting) if world % p == 0]
    for q in sorted((p for p in allowed if p < need), reverse=True):
        if (world - need) % q == 0:
            out.append([need] + [q] * ((world - need) // q))
    return [t for t in out if _aligned(world, t)][:MAX_TILINGS]


def _memberships(problem: Problem, sizes: list[int], budget: Budget) -> list[list[list[int]]]:
    with contextlib.suppress(InfeasibleRequestError):  # LPT may not fit packed memory
        return [balance(problem, sizes, "baseline", evals=TILING_EVALS, clock=budget)]
    seeded = None if budget.expired() else node_seed(problem, sizes, budget, repack=False)
    return [] if seeded is None else [seeded[0]]


def _floor(problem: Problem, sizes: list[int]) -> float:
    """True bound of any membership of ``sizes`` without repacking: the mean rank-seconds, and
    the longest sample alone in the first parent (the only one of the tiling that holds it
    where the rest are narrower)."""
    longest = max(range(problem.num_samples), key=lambda s: (problem.tokens[s], -s))
    return max(aggregate_bound(problem, sizes), unrepacked_seconds(problem, sizes[0], [longest]))


def best_tilings(
    problem: Problem, allowed: Sequence[int], world: int, incumbent_s: float, budget: Budget
) -> list[Tiled]:
    """The candidate tilings that beat ``incumbent_s`` unrepacked, fastest first (one
    membership per tiling: the faster of the two)."""
    found: list[Tiled] = []
    for sizes in candidate_tilings(problem, allowed, world):
        if budget.expired():
            break
        if _floor(problem, sizes) >= incumbent_s:
            continue
        best: Tiled | None = None
        for members in _memberships(problem, sizes, budget):
            layout = baseline_layout(sizes, members)
            evaluation = evaluate(layout, problem.cost, problem.costs)
            if best is None or evaluation.step_s < best.evaluation.step_s:
                best = Tiled(sizes, members, layout, evaluation)
        if best is not None and best.evaluation.step_s < incumbent_s:
            found.append(best)
    return sorted(found, key=lambda t: t.evaluation.step_s)
