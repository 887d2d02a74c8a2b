"""Simple parent tilings the sizing modes also try: uniform sizes and "one wide + rest narrow".

The parent packer (``parent_packer``) bisects on a target step time and opens parents as samples
need them. When a loader packed every rank to ~100% of its token budget, that greedy runs out of
room at the tight targets and settles on a slow layout, while a plain uniform tiling with a
membership balanced by exact time (what a careful loader could do itself) is much faster. These
tilings are that simple alternative, so the sizing modes are never beaten by it:

* every allowed uniform size at least the size the longest sample needs (memory), and
* the longest sample's minimal parent first, the rest of the cluster at one narrower uniform size
  (aligned: every parent starts at a multiple of its size, as the buddy allocator of
  ``buddy.py`` hands them out), and
* on clusters whose ranks are not a power of two, a parent wider than that minimum and than
  half the cluster (``WIDE_TILINGS``: no uniform tiling has it) first, the rest narrower.

Each tiling gets membership balanced by exact unrepacked time (LPT + local search; where LPT
runs out of packed memory, the node-level LPT with every parent whole, which fits where LPT does
not); tilings whose cheap lower bound (mean rank-seconds, the longest sample alone in the first
parent) cannot beat the incumbent are skipped before any balancing.
"""

from __future__ import annotations

import contextlib
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

from solver.bounds import sparse_a2a_floor, unrepacked_seconds
from solver.budget import Budget
from solver.errors import InfeasibleRequestError
from solver.layout import Layout, LayoutEval, baseline_layout, evaluate
from solver.membership import balance, fill_prices
from solver.node_membership import TIGHT_FILL, node_seed
from solver.problem import Problem

TILING_EVALS = 500
"""Local-search evaluations per tiling (full budget): LPT by exact time is already close."""
TIGHT_TILING_EVALS = 5_000
"""Local-search evaluations of the fill-priced membership of a memory-tight step, whose moves
are swaps of near-equal lengths (no parent has room): 500 left it far from its relaxation."""
MAX_TILINGS = 6
"""Tilings tried per request, widest-needed first: keeps the stage's work bounded."""
WIDE_TILINGS = 2
"""Tilings with one parent wider than the longest sample needs and than half the cluster, so
that no uniform layout has it (the cluster's ranks are not a power of two: 96 = 64 + 32),
beyond ``MAX_TILINGS``. Spreading a very long sample's quadratic attention over twice the ranks can
halve its parent's time despite the wider all-to-all: 96 GPUs of 8-GPU nodes, a 471,859-token
sample (16 ranks hold it): `sizing` and `repack+sizing` kept [32, 32, 32] at 23,648 ms while
[64, 32] takes 19,860 ms unrepacked and 18,868 ms repacked."""


@dataclass(frozen=True)
class Tiled:
    sizes: list[int]
    members: list[list[int]]
    layout: Layout
    evaluation: LayoutEval


def _aligned(world: int, sizes: Sequence[int]) -> bool:
    """Whether ``sizes`` in rank order tile ``[0, world)`` with every parent starting at a
    multiple of its size (the layout rule for parents; what a buddy allocator hands out)."""
    at = 0
    for size in sizes:
        if at % size:
            return False
        at += size
    return at == world


