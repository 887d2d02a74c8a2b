"""Memberships that fit memory, found by search when the greedy packings all fail.

LPT, the subset-sum fill of ``exact_fill`` and first fit decreasing pack nearly every step a
loader emits. What they miss are steps full to the token whose few samples admit only exact
partitions (3 ranks of 29,000 tokens holding samples of 21, 17, 13, 11, 8, 6, 6 and 5
thousand: {21, 8}, {17, 6, 6}, {13, 11, 5}; every greedy order strands a sample). Refusing such a
step tells the caller to shrink a batch that fits, so this last resort asks CP-SAT: samples
into bins of fixed memory, nothing else. One worker and a deterministic limit keep the answer
the same in every process; the model is only built for small requests (``MAX_PAIRS``), where
the greedy packings fail in the first place.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ortools.sat.python import cp_model

from solver.budget import Budget
from solver.cpsat_model import LeanCpModel
from solver.problem import Problem

MAX_PAIRS = 20_000
"""Largest model, in sample x bin booleans (a few hundred samples onto tens of parents)."""
WORK_LIMIT_S = 0.2
"""CP-SAT's deterministic limit: exact partitions of tens of samples settle in milliseconds."""


@dataclass(frozen=True)
class PackingSearch:
    members: list[list[int]] | None
    """One packing within memory, bins in the order given; None if none was found."""
    proven_infeasible: bool
    """No packing exists (CP-SAT proved it)."""


def search_packing(
    problem: Problem,
    members: Sequence[int],
    capacities: Sequence[int],
    clock: Budget | None = None,
) -> PackingSearch:
    """``members`` into bins of ``capacities`` tokens, by CP-SAT; the search is skipped (no
    packing, nothing proven) above ``MAX_PAIRS``. ``clock``: the request's wall-clock safety
    net, marked as fired if it stops the search."""
    tokens = problem.tokens
    if len(members) * len(capacities) > MAX_PAIRS:
        return PackingSearch(None, False)
    if sum(tokens[s] for s in members) > sum(capacities):
        return PackingSearch(None, True)
    model = LeanCpModel()
    x: dict[tuple[int, int], cp_model.IntVar] = {}
    for s in members:
        row = []
        for b, cap in enumerate(capacities):
            if tokens[s] <= cap:
                x[s, b] = model.new_bool_var("")
                row.append(x[s, b])
        if not row:
            return PackingSearch(None, True)
        model.add_exactly_one(row)
    for b, cap in enumerate(capacities):
        used = [(x[s, b], tokens[s]) for s in members if (s, b) in x]
        model.add(sum(v * n for v, n in used) <= cap)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    solver.parameters.max_deterministic_time = WORK_LIMIT_S
    if clock is not None:
        solver.parameters.max_time_in_seconds = max(clock.remaining_s(), 1e-3)
    status = solver.solve(model)
    if clock is not None and status == cp_model.UNKNOWN:
        clock.fired = clock.fired or solver.deterministic_time < WORK_LIMIT_S * 0.99
    if status == cp_model.INFEASIBLE:
        return PackingSearch(None, True)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return PackingSearch(None, False)
    out = [
        [s for s in members if (s, b) in x and solver.value(x[s, b])]
        for b in range(len(capacities))
    ]
    return PackingSearch(out, False)
