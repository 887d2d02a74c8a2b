"""Lower bounds from memory at node level, for steps packed to the ranks' token budget.

Loaders fill every rank to ~99% of ``max_tokens_per_rank``, so no membership leaves room: the
parent holding the longest sample ``L`` must hold ``total - (W - P) * cap`` tokens, and the node
of that parent holding ``L`` must hold what the parent's other nodes cannot,
``parent_tokens - (P - g) * cap`` (``g = min(P, G)`` ranks per node). Children are node-local,
so that node's ranks carry all of it in the sparse layers, each sample at least at the
all-to-all price of its smallest feasible child (when only a child of the whole node holds
``L``, everything on that node pays the node-wide price). The balance bounds of
``bounds.py`` spread the same tokens over the whole parent (or cluster) with no all-to-all,
which is what left 5-10% gaps on packed wide steps.

Fillers are the shortest samples taken fractionally: per token, attention cost and the
smallest feasible child both grow with length, so they are the cheapest tokens to add, for
each term separately (each term is bounded by its own minimum, so the sum stays a bound).
Fillers are priced without the profile's per-sample overheads (``SampleCosts.
sparse_attention_s``): with them a short sample costs more per token than a longer one, and
the shortest-first filler priced a parent above a plan of it (a hunt over profiles with
``sample_overhead_us_*`` set, 2026-12-06); leaving the fillers' overheads out keeps a bound.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from solver.cost_model import (
    ceil_div,
    child_layer_seconds,
    full_layer_seconds,
    unrepacked_parent_seconds,
)
from solver.problem import Problem


def smallest_child(problem: Problem, length: int, size: int) -> int | None:
    """Smallest node-local child of a parent of ``size`` that holds ``length`` tokens."""
    g = min(size, problem.cost.gpus_per_node)
    return next((k for k in problem.child_sizes if k <= g and length <= problem.capacity(k)), None)


def single_child_seconds(problem: Problem, sample: int, size: int) -> float:
    """Least sparse-layer time of ``sample`` alone in a node-local child of a parent of
    ``size`` (``inf`` if none holds it); ``Problem.single_bounds`` without computing it for
    every sample (a request at 1,024 ranks has ~10^4)."""
    g = min(size, problem.cost.gpus_per_node)
    length, sparse = problem.tokens[sample], problem.sparse_s[sample]
    return min(
        (
            child_layer_seconds(problem.cost, k, sparse, length)
            for k in problem.child_sizes
            if k <= g and length <= problem.capacity(k)
        ),
        default=float("inf"),
    )


def floor_a2a(problem: Problem, tokens: NDArray[np.int64], size: int) -> NDArray[np.float64]:
    """Per sample of ``tokens``: the all-to-all seconds per token of its smallest feasible
    child in a parent of ``size`` (0 where none fits: that parent is then never repacked, and
    0 keeps the bound a bound). Inside a node the price per token grows with the child."""
    cost = problem.cost
    g = min(size, cost.gpus_per_node)
    kids = [k for k in problem.child_sizes if k <= g]
    caps = np.array([problem.capacity(k) for k in kids], dtype=np.int64)
    price = np.array([cost.a2a_seconds_per_token(k) for k in kids] + [0.0])
    return price[np.searchsorted(caps, tokens, side="left")]


@dataclass(frozen=True)
class _Filler:
    """Sums of a fractional filler taken from the shortest samples."""

    tokens: float = 0.0
    full: float = 0.0
    sparse: float = 0.0
    floor: float = 0.0
    """Sparse-layer rank-seconds at the price of each sample's smallest feasible child."""


