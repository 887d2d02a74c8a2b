"""A bound over memberships: the longest sample placed whole, every other sample split
fractionally between its parent and the rest of the cluster, that parent either unrepacked
(exact) or repacked (each sample at the all-to-all price of its smallest feasible child).

Why: the balance bound of ``bounds.py`` charges every token the cheapest price on offer,
including the tokens that share the longest sample's parent. When that parent stays
unrepacked (its sample is faster there than in any node-local child), each token it holds
pays the wide parent's all-to-all in the sparse layers too, so the best membership puts
little there and the rest of the cluster carries more. This is the linear relaxation of that
choice, solved exactly: minimise ``max((a + sum y_i u_i) / P, (sum (1 - y_i) r_i) / (W - P))``
over ``0 <= y <= 1`` (``u``, ``r``: a sample's rank-seconds in the longest sample's parent
and at best elsewhere), a fractional knapsack taken by ratio ``u_i / r_i``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from solver.cost_model import ceil_div, full_layer_seconds, unrepacked_parent_seconds
from solver.node_memory_bound import floor_a2a, single_child_seconds
from solver.problem import Problem


def _rank_seconds(problem: Problem, size: int, repacked: bool) -> NDArray[np.float64]:
    """Per sample: least rank-seconds of its full and sparse layers in a parent of ``size``
    (unrepacked: the parent's all-to-all in both; repacked: the smallest feasible child's in
    the sparse layers); ``inf`` where the parent's memory cannot hold it."""
    cost, costs = problem.cost, problem.costs
    lin = cost.linear_seconds_per_token
    tokens = costs.tokens
    full = cost.full_layers * (costs.full_s + tokens * (lin + cost.a2a_seconds_per_token(size)))
    sparse_a2a = floor_a2a(problem, tokens, size) if repacked else cost.a2a_seconds_per_token(size)
    sparse = cost.sparse_layers * (costs.sparse_s + tokens * (lin + sparse_a2a))
    out: NDArray[np.float64] = np.where(tokens <= problem.capacity(size), full + sparse, np.inf)
    return out


def _split(
    own: float, into: NDArray[np.float64], elsewhere: NDArray[np.float64], size: int, rest: int
) -> float:
    """``min over y of max((own + y.into) / size, ((1 - y).elsewhere) / rest)``."""
    if rest == 0:  # a single parent holds everything
        return (own + float(into.sum())) / size
    forced = ~np.isfinite(elsewhere)  # too long for any other parent: it must be here
    if forced.any():
        own += float(into[forced].sum())  # inf if it fits nowhere: this case cannot happen
        into, elsewhere = into[~forced], elsewhere[~forced]
    movable = np.isfinite(into)
    total = float(elsewhere.sum())
    into, elsewhere = into[movable], elsewhere[movable]
    order = np.argsort(into / np.maximum(elsewhere, 1e-300), kind="stable")
    add = np.concatenate([[0.0], np.cumsum(into[order])])
    drop = np.concatenate([[0.0], np.cumsum(elsewhere[order])])
    left = (own + add) / size  # increasing in the samples moved
    right = (total - drop) / rest  # decreasing
    k = int(np.searchsorted(left - right, 0.0, side="left"))  # first point with left >= right
    if k == 0:
        return float(max(left[0], right[0]))
    if k == len(left):
        return float(right[-1])  # even all movable samples there leave the others slower
    # the crossing lies inside sample k-1 (moved fractionally): both sides equal there
    a, b = into[order[k - 1]] / size, elsewhere[order[k - 1]] / rest
    t = (right[k - 1] - left[k - 1]) / (a + b)
    return float(left[k - 1] + t * a)


def _alone(problem: Problem, size: int, sample: int, repacked: bool) -> float:
    """Least time of a parent of ``size`` holding ``sample`` (``inf`` if repacked and no child
    holds it): unrepacked exact; repacked, its full layers with the busiest rank holding at
    least its share of a node and its sparse layers at least its own best child."""
    cost = problem.cost
    length, full, sparse = problem.tokens[sample], problem.full_s[sample], problem.sparse_s[sample]
    if not repacked:
        return unrepacked_parent_seconds(cost, size, full, sparse, length)
    single = single_child_seconds(problem, sample, size)
    widest = min(size, cost.gpus_per_node)
    m = ceil_div(length, widest)
    return cost.full_layers * full_layer_seconds(cost, size, full, m) + cost.sparse_layers * single


def split_bound(problem: Problem, sizes: Sequence[int], repack: bool, tiling: bool) -> float:
    """Bound over memberships of the parents ``sizes`` (``tiling``: exactly these parents;
    else any tiling drawn from the menu ``sizes``), with the longest sample whole."""
    cost = problem.cost
    longest = int(np.argmax(problem.costs.tokens))  # the first of the longest
    length = problem.tokens[longest]
    others = np.ones(problem.num_samples, dtype=bool)
    others[longest] = False
    count = Counter(sizes)
    rates = {
        (size, state): _rank_seconds(problem, size, state)
        for size in count
        for state in ((False, True) if repack else (False,))
    }
    cheapest: dict[tuple[int, ...], NDArray[np.float64]] = {}
    best = float("inf")
    for size in sorted(count):
        if length > problem.capacity(size):
            continue
        if tiling:
            rest_sizes = [k for k in count if k != size or count[k] > 1]
            rest = cost.world_size - size
        else:
            rest_sizes, rest = list(count), cost.world_size - size
        key = tuple(sorted(rest_sizes))
        if key not in cheapest:  # the same for every size of a menu: computed once
            cheapest[key] = np.full(problem.num_samples, np.inf)
            for k, state in rates:
                if k in rest_sizes:
                    cheapest[key] = np.minimum(cheapest[key], rates[k, state])
        elsewhere = cheapest[key]
        option = float("inf")
        for state in (False, True) if repack else (False,):
            alone = _alone(problem, size, longest, state)
            into = rates[size, state]
            own = float(into[longest])
            balanced = _split(own, into[others], elsewhere[others], size, rest)
            option = min(option, max(alone, balanced))
        best = min(best, option)
    return 0.0 if best == float("inf") else best
