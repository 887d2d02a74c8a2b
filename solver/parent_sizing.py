"""Uniform parent sizes when the request gives none.

Rule (documented in the README): memory needs ``P * max_tokens_per_rank >= longest sample``;
among the allowed power-of-two sizes from that minimum up to the whole cluster (dividing
``heads``, compatible with ``kv_heads``), the one whose token-balanced membership (the default
upstream membership) predicts the shortest baseline step time is taken; ties go to the smaller
size (less inter-node traffic). Very large requests rank the sizes with a closed-form estimate
instead (``EXACT_RANKING_WORK``).
"""

from __future__ import annotations

from solver.bounds import unrepacked_seconds
from solver.cost_model import unrepacked_parent_seconds
from solver.errors import InfeasibleRequestError
from solver.membership import balance
from solver.problem import Problem
from solver.schema import PlanRequest, allowed_parent_sizes

EXACT_RANKING_WORK = 60_000
"""Above this many (candidate size x sample) pairs, sizes are ranked by ``_estimate`` and only
the winner gets a membership: the exact ranking would outlast a large step's deadline."""


def derive_parent_sizes(
    problem: Problem, request: PlanRequest
) -> tuple[list[int], list[list[int]]]:
    """Sizes and their greedy (LPT) baseline membership, which ranks the sizes well enough;
    the planner improves the winner's membership afterwards."""
    world = problem.cost.world_size
    longest = max(problem.tokens)
    candidates = [
        p
        for p in allowed_parent_sizes(request.cluster, request.model)
        if problem.capacity(p) >= longest
    ]
    if len(candidates) * problem.num_samples > EXACT_RANKING_WORK:
        candidates = sorted(candidates, key=lambda p: (_estimate(problem, p), p))[:1]
    best: tuple[float, int, list[list[int]]] | None = None
    for size in candidates:
        sizes = [size] * (world // size)
        try:
            members = balance(problem, sizes, "tokens", evals=0)
        except InfeasibleRequestError:
            continue
        step = max(unrepacked_seconds(problem, size, group) for group in members)
        if best is None or step < best[0]:
            best = (step, size, members)
    if best is None:
        raise InfeasibleRequestError(
            "lengths", "no uniform parent size can hold these samples within max_tokens_per_rank"
        )
    return [best[1]] * (world // best[1]), best[2]


def _estimate(problem: Problem, size: int) -> float:
    """Baseline step time of ``size`` without building a membership: the larger of an average
    parent and the longest sample's parent (which holds at least that sample)."""
    parents = problem.cost.world_size // size
    longest = max(range(problem.num_samples), key=lambda s: (problem.tokens[s], -s))
    average = unrepacked_parent_seconds(
        problem.cost,
        size,
        sum(problem.full_s) / parents,
        sum(problem.sparse_s) / parents,
        -(-sum(problem.tokens) // parents),
    )
    return max(average, unrepacked_seconds(problem, size, [longest]))
