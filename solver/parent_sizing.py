"""Uniform parent sizes when the request gives none.

Rule (documented in the README): memory needs ``P * max_tokens_per_rank >= longest sample``;
among the allowed power-of-two sizes from that minimum up to the whole cluster (dividing
``heads``, compatible with ``kv_heads``), the one whose token-balanced membership (the default
upstream membership) predicts the shortest baseline step time is taken; ties go to the smaller
size (less inter-node traffic).
"""

from __future__ import annotations

from solver.errors import InfeasibleRequestError
from solver.layout import baseline_layout, evaluate
from solver.membership import balance
from solver.problem import Problem
from solver.schema import PlanRequest, allowed_parent_sizes


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
    best: tuple[float, int, list[list[int]]] | None = None
    for size in candidates:
        sizes = [size] * (world // size)
        try:
            members = balance(problem, sizes, "tokens", budget=0)
        except InfeasibleRequestError:
            continue
        step = evaluate(baseline_layout(sizes, members), problem.cost, problem.costs).step_s
        if best is None or step < best[0]:
            best = (step, size, members)
    if best is None:
        raise InfeasibleRequestError(
            "lengths", "no uniform parent size can hold these samples within max_tokens_per_rank"
        )
    return [best[1]] * (world // best[1]), best[2]