def candidate_tilings(
    problem: Problem, allowed: Sequence[int], world: int, wide: bool = True
) -> list[list[int]]:
    """Uniform tilings from the longest sample's minimal size up, then that size + each
    narrower uniform size (widest narrow size first), at most ``MAX_TILINGS``; then, with
    ``wide``, the ``wide_tilings``."""
    longest = max(problem.tokens)
    fitting = [p for p in allowed if longest <= problem.capacity(p)]
    if not fitting:
        return []
    need = min(fitting)
    out = [[p] * (world // p) for p in sorted(fitting) if world % p == 0]
    for q in sorted((p for p in allowed if p < need), reverse=True):
        if (world - need) % q == 0:
            out.append([need] + [q] * ((world - need) // q))
    simple = [t for t in out if _aligned(world, t)][:MAX_TILINGS]
    return simple + wide_tilings(problem, allowed, world) if wide else simple


def wide_tilings(problem: Problem, allowed: Sequence[int], world: int) -> list[list[int]]:
    """At most ``WIDE_TILINGS`` tilings whose first parent, wider than the longest sample
    needs, is wider than half the cluster, so that no uniform tiling has it (96 ranks: 64 +
    32), the rest at one narrower size (widest first)."""
    longest = max(problem.tokens)
    fitting = sorted(p for p in allowed if longest <= problem.capacity(p))
    if not fitting:
        return []
    out = [
        [p] + [q] * ((world - p) // q)
        for p in fitting
        if fitting[0] < p < world < 2 * p
        for q in sorted((q for q in allowed if q < p), reverse=True)
        if (world - p) % q == 0
    ]
    return [t for t in out if _aligned(world, t)][:WIDE_TILINGS]


def tiling_memberships(problem: Problem, sizes: list[int], budget: Budget) -> list[list[list[int]]]:
    """Exact-time LPT + local search; where it runs out of packed memory, the parents filled to
    the token (``exact_fill``) + local search and the node-level LPT (every parent whole), the
    latter only for tilings of at most one parent per node: with many narrow parents it costs
    ~10x the LPT (measured 72 ms at 64 GPUs for [8] + [1] * 56) for a tiling whose narrow
    parents are what made memory run out. On memory-tight steps also the fill-priced LPT
    (``membership.fill_prices``) + a longer local search, first: neither LPT wins everywhere
    (on 30 packed 16-rank-parent steps mode ``sizing`` went -24.71% -> -25.38% vs baseline,
    median gap 3.37% -> 2.42%)."""
    out = []
    if problem.fill >= TIGHT_FILL:  # every parent ends full: LPT by cost as if already full
        with contextlib.suppress(InfeasibleRequestError):
            prices = fill_prices(problem, sizes)
            out.append(
                balance(
                    problem,
                    sizes,
                    "baseline",
                    evals=TIGHT_TILING_EVALS,
                    clock=budget,
                    fill=False,
                    fill_price=prices,
                )
            )
    with contextlib.suppress(InfeasibleRequestError):  # LPT may not fit packed memory
        return [
            *out,
            balance(problem, sizes, "baseline", evals=TILING_EVALS, clock=budget, fill=False),
        ]
    with contextlib.suppress(InfeasibleRequestError):  # no fill to the token found either
        out.append(
            balance(problem, sizes, "baseline", evals=TILING_EVALS, clock=budget, exhaustive=False)
        )
    if len(sizes) > problem.cost.world_size // problem.cost.gpus_per_node or budget.expired():
        return out
    seeded = node_seed(problem, sizes, budget, repack=False)
    return out if seeded is None else [*out, seeded[0]]


def fast_aggregate_bound(problem: Problem, sizes: Sequence[int]) -> float:
    """``bounds.aggregate_bound`` computed once per length class instead of per sample: a
    sample's sparse all-to-all floor depends on its length only through which capacities
    (children, parents, a node) it exceeds, so samples between two consecutive capacities
    share it. At 1,024 GPUs and 6,000 samples this is ~100x cheaper, for the same number."""
    cost = problem.cost
    menu = sorted(set(sizes))
    a2a = {size: cost.a2a_seconds_per_token(size) for size in menu}
    cheapest = min(a2a.values())
    caps = sorted({problem.capacity(k) for k in (*problem.child_sizes, *menu, cost.gpus_per_node)})
    classes: dict[int, tuple[int, int]] = {}  # class -> (a member's length, tokens)
    for length in problem.tokens:
        key = bisect_left(caps, length)
        rep, total = classes.get(key, (length, 0))
        classes[key] = (rep, total + length)
    forced = sum(total * sparse_a2a_floor(problem, rep, menu) for rep, total in classes.values())
    total_tokens = sum(problem.tokens)
    rank_seconds = cost.full_layers * (
        sum(problem.full_s) + total_tokens * (cost.linear_seconds_per_token + cheapest)
    ) + cost.sparse_layers * (sum(problem.work_s) + forced)
    return rank_seconds / cost.world_size


def _floor(problem: Problem, sizes: list[int]) -> float:
    """True bound of any membership of ``sizes`` without repacking: the mean rank-seconds, and
    the longest sample alone in the first parent (the only one of the tiling that holds it
    where the rest are narrower)."""
    longest = max(range(problem.num_samples), key=lambda s: (problem.tokens[s], -s))
    alone = unrepacked_seconds(problem, sizes[0], [longest])
    return max(fast_aggregate_bound(problem, sizes), alone)


def best_tilings(
    problem: Problem,
    allowed: Sequence[int],
    world: int,
    incumbent_s: float,
    budget: Budget,
    keep: int = 1,
    skip: Sequence[int] = (),
) -> list[Tiled]:
    """The ``keep`` fastest candidate tilings that beat ``incumbent_s`` unrepacked, fastest
    first (one membership per tiling: the faster of the two). Tilings are balanced in order of
    their floor; once a floor reaches the incumbent or the ``keep``-th tiling found, no later
    tiling can enter the answer, so the rest is skipped. ``skip``: sizes the caller already
    balances (the upstream sizes)."""
    found: list[Tiled] = []
    if budget.expired():
        return found
    tilings = [t for t in candidate_tilings(problem, allowed, world) if t != list(skip)]
    floors = [_floor(problem, sizes) for sizes in tilings]
    for floor, sizes in sorted(zip(floors, tilings, strict=True), key=lambda t: t[0]):
        limit = found[keep - 1].evaluation.step_s if len(found) >= keep else incumbent_s
        if floor >= limit or budget.expired():
            break
        best: Tiled | None = None
        for members in tiling_memberships(problem, sizes, budget):
            layout = baseline_layout(sizes, members)
            evaluation = evaluate(layout, problem.cost, problem.costs)
            if best is None or evaluation.step_s < best.evaluation.step_s:
                best = Tiled(sizes, members, layout, evaluation)
        if best is not None and best.evaluation.step_s < limit:
            found = sorted([*found, best], key=lambda t: t.evaluation.step_s)[:keep]
    return found
