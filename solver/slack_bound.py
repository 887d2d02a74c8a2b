"""A bound from the memory slack that the longest samples' parents share (mode ``sizing``).

Whatever the tiling, the parents' free memory adds up to at most the cluster's slack
``W * cap - total`` (a loader's packed step leaves under one rank's worth). An unrepacked parent
of ``P`` ranks holding ``t`` tokens runs at least ``(A + t * c(P)) / P`` (its rank-seconds over
its ranks: attention ``A``, every token at the parent's linear + all-to-all rate ``c(P)`` in
every layer). If it holds a set ``S`` of the longest samples, the rest of its ``t = P * cap - f``
tokens cost at least the cheapest attention per token of the other samples (fractional), so
under a step time ``T`` it needs at least ``f_S(T)`` free memory; the parents of a partition of
the longest samples are distinct, so ``sum f_S(T) <= slack`` or no layout reaches ``T``. The
memory bounds of ``bounds.py`` / ``node_memory_bound.py`` hand *one* parent all the slack; a
packed step has several long samples of dense attention whose parents must all be near full.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from solver.cost_model import unrepacked_parent_seconds
from solver.problem import Problem

LONGEST = 4
"""Longest samples placed whole; every partition of them into parents is covered (recursion
over subsets: 3^4 pairs). On the packed 16-rank-parent trace a fifth or sixth changed no
wide step's bound."""
BISECTIONS = 40
"""Halvings of the step-time bracket (at most 2x the result): far below the gaps measured."""


class _Pool:
    """The other samples, cheapest attention per token first, as prefix sums."""

    def __init__(self, tokens: NDArray[np.int64], attention: NDArray[np.float64]) -> None:
        order = np.argsort(attention / np.maximum(tokens, 1), kind="stable")
        zero = np.zeros(1)
        self.tokens = tokens[order].astype(np.float64)
        self.attention = attention[order]
        self.cum_t = np.concatenate([zero, np.cumsum(self.tokens)])
        self.cum_a = np.concatenate([zero, np.cumsum(self.attention)])

    def most_tokens(self, budget: NDArray[np.float64], rate: float) -> NDArray[np.float64]:
        """Per budget (rank-seconds, >= 0): the most tokens whose attention plus ``rate`` per
        token stays within it, the cheapest first, the last one fractionally."""
        count = len(self.tokens)
        if count == 0:
            return np.zeros_like(budget)
        cum = self.cum_a + rate * self.cum_t
        whole = np.clip(np.searchsorted(cum, budget, side="right") - 1, 0, count)
        idx = np.minimum(whole, count - 1)
        per_token = self.attention[idx] / self.tokens[idx] + rate
        extra = np.minimum((budget - cum[whole]) / per_token, self.tokens[idx])
        return self.cum_t[whole] + np.where(whole < count, np.maximum(extra, 0.0), 0.0)


def _partition_pairs(k: int) -> list[tuple[int, int]]:
    """``(mask, group)`` with ``group`` a subset of ``mask`` holding its lowest bit, masks in
    increasing order: the recursion ``least[mask] = min f[group] + least[mask ^ group]``."""
    pairs = []
    for mask in range(1, 1 << k):
        low = mask & -mask
        rest = mask ^ low
        sub = rest
        while True:
            pairs.append((mask, sub | low))
            if sub == 0:
                break
            sub = (sub - 1) & rest
    return pairs


def slack_bound(problem: Problem, sizes: Sequence[int]) -> float:
    """Bound over every tiling drawn from ``sizes`` and every membership, parents unrepacked."""
    cost = problem.cost
    cap = cost.max_tokens_per_rank
    tokens = problem.costs.tokens
    slack = float(cost.world_size * cap - int(tokens.sum()))
    k = min(LONGEST, problem.num_samples)
    big = np.argsort(-tokens, kind="stable")[:k]
    others = np.ones(problem.num_samples, dtype=bool)
    others[big] = False
    layers = cost.full_layers + cost.sparse_layers
    attention = (
        cost.full_layers * problem.costs.full_s + cost.sparse_layers * problem.costs.sparse_s
    )
    pool = _Pool(tokens[others], attention[others])
    masks = np.arange(1 << k)
    member = ((masks[:, None] >> np.arange(k)[None, :]) & 1).astype(bool)  # mask x sample
    group_tokens = member @ tokens[big].astype(np.float64)
    cases = []
    for size in sorted(set(sizes)):
        room = size * cap - group_tokens
        if not (room >= 0).any():
            continue
        rate = layers * (cost.linear_seconds_per_token + cost.a2a_seconds_per_token(size))
        own = member @ (attention[big] + rate * tokens[big])
        alone = np.array(
            [
                unrepacked_parent_seconds(
                    cost, size, problem.full_s[s], problem.sparse_s[s], problem.tokens[s]
                )
                for s in big.tolist()
            ]
        )
        slowest = np.where(member, alone[None, :], 0.0).max(axis=1)
        fixed = layers * cost.layer_fixed_seconds(size)
        cases.append((size, rate, own, slowest, fixed, room))
    pairs = _partition_pairs(k)

    def needed(step: float) -> NDArray[np.float64]:
        """Per group (mask): least free memory of a parent holding it, under ``step``."""
        best = np.full(1 << k, np.inf)
        for size, rate, own, slowest, fixed, room in cases:
            budget = size * (step - fixed) - own
            ok = (room >= 0) & (slowest <= step) & (budget >= 0)
            filler = pool.most_tokens(np.maximum(budget, 0.0), rate)
            free = np.maximum(room - filler, 0.0)
            best = np.where(ok, np.minimum(best, free), best)
        best[0] = 0.0
        return best

    def feasible(step: float) -> bool:
        f = needed(step).tolist()
        least = [0.0] + [np.inf] * ((1 << k) - 1)
        for mask, group in pairs:
            value = f[group] + least[mask ^ group]
            if value < least[mask]:
                least[mask] = value
        return bool(least[-1] <= slack)

    total = float(attention.sum()) + layers * cost.linear_seconds_per_token * float(tokens.sum())
    low, high = 0.0, total / cost.world_size
    for _ in range(64):
        if feasible(high):
            break
        low, high = high, 2 * high
    else:
        return 0.0
    for _ in range(BISECTIONS):
        mid = (low + high) / 2
        if feasible(mid):
            high = mid
        else:
            low = mid
    return low
