"""A bound from the memory slack the longest samples' parents share, children included (the
repacked modes).

On a loader's packed step every rank ends within a few tokens of ``max_tokens_per_rank``, and
the linear work and all-to-all of a full rank are ~90% of a step. A rank holding a long sample
then carries its attention *on top of* a full rank's linear work in the sparse layers (its
child is full too), and its parent's full layers carry a full rank's all-to-all: what the
balance bounds spread over the whole cluster sits on that child. The only relief is free
memory, and the cluster has ``slack = W * cap - total`` of it (a packing loader's: under one
rank's worth) for all of its long samples together.

So for a parent of ``P`` ranks holding a set ``S`` of the longest samples with ``phi`` tokens
of free memory (the child holding ``s`` in ``S`` has at most ``phi`` free as well), its time is
at least ``g_{S,P}(phi)``:

* full layers: ``(full(S) + cheapest full attention of P * cap - phi - tokens(S) other
  tokens) / P``, plus the busiest rank's ``ceil((P * cap - phi) / P)`` tokens at the parent's
  per-token price;
* sparse layers: for each ``s`` in ``S``, its child of the cheapest size ``k`` (node-local, or
  the whole parent unrepacked) with at least ``max(L_s, k * cap - phi)`` tokens, the other
  ones of least sparse attention.

``g`` falls as ``phi`` grows; under a step time ``T`` each group needs the least ``phi`` with
``g <= T``, and the groups of a partition of the longest samples sit in distinct parents, whose
free memory adds up to at most ``slack``: where no partition fits, no layout reaches ``T``.
Fillers are the other samples taken fractionally, cheapest attention per token first, each
term by its own minimum (a sum of minima stays a bound). ``phi`` runs on a grid and every
group's need is rounded *down* to it, so the bound only loosens by the grid's step.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from solver.problem import Problem
from solver.slack_bound import _partition_pairs

LONGEST = 6
"""Longest samples placed whole, every partition of them into parents covered (3^6 pairs)."""
GRID = 256
"""Free-memory steps between 0 and the slack: needs lose at most ``slack / GRID`` tokens."""


class _Filler:
    """Least attention of ``t`` tokens of the pool, fractional, cheapest per token first."""

    def __init__(self, tokens: NDArray[np.float64], attention: NDArray[np.float64]) -> None:
        order = np.argsort(attention / np.maximum(tokens, 1.0), kind="stable")
        zero = np.zeros(1)
        self.cum_t = np.concatenate([zero, np.cumsum(tokens[order])])
        self.cum_a = np.concatenate([zero, np.cumsum(attention[order])])

    def __call__(self, t: NDArray[np.float64]) -> NDArray[np.float64]:
        # beyond the pool: no such parent exists, and the pool's total is still a lower value
        out: NDArray[np.float64] = np.interp(np.maximum(t, 0.0), self.cum_t, self.cum_a)
        return out


def _ceil(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """Ceiling of a token count: an integer count at least ``x`` is at least its ceiling.
    The 1e-9 keeps float noise on exact integers from adding a token."""
    out: NDArray[np.float64] = np.ceil(x - 1e-9)
    return out


def repacked_slack_bound(problem: Problem, sizes: Sequence[int], repack: bool = True) -> float:
    """Bound over every tiling drawn from ``sizes`` (a menu, or a tiling's sizes) and every
    membership and set of children (``repack``; else parents unrepacked). 0 where the step
    leaves no slack to share or has no sample a parent of the menu holds."""
    cost = problem.cost
    cap = cost.max_tokens_per_rank
    tokens = problem.costs.tokens.astype(np.float64)
    slack = float(cost.world_size * cap - tokens.sum())
    if slack < 0 or problem.num_samples == 0:
        return 0.0
    k_big = min(LONGEST, problem.num_samples)
    big = np.argsort(-problem.costs.tokens, kind="stable")[:k_big]
    others = np.ones(problem.num_samples, dtype=bool)
    others[big] = False
    full_attn = problem.costs.full_s  # per layer: the layer counts multiply each term once
    sparse_attn = problem.costs.sparse_s
    fill_full = _Filler(tokens[others], full_attn[others])
    fill_sparse = _Filler(tokens[others], sparse_attn[others])
    masks = np.arange(1 << k_big)
    member = ((masks[:, None] >> np.arange(k_big)[None, :]) & 1).astype(bool)  # mask x sample
    big_tokens = tokens[big]
    group_tokens = member @ big_tokens
    group_full = member @ full_attn[big]
    group_sparse = member @ sparse_attn[big]
    phi = np.linspace(0.0, slack, GRID + 1)
    rows = []  # per parent size: g over (mask, phi), inf where the parent cannot hold the group
    for size in sorted(set(sizes)):
        room = size * cap
        span = room - phi  # the parent's tokens at free memory phi
        busiest = _ceil(span / size)[None, :]  # the parent's busiest rank, at least its mean
        attention = cost.full_layers * (
            (group_full[:, None] + fill_full(span[None, :] - group_tokens[:, None])) / size
            + cost.layer_fixed_seconds(size)
        )
        rate = cost.full_layers * cost.token_seconds(size)
        whole = rate * busiest + cost.sparse_layers * (  # unrepacked: one child of all of it
            (group_sparse[:, None] + fill_sparse(span[None, :] - group_tokens[:, None])) / size
            + busiest * cost.token_seconds(size)
            + cost.layer_fixed_seconds(size)
        )
        # a group holding j: its parent's busiest rank holds at least j's child's mean, and its
        # sparse layers at least that child's: the cheapest child size for both together
        ranked = np.zeros((len(masks), len(phi)))
        if repack:
            children = [k for k in problem.child_sizes if k < size]
            for j in range(k_big):
                length = float(big_tokens[j])
                best = np.full(len(phi), np.inf)
                for k in children:
                    if length > k * cap:
                        continue
                    held = np.maximum(length, k * cap - phi)
                    per_rank = _ceil(held / k)
                    child = rate * np.maximum(per_rank, busiest[0]) + cost.sparse_layers * (
                        (sparse_attn[big[j]] + fill_sparse(held - length)) / k
                        + per_rank * cost.token_seconds(k)
                        + cost.layer_fixed_seconds(k)
                    )
                    best = np.minimum(best, child)
                ranked = np.where(member[:, j : j + 1], np.maximum(ranked, best[None, :]), ranked)
            ranked = np.minimum(ranked, whole)
        else:
            ranked = whole
        g = attention + ranked
        g[group_tokens > room] = np.inf
        rows.append(g)
    if not rows:
        return 0.0
    table = np.stack(rows, axis=1)  # mask x size x phi, each row non-increasing in phi
    table[0] = 0.0
    singles = [1 << j for j in range(k_big)]
    if not np.isfinite(table[singles, :, 0].min(axis=1)).all():
        return 0.0  # a long sample no parent of the menu holds: other checks refuse it
    groups, rests = _dp_steps(k_big)

    def feasible(step: float) -> bool:
        """Whether some partition of the longest samples into parents fits the slack."""
        above = (table > step).sum(axis=2)  # grid points still too slow, per mask and size
        need = np.where(above == 0, 0.0, np.where(above > GRID, np.inf, phi[above - 1]))
        w = need.min(axis=1)
        least = np.zeros_like(w)
        for mask in range(1, 1 << k_big):
            least[mask] = (w[groups[mask]] + least[rests[mask]]).min()
        return bool(least[-1] <= slack)

    # The least feasible step is one of the table's values: binary search over them.
    values = np.unique(table[np.isfinite(table)])
    if not feasible(float(values[-1])):
        return 0.0
    low, high = 0, len(values) - 1
    while low < high:
        mid = (low + high) // 2
        if feasible(float(values[mid])):
            high = mid
        else:
            low = mid + 1
    return float(values[low])


def _dp_steps(k: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per mask: the groups holding its lowest bit and the rest of the mask after each, for
    ``least[mask] = min over group of w[group] + least[mask ^ group]`` (vectorised)."""
    groups: list[np.ndarray] = [np.zeros(0, dtype=np.int64)]
    rests: list[np.ndarray] = [np.zeros(0, dtype=np.int64)]
    by_mask: dict[int, list[int]] = {}
    for mask, group in _partition_pairs(k):
        by_mask.setdefault(mask, []).append(group)
    for mask in range(1, 1 << k):
        g = np.array(by_mask[mask], dtype=np.int64)
        groups.append(g)
        rests.append(mask ^ g)
    return groups, rests
