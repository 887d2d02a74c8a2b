"""Parent membership: which samples share a parent (a min-max balancing problem over parents).

Two objectives use the same machinery, a longest-processing-time greedy followed by a bounded,
deterministic local search (moves and swaps out of the critical parent):

* ``baseline``: the exact time of unrepacked parents (the service's default membership);
* ``repack``: a lower-bound estimate of the repacked parent time, which makes parents hold
  samples that their node-local children can balance (the parent solver's first stage).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from solver.cost_model import ceil_div, child_layer_seconds, full_layer_seconds
from solver.errors import InfeasibleRequestError
from solver.problem import Problem

Objective = Literal["baseline", "repack"]

LOCAL_SEARCH_EVALS = 40_000
"""Deterministic work limit of the local search, in candidate evaluations."""

IMPROVEMENT_EPS = 1e-12
"""Relative improvement below which a move is not taken (guards float noise cycles)."""


@dataclass
class ParentLoad:
    size: int
    capacity: int
    full_s: float = 0.0
    sparse_s: float = 0.0
    tokens: int = 0
    members: list[int] = field(default_factory=list)


CostFn = Callable[[int, float, float, int, Sequence[int]], float]


def single_sample_bound(problem: Problem, sample: int, size: int) -> float:
    """Least sparse-layer time of ``sample`` alone in a node-local child of a parent of ``size``;
    ``inf`` when no child can hold it (the parent must then stay unrepacked)."""
    cost = problem.cost
    length, sparse = problem.tokens[sample], problem.sparse_s[sample]
    best = math.inf
    for k in problem.child_sizes:
        if k <= size and length <= problem.capacity(k):
            best = min(best, child_layer_seconds(cost, k, sparse, length))
    return best


def make_cost_fn(problem: Problem, objective: Objective) -> CostFn:
    cost = problem.cost
    nf, ns = cost.full_layers, cost.sparse_layers
    lin = cost.linear_seconds_per_token
    single_cache: dict[tuple[int, int], float] = {}

    def baseline(size: int, full: float, sparse: float, tokens: int, _: Sequence[int]) -> float:
        n = ceil_div(tokens, size)
        per_token = lin + cost.a2a_seconds_per_token(size)
        return nf * full_layer_seconds(cost, size, full, n) + ns * (sparse / size + n * per_token)

    def single(sample: int, size: int) -> float:
        key = (sample, size)
        if key not in single_cache:
            single_cache[key] = single_sample_bound(problem, sample, size)
        return single_cache[key]

    def repack(size: int, full: float, sparse: float, tokens: int, members: Sequence[int]) -> float:
        longest = max((single(s, size) for s in members), default=0.0)
        if math.isinf(longest):
            return baseline(size, full, sparse, tokens, members)
        n = ceil_div(tokens, size)
        sparse_bound = max((sparse + tokens * lin) / size, longest)
        return nf * full_layer_seconds(cost, size, full, n) + ns * sparse_bound

    return baseline if objective == "baseline" else repack


class _Balancer:
    def __init__(self, problem: Problem, sizes: Sequence[int], cost_fn: CostFn) -> None:
        self.p = problem
        self.loads = [ParentLoad(size=s, capacity=problem.capacity(s)) for s in sizes]
        self.cost_fn = cost_fn
        self.evals = 0

    def cost(self, j: int, add: int | None = None, remove: int | None = None) -> float:
        """Cost of parent j with one sample added and/or removed (without changing it)."""
        self.evals += 1
        ld, p = self.loads[j], self.p
        full, sparse, tokens = ld.full_s, ld.sparse_s, ld.tokens
        members: list[int] = ld.members
        if add is not None or remove is not None:
            members = [m for m in members if m != remove]
            if add is not None:
                members.append(add)
                full, sparse, tokens = (
                    full + p.full_s[add],
                    sparse + p.sparse_s[add],
                    tokens + p.tokens[add],
                )
            if remove is not None:
                full, sparse, tokens = (
                    full - p.full_s[remove],
                    sparse - p.sparse_s[remove],
                    tokens - p.tokens[remove],
                )
        return self.cost_fn(ld.size, full, sparse, tokens, members)

    def fits(self, j: int, add: int, remove: int | None = None) -> bool:
        ld = self.loads[j]
        out = self.p.tokens[remove] if remove is not None else 0
        return ld.tokens + self.p.tokens[add] - out <= ld.capacity

    def place(self, j: int, s: int) -> None:
        ld, p = self.loads[j], self.p
        ld.members.append(s)
        ld.full_s += p.full_s[s]
        ld.sparse_s += p.sparse_s[s]
        ld.tokens += p.tokens[s]

    def unplace(self, j: int, s: int) -> None:
        ld, p = self.loads[j], self.p
        ld.members.remove(s)
        ld.full_s -= p.full_s[s]
        ld.sparse_s -= p.sparse_s[s]
        ld.tokens -= p.tokens[s]

    def greedy(self, order: Sequence[int]) -> None:
        for s in order:
            best_j, best_c = -1, math.inf
            for j in range(len(self.loads)):
                if self.fits(j, s):
                    c = self.cost(j, add=s)
                    if c < best_c:
                        best_j, best_c = j, c
            if best_j < 0:
                raise InfeasibleRequestError(
                    "lengths",
                    f"sample {s} ({self.p.tokens[s]} tokens) fits in no parent's remaining memory; "
                    "give wider parents or fewer tokens",
                )
            self.place(best_j, s)

    def improve(self, budget: int) -> None:
        while self.evals < budget:
            costs = [self.cost(j) for j in range(len(self.loads))]
            c = max(range(len(costs)), key=lambda j: (costs[j], -j))
            if not self._improve_critical(c, costs, budget):
                return

    def _improve_critical(self, c: int, costs: list[float], budget: int) -> bool:
        target = costs[c] * (1 - IMPROVEMENT_EPS)
        others = sorted((j for j in range(len(self.loads)) if j != c), key=lambda j: costs[j])
        heavy_first = sorted(self.loads[c].members, key=lambda s: -self.p.work_s[s])
        for s in heavy_first:  # moves
            for q in others:
                if costs[q] >= target or not self.fits(q, s):
                    continue
                if max(self.cost(c, remove=s), self.cost(q, add=s)) < target:
                    self.unplace(c, s)
                    self.place(q, s)
                    return True
        for s in heavy_first:  # swaps with a lighter sample
            for q in others:
                if costs[q] >= target:
                    continue
                for u in self.loads[q].members:
                    if self.evals >= budget:
                        return False
                    if self.p.work_s[u] >= self.p.work_s[s] or not self.fits(q, s, remove=u):
                        continue
                    if not self.fits(c, u, remove=s):
                        continue
                    if max(self.cost(c, add=u, remove=s), self.cost(q, add=s, remove=u)) < target:
                        self.unplace(c, s)
                        self.unplace(q, u)
                        self.place(c, u)
                        self.place(q, s)
                        return True
        return False


def heavy_order(problem: Problem) -> list[int]:
    """Samples by decreasing full-attention then total work; index breaks ties (determinism)."""
    return sorted(
        range(problem.num_samples),
        key=lambda s: (-problem.full_s[s], -problem.work_s[s], s),
    )


def balance(
    problem: Problem,
    sizes: Sequence[int],
    objective: Objective,
    start: Sequence[int] | None = None,
    budget: int = LOCAL_SEARCH_EVALS,
) -> list[list[int]]:
    """Members of each parent (in index order), from ``start`` (``parent_of``) or from scratch."""
    bal = _Balancer(problem, sizes, make_cost_fn(problem, objective))
    if start is None:
        bal.greedy(heavy_order(problem))
    else:
        for s, j in enumerate(start):
            bal.place(j, s)
    bal.improve(bal.evals + budget)
    return [sorted(ld.members) for ld in bal.loads]


def members_from_parent_of(parent_of: Sequence[int], num_parents: int) -> list[list[int]]:
    groups: list[list[int]] = [[] for _ in range(num_parents)]
    for s, j in enumerate(parent_of):
        groups[j].append(s)
    return groups
