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

The children of one parent also *share* its free memory: their free tokens add up to ``phi``.
So a group's need is also at least the sum, over its long samples, of what each one's own
child needs (with the parent's full layers at their cheapest, all of the slack free: the
parent's share is not known yet), unless two of them share a child, which then costs at least
that pair's child. Without it a group of three long samples in one parent needed 14,085 free
tokens where each alone needed ~7,000-8,500 (step 15 of a packed 16-rank-loader trace). That
rule makes feasibility change between the tables' values, so after the search over them the
bound is bisected (``SEPARATE_TOLERANCE``), reporting the highest step found infeasible.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from solver.cost_model import CostModel
from solver.problem import Problem
from solver.slack_bound import _partition_pairs

LONGEST = 6
"""Longest samples placed whole, every partition of them into parents covered (3^6 pairs)."""
GRID = 256
"""Free-memory steps between 0 and the slack: needs lose at most ``slack / GRID`` tokens."""
SEPARATE_TOLERANCE = 1e-4
"""Bisection of the bound with separate children stops within this share of the step."""


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


class _ChildPrice:
    """A parent's cheapest child of ``children`` sizes holding some long samples, per grid
    point of its free memory ``phi``."""

    def __init__(
        self,
        cost: CostModel,
        children: list[int],
        rate: float,
        phi: NDArray[np.float64],
        fill_sparse: _Filler,
    ) -> None:
        self.cost, self.children, self.rate = cost, children, rate
        self.phi, self.fill_sparse = phi, fill_sparse

    def __call__(
        self, lengths: NDArray[np.float64], sparse: NDArray[np.float64], floor: NDArray[np.float64]
    ) -> NDArray[np.float64]:
        """Per entry (x phi): the child holding ``lengths`` tokens of long samples (sparse
        attention ``sparse``), the rest of least sparse attention, its rank at least ``floor``
        tokens in the parent's full layers (``rate`` per token)."""
        cost, phi, cap = self.cost, self.phi, self.cost.max_tokens_per_rank
        best = np.full((len(lengths), len(phi)), np.inf)
        for k in self.children:
            held = np.maximum(lengths[:, None], k * cap - phi[None, :])
            per_rank = _ceil(held / k)
            price = self.rate * np.maximum(per_rank, floor[None, :]) + cost.sparse_layers * (
                (sparse[:, None] + self.fill_sparse(held - lengths[:, None])) / k
                + per_rank * cost.token_seconds(k)
                + cost.layer_fixed_seconds(k)
            )
            price[lengths > k * cap] = np.inf
            best = np.minimum(best, price)
        return best


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
    pair_a, pair_b = (np.array(side, dtype=np.int64) for side in np.triu_indices(k_big, 1))
    pair_masks = (1 << pair_a) | (1 << pair_b)
    holds = (masks[:, None] & pair_masks[None, :]) == pair_masks[None, :]  # mask x pair
    rows: list[NDArray[np.float64]] = []  # per size: mask x phi, long samples apart
    whole_rows: list[NDArray[np.float64]] = []  # the parent unrepacked
    pair_rows: list[NDArray[np.float64]] = []  # a pair of them in one child
    own_rows: list[NDArray[np.float64]] = []  # per size: sample x phi, its own child
    full_at_slack: list[NDArray[np.float64]] = []  # per size: mask, full layers at the slack
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
        children = [k for k in problem.child_sizes if k < size] if repack else []

        if children:
            # a group holding j: its parent's busiest rank holds at least j's child's mean, and
            # its sparse layers at least that child's: the cheapest child size for both
            big_sparse = sparse_attn[big]
            child = _ChildPrice(cost, children, rate, phi, fill_sparse)
            alone = child(big_tokens, big_sparse, busiest[0])
            ranked = np.where(member[:, :, None], alone[None, :, :], 0.0).max(axis=1)
            # its own child when the parent's busiest rank is at its least (all slack free)
            own = child(big_tokens, big_sparse, np.full(len(phi), busiest[0, -1]))
            # two of them in one child: at least that pair's child
            both = child(
                big_tokens[pair_a] + big_tokens[pair_b],
                big_sparse[pair_a] + big_sparse[pair_b],
                busiest[0],
            )
            shared = np.where(holds[:, :, None], both[None, :, :], np.inf).min(
                axis=1, initial=np.inf
            )  # a lone long sample has no pair: nothing shared
        else:
            ranked = np.full((len(masks), len(phi)), np.inf)
            own = np.full((k_big, len(phi)), np.inf)
            shared = np.full((len(masks), len(phi)), np.inf)
        too_big = group_tokens > room
        for out, extra in ((rows, ranked), (whole_rows, whole), (pair_rows, shared)):
            g = attention + extra
            g[too_big] = np.inf
            out.append(g)
        own_rows.append(own)
        full_at_slack.append(np.where(too_big, np.inf, attention[:, -1]))
    if not rows:
        return 0.0
    # mask x size x phi, each row non-increasing in phi
    table, whole_t, pair_t = (np.stack(t, axis=1) for t in (rows, whole_rows, pair_rows))
    own_t = np.stack(own_rows, axis=0)  # size x sample x phi
    base_t = np.stack(full_at_slack, axis=1)  # mask x size
    for t in (table, whole_t, pair_t):
        t[0] = 0.0
    least_table = np.minimum(table, whole_t)
    singles = [1 << j for j in range(k_big)]
    if not np.isfinite(least_table[singles, :, 0].min(axis=1)).all():
        return 0.0  # a long sample no parent of the menu holds: other checks refuse it
    levels = _dp_levels(k_big)

    def needs(t: NDArray[np.float64], step: float) -> NDArray[np.float64]:
        """Least free memory (rounded down to the grid) for each entry of ``t`` under ``step``."""
        above = (t > step).sum(axis=-1)  # grid points still too slow
        return np.where(above == 0, 0.0, np.where(above > GRID, np.inf, phi[above - 1]))

    descending = -own_t  # size x sample x phi, non-decreasing: ``searchsorted`` reads it

    def own_needs(step: float) -> NDArray[np.float64]:
        """``needs`` of each long sample's own child, per group and size (mask x size x
        sample), under ``step`` less the group's full layers at the slack."""
        room = step - base_t  # mask x size
        above = np.empty((len(masks), len(rows), k_big), dtype=np.int64)
        for col in range(len(rows)):
            for j in range(k_big):
                # grid points with own > room, i.e. -own < -room
                above[:, col, j] = np.searchsorted(descending[col, j], -room[:, col], side="left")
        return np.where(above == 0, 0.0, np.where(above > GRID, np.inf, phi[above - 1]))

    def feasible(step: float, separate: bool) -> bool:
        """Whether some partition of the longest samples into parents fits the slack.
        ``separate``: children of distinct long samples share their parent's free memory
        (each child needs its own), a pair in one child is priced as that pair."""
        children_need = needs(table, step)
        if separate:
            # each long sample in a child of its own: their needs add up within the parent
            # (the parent's full layers at their cheapest, all of the slack free); or some
            # pair shares a child, at least that pair's child
            own_need = np.where(member[:, None, :], own_needs(step), 0.0).sum(axis=2)
            apart_or_shared = np.minimum(own_need, needs(pair_t, step))
            children_need = np.maximum(children_need, apart_or_shared)
        need = np.minimum(children_need, needs(whole_t, step))
        w = np.append(need.min(axis=1), np.inf)  # the last entry pads ragged rows
        least = np.zeros_like(w)
        for level_masks, level_groups, level_rests in levels:
            least[level_masks] = (w[level_groups] + least[level_rests]).min(axis=1)
        return bool(least[(1 << k_big) - 1] <= slack)

    # Without the separate children, the least feasible step is one of the tables' values:
    # binary search over them; every step below it is infeasible with them too.
    values = np.unique(least_table[np.isfinite(least_table)])
    if not feasible(float(values[-1]), separate=False):
        return 0.0
    low, high = 0, len(values) - 1
    while low < high:
        mid = (low + high) // 2
        if feasible(float(values[mid]), separate=False):
            high = mid
        else:
            low = mid + 1
    found = float(values[low])
    if not repack or feasible(found, separate=True):
        return found
    # Infeasible at ``found``: bisect up to a feasible step, report the highest infeasible one.
    infeasible, top = found, float(values[-1])
    for _ in range(8):
        if feasible(top, separate=True):
            break
        infeasible, top = top, 1.25 * top
    else:
        return infeasible
    while top - infeasible > SEPARATE_TOLERANCE * infeasible:
        middle = 0.5 * (infeasible + top)
        if feasible(middle, separate=True):
            top = middle
        else:
            infeasible = middle
    return infeasible


def _dp_levels(k: int) -> list[tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]]:
    """``least[mask] = min over group of w[group] + least[mask ^ group]`` (``group`` a subset
    of ``mask`` holding its lowest bit), one vectorised step per number of samples in the mask
    (a mask's rests hold fewer): per level its masks and their groups and rests, rows padded
    with the group ``1 << k`` (``w`` there is inf) and the rest 0."""
    by_mask: dict[int, list[int]] = {}
    for mask, group in _partition_pairs(k):
        by_mask.setdefault(mask, []).append(group)
    levels = []
    for count in range(1, k + 1):
        level = [mask for mask in range(1, 1 << k) if mask.bit_count() == count]
        width = max(len(by_mask[mask]) for mask in level)
        groups = np.full((len(level), width), 1 << k, dtype=np.int64)
        rests = np.zeros((len(level), width), dtype=np.int64)
        for row, mask in enumerate(level):
            g = np.array(by_mask[mask], dtype=np.int64)
            groups[row, : len(g)] = g
            rests[row, : len(g)] = mask ^ g
        levels.append((np.array(level, dtype=np.int64), groups, rests))
    return levels