class _Pool:
    """Candidate filler samples, shortest first, with prefix sums so that a fractional fill of
    any size costs one binary search (a request at 1,024 ranks has ~10^4 samples)."""

    def __init__(self, problem: Problem, order: NDArray[np.int64], size: int) -> None:
        """``order``: the samples, shortest first (``shortest_first``)."""
        tokens = problem.costs.tokens[order]
        sparse = problem.costs.sparse_attention_s[order]  # no per-sample overhead: see above
        lin = problem.cost.linear_seconds_per_token
        floor = sparse + tokens * (lin + floor_a2a(problem, tokens, size))
        zero = np.zeros(1)
        self.tokens = tokens
        self.cum = [
            np.concatenate([zero, np.cumsum(a)])
            for a in (tokens, problem.costs.full_attention_s[order], sparse, floor)
        ]

    def fill(self, need: float) -> _Filler:
        """The shortest samples up to ``need`` tokens, the last one fractionally."""
        if need <= 0 or len(self.tokens) == 0:
            return _Filler()
        cum_tokens = self.cum[0]
        whole = int(np.searchsorted(cum_tokens, need, side="right")) - 1  # samples taken whole
        sums = [float(c[whole]) for c in self.cum]
        if whole < len(self.tokens):
            share = (need - sums[0]) / float(self.tokens[whole])
            sums = [
                v + share * float(c[whole + 1] - c[whole])
                for v, c in zip(sums, self.cum, strict=True)
            ]
        return _Filler(*sums)


def forced_parent_bound(
    problem: Problem,
    size: int,
    longest: int,
    pool: _Pool,
    parent_tokens: float,
    repack: bool,
) -> float:
    """Least time of a parent of ``size`` that holds sample ``longest`` and at least
    ``parent_tokens`` tokens in all, the rest drawn from ``pool`` (built for this size).

    Unrepacked: exact with the cheapest filler. Repacked, for each size ``k`` of the child
    holding ``longest``: that child holds what the other ``g - k`` ranks of its node cannot
    (all of its time is at its own all-to-all price); full layers with the busiest rank at least
    the parent's, the node's and that child's mean; sparse layers at least that child, the
    node's rank-seconds over its ``g`` ranks and the parent's over ``P``.
    ``inf`` if the parent cannot hold ``longest`` (so it is never chosen for it)."""
    cost = problem.cost
    length = problem.tokens[longest]
    if length > problem.capacity(size):
        return float("inf")
    parent_tokens = max(parent_tokens, float(length))
    rest = pool.fill(parent_tokens - length)
    full = problem.full_s[longest] + rest.full
    sparse = problem.sparse_s[longest] + rest.sparse
    tokens = length + rest.tokens
    whole = unrepacked_parent_seconds(cost, size, full, sparse, int(tokens))
    k_long = smallest_child(problem, length, size) if repack else None
    if k_long is None:
        return whole
    g = min(size, cost.gpus_per_node)
    cap = cost.max_tokens_per_rank
    node_tokens = parent_tokens - (size - g) * cap
    node = pool.fill(node_tokens - length)
    lin = cost.linear_seconds_per_token
    own = problem.sparse_s[longest] + length * (lin + cost.a2a_seconds_per_token(k_long))
    node_s = (own + node.floor) / g
    parent_s = (own + rest.floor) / size
    m = max(ceil_div(int(tokens), size), ceil_div(int(length + node.tokens), g))
    repacked = float("inf")
    # The child holding `longest` (k ranks) holds what the rest of its node cannot.
    for k in (k for k in problem.child_sizes if k_long <= k <= g):
        kid = pool.fill(node_tokens - (g - k) * cap - length)
        per_token = lin + cost.a2a_seconds_per_token(k)
        kid_s = (problem.sparse_s[longest] + kid.sparse + (length + kid.tokens) * per_token) / k
        busiest = max(m, ceil_div(int(length + kid.tokens), k))
        option = cost.full_layers * full_layer_seconds(cost, size, full, busiest)
        option += cost.sparse_layers * max(node_s, parent_s, kid_s)
        repacked = min(repacked, option)
    return min(whole, repacked)


def shortest_first(problem: Problem, samples: Sequence[int]) -> NDArray[np.int64]:
    """``samples`` by length, ties by index."""
    picked = np.sort(np.asarray(samples, dtype=np.int64))
    return picked[np.argsort(problem.costs.tokens[picked], kind="stable")]


