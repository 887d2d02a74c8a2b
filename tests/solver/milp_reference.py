"""An independent MILP (PuLP + CBC) of one parent's child layout, to cross-check CP-SAT.

Different formulation on purpose: each node picks one *partition pattern* (a multiset of child
sizes summing to at most the node's ranks, e.g. 4+2+1+1) instead of CP-SAT's per-slot usage
booleans, and coefficients stay real numbers instead of rounded integers.
"""

from __future__ import annotations

from collections.abc import Sequence

import pulp

from solver.problem import Problem


def partitions(total: int, sizes: Sequence[int]) -> list[tuple[int, ...]]:
    """Multisets of ``sizes`` (largest first) with sum <= total, excluding the empty one."""
    out: list[tuple[int, ...]] = []

    def extend(prefix: tuple[int, ...], room: int, largest: int) -> None:
        if prefix:
            out.append(prefix)
        for k in sorted(sizes, reverse=True):
            if k <= largest and k <= room:
                extend((*prefix, k), room - k, k)

    extend((), total, max(sizes))
    return out


def milp_child_objective(problem: Problem, size: int, members: Sequence[int]) -> float:
    """Optimal relaxed parent time (seconds) of ``members`` repacked in a parent of ``size``:
    full-layer constant + full layers x busiest-rank tokens x per-token cost + sparse layers x
    slowest child, with child time = sum over its samples of (sparse + L * per-token) / k."""
    cost = problem.cost
    g = min(size, cost.gpus_per_node)
    sizes = [k for k in problem.child_sizes if k <= g]
    patterns = partitions(g, sizes)
    lin = cost.linear_seconds_per_token
    prob = pulp.LpProblem("children", pulp.LpMinimize)
    pick = {
        (n, t): pulp.LpVariable(f"pick_{n}_{t}", cat="Binary")
        for n in range(size // g)
        for t in range(len(patterns))
    }
    assign = {}
    for n, t in pick:
        for q, k in enumerate(patterns[t]):
            for i in members:
                if problem.tokens[i] <= k * cost.max_tokens_per_rank:
                    assign[i, n, t, q] = pulp.LpVariable(f"a_{i}_{n}_{t}_{q}", cat="Binary")
    busiest = pulp.LpVariable(
        "busiest", lowBound=0, upBound=cost.max_tokens_per_rank, cat="Integer"
    )
    slowest = pulp.LpVariable("slowest", lowBound=0)
    for n in range(size // g):
        prob += pulp.lpSum(pick[n, t] for t in range(len(patterns))) <= 1
    for i in members:
        prob += pulp.lpSum(v for key, v in assign.items() if key[0] == i) == 1
    for n, t in pick:
        for q, k in enumerate(patterns[t]):
            here = [(i, v) for (i, nn, tt, qq), v in assign.items() if (nn, tt, qq) == (n, t, q)]
            for _, v in here:
                prob += v <= pick[n, t]
            tokens = pulp.lpSum(problem.tokens[i] * v for i, v in here)
            prob += tokens <= k * busiest
            per_token = lin + cost.a2a_seconds_per_token(k)
            prob += (
                pulp.lpSum(
                    (problem.sparse_s[i] + problem.tokens[i] * per_token) / k * v for i, v in here
                )
                <= slowest
            )
    full_token = cost.full_layers * (lin + cost.a2a_seconds_per_token(size))
    prob += full_token * busiest + cost.sparse_layers * slowest
    status = prob.solve(pulp.PULP_CBC_CMD(msg=False, timeLimit=60))
    if pulp.LpStatus[status] != "Optimal" or prob.sol_status != pulp.LpSolutionOptimal:
        raise RuntimeError(f"CBC did not prove optimality: {pulp.LpStatus[status]}")
    full_const = cost.full_layers * sum(problem.full_s[i] for i in members) / size
    return full_const + float(pulp.value(prob.objective))
