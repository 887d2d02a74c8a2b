"""The membership local search prices only what can decide a candidate, and charges the rest.

``_Balancer._improve_critical`` skips the second side of a candidate whose first side misses
the target but charges it as an evaluation: its moves, its swaps and its evaluation count must
be those of the plain search that prices every side (written out below as the reference)."""

from __future__ import annotations

import bisect
import random

import pytest

from solver.membership import (
    IMPROVEMENT_EPS,
    RECEIVERS,
    SWAP_CANDIDATES,
    _Balancer,
    heavy_order,
)
from solver.problem import Problem
from solver.schema import PlanRequest


class _PlainBalancer(_Balancer):
    """Every candidate priced on both sides, samples ordered by tuple keys."""

    def _improve_critical(self, c: int, costs: list[float], budget: int) -> tuple[int, int] | None:
        target = costs[c] * (1 - IMPROVEMENT_EPS)
        receivers = sorted(
            (j for j in range(len(self.loads)) if j != c), key=lambda j: (costs[j], j)
        )
        receivers = receivers[:RECEIVERS]
        work = self.p.work_s
        heavy_first = sorted(self.loads[c].members, key=lambda s: (-work[s], s))
        for s in heavy_first:
            for q in receivers:
                if self.fits(q, s) and max(self.cost(c, remove=s), self.cost(q, add=s)) < target:
                    self.unplace(c, s)
                    self.place(q, s)
                    return c, q
        for q in receivers:
            light = sorted(self.loads[q].members, key=lambda u: (work[u], u))
            light_work = [work[u] for u in light]
            for s in heavy_first:
                if self.evals >= budget:
                    return None
                hi = bisect.bisect_left(light_work, work[s])
                for u in reversed(light[max(0, hi - SWAP_CANDIDATES) : hi]):
                    if not (self.fits(q, s, remove=u) and self.fits(c, u, remove=s)):
                        continue
                    a, b = self.cost(c, add=u, remove=s), self.cost(q, add=s, remove=u)
                    if max(a, b) < target:
                        self.unplace(c, s)
                        self.unplace(q, u)
                        self.place(c, u)
                        self.place(q, s)
                        return c, q
        return None


def searched(cls: type[_Balancer], problem: Problem, sizes: list[int], budget: int) -> _Balancer:
    bal = cls(problem, sizes, "repack")
    bal.greedy(heavy_order(problem))
    bal.improve(budget)
    return bal


@pytest.mark.parametrize("seed", range(12))
def test_search_moves_and_charges_as_if_every_side_were_priced(seed: int) -> None:
    rng = random.Random(seed)
    nodes = rng.choice([2, 4, 8])
    cap = nodes * 8 * 32768
    fill = rng.choice([0.5, 0.9, 0.99])
    lengths = [rng.choice([1800, 4096])] * rng.randint(0, 20)  # ties in work
    while sum(lengths) < fill * cap:
        lengths.append(min(int(rng.lognormvariate(7.4, 1.2)) + 16, 60_000))
    lengths.pop()
    problem = Problem.from_request(
        PlanRequest.model_validate({"cluster": {"nodes": nodes}, "lengths": lengths})
    )
    sizes = rng.choice([[8] * nodes, [16] * (nodes // 2), [4] * (2 * nodes)])
    budget = rng.choice([200, 2_000, 20_000])
    fast = searched(_Balancer, problem, sizes, budget)
    plain = searched(_PlainBalancer, problem, sizes, budget)
    assert [ld.members for ld in fast.loads] == [ld.members for ld in plain.loads]
    assert fast.evals == plain.evals