def node_memory_parent_bound(
    problem: Problem, size: int, members: Sequence[int], repack: bool
) -> float:
    """Bound of one parent with fixed ``members`` (mode ``repack``): all of them are there."""
    if not members:
        return 0.0
    order = shortest_first(problem, members)
    longest = int(order[np.searchsorted(problem.costs.tokens[order], problem.tokens[order[-1]])])
    pool = _Pool(problem, order[order != longest], size)
    total = sum(problem.tokens[s] for s in members)
    return forced_parent_bound(problem, size, longest, pool, total, repack)


def node_memory_free_bound(problem: Problem, sizes: Sequence[int], repack: bool) -> float:
    """Bound over every membership (and every tiling drawn from ``sizes``): whichever size
    holds the longest sample, the other ``W - P`` ranks hold at most their memory."""
    cost = problem.cost
    longest = int(np.argmax(problem.costs.tokens))  # the first of the longest
    order = shortest_first(problem, range(problem.num_samples))
    others = order[order != longest]
    pools: dict[int, _Pool] = {}  # per ranks of a node: the all-to-all floor depends on it
    best = float("inf")
    for size in sorted(set(sizes)):
        g = min(size, cost.gpus_per_node)
        if g not in pools:
            pools[g] = _Pool(problem, others, g)
        need = sum(problem.tokens) - (cost.world_size - size) * cost.max_tokens_per_rank
        best = min(best, forced_parent_bound(problem, size, longest, pools[g], need, repack))
    return 0.0 if best == float("inf") else best


def filled_parent_bound(problem: Problem, size: int, pool: _Pool, parent_tokens: float) -> float:
    """Least time of a parent of ``size`` that holds at least ``parent_tokens`` tokens drawn
    from ``pool`` (built for this size's ranks per node), whatever its samples: the cheapest
    such tokens are the shortest samples, for each term separately. Unrepacked, exact with
    that filler; repacked, full layers with the busiest rank at least the parent's mean and
    sparse layers at least the parent's and any node's rank-seconds (every node holds what
    the parent's other nodes cannot), each token at its smallest feasible child's price."""
    cost = problem.cost
    if parent_tokens <= 0:
        return 0.0
    fill = pool.fill(parent_tokens)
    whole = unrepacked_parent_seconds(cost, size, fill.full, fill.sparse, int(fill.tokens))
    g = min(size, cost.gpus_per_node)
    node = pool.fill(parent_tokens - (size - g) * cost.max_tokens_per_rank)
    busiest = max(ceil_div(int(fill.tokens), size), ceil_div(int(node.tokens), g))
    repacked = cost.full_layers * full_layer_seconds(cost, size, fill.full, busiest)
    repacked += cost.sparse_layers * max(fill.floor / size, node.floor / g)
    return min(whole, repacked)


def tiling_memory_bound(problem: Problem, sizes: Sequence[int]) -> float:
    """Bound over every membership of the parents ``sizes`` (a tiling of the cluster, mode
    ``repack+parent``'s model), repacked or not: *every* parent of ``P`` ranks holds at least
    ``total - (W - P) * cap`` tokens, since the other ranks hold at most their memory. On a
    loader's packed step that is most of a wide parent's memory whichever samples it holds,
    and a wide parent's full layers pay the cross-node all-to-all for all of it, which the
    bounds of the parent holding the longest sample (``node_memory_free_bound``: the cheapest
    size for it) do not charge: 96 GPUs of 8-GPU nodes, parents [32, 32, 16, 8, 8] at 98.5%,
    `repack+parent` 5,352 ms against a bound of 4,044 ms."""
    cost = problem.cost
    if sum(sizes) != cost.world_size:
        raise ValueError(f"parent sizes {list(sizes)} do not tile {cost.world_size} ranks")
    order = shortest_first(problem, range(problem.num_samples))
    total = sum(problem.tokens)
    pools: dict[int, _Pool] = {}
    best = 0.0
    for size in sorted(set(sizes)):
        g = min(size, cost.gpus_per_node)
        if g not in pools:
            pools[g] = _Pool(problem, order, g)
        need = total - (cost.world_size - size) * cost.max_tokens_per_rank
        best = max(best, filled_parent_bound(problem, size, pools[g], need))
    return best
