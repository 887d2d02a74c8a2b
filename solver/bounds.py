"""True lower bounds on the step time, so that the reported gap means something.

Every bound here is a relaxation of the cost model, never an estimate:

* ``aggregate``: every parent's rank-seconds are at least its compute plus the all-to-all that
  no layout avoids, and the step is at least the mean over ranks (any membership);
* ``per sample``: a parent holding sample i is at least as slow as i alone in its best layout;
* ``per parent`` (fixed membership): the larger of its members' single-sample bounds and its own
  work spread evenly, or its unrepacked time if that is smaller (both layouts are allowed);
* ``memory``: the other parents hold at most their ranks' memory, so the longest sample's parent
  also holds whatever they cannot, at best the shortest samples (a fractional filler);
* ``node memory`` (``node_memory_bound``, reported only): the same one level down, the node of
  that parent holding the longest sample holds what the parent's other nodes cannot;
* ``slack`` (``slack_bound``, reported only, mode ``sizing``): the parents of the few longest
  samples share the cluster's free memory, so all of them must be near full;
* ``repacked slack`` (``repacked_slack_bound``, reported only, mode ``repack+sizing`` on
  memory-tight steps): the same one level down, the child holding each long sample full.
"""

from __future__ import annotations

from collections.abc import Sequence

from solver.cost_model import (
    ceil_div,
    full_layer_seconds,
    unrepacked_parent_seconds,
)
from solver.membership import single_sample_bound
from solver.node_membership import TIGHT_FILL
from solver.node_memory_bound import (
    node_memory_free_bound,
    node_memory_parent_bound,
    tiling_memory_bound,
)
from solver.problem import Problem
from solver.repacked_slack_bound import repacked_slack_bound
from solver.slack_bound import slack_bound
from solver.split_bound import split_bound


def aggregate_bound(problem: Problem, sizes: Sequence[int]) -> float:
    """Mean rank-seconds over the cluster, with the communication no layout can avoid.

    A parent of size P spends ``P * time >= F + T * (linear + a2a(P))`` on its full layers, so
    every token pays at least the cheapest all-to-all among the parent sizes on offer; a sample
    longer than a node forces its parent to stay unrepacked, so its tokens also pay that
    parent's all-to-all in the sparse layers; one longer than a rank's memory needs a group of
    at least ``L / max_tokens_per_rank`` ranks there, and pays at least that group's all-to-all.
    """
    cost = problem.cost
    lin = cost.linear_seconds_per_token
    a2a = {size: cost.a2a_seconds_per_token(size) for size in set(sizes)}
    cheapest = min(a2a.values())
    # The floor depends on a length only through which groups hold it, i.e. through
    # ceil(length / max_tokens_per_rank): computed once per such class, not per sample.
    floors: dict[int, float] = {}
    per_rank = cost.max_tokens_per_rank
    forced = 0.0
    for length in problem.tokens:
        ranks = ceil_div(length, per_rank)
        if ranks not in floors:
            floors[ranks] = sparse_a2a_floor(problem, length, sizes)
        forced += length * floors[ranks]
    total_tokens = sum(problem.tokens)
    rank_seconds = cost.full_layers * (
        sum(problem.full_s) + total_tokens * (lin + cheapest)
    ) + cost.sparse_layers * (sum(problem.work_s) + forced)
    return rank_seconds / cost.world_size


def sparse_a2a_floor(problem: Problem, length: int, sizes: Sequence[int]) -> float:
    """Least all-to-all seconds per token a sample of ``length`` pays in a sparse layer: the
    cheapest group that can hold it (a node-local child, else its unrepacked parent). Not
    always the smallest group: with an inter-node link as fast as the intra-node one, a
    parent over two nodes moves a token more cheaply than a child of a whole node."""
    cost = problem.cost
    parents = [size for size in set(sizes) if problem.capacity(size) >= length]
    if length > problem.capacity(cost.gpus_per_node):
        return min(cost.a2a_seconds_per_token(size) for size in parents)
    children = [k for k in problem.child_sizes if length <= problem.capacity(k)]
    return min(cost.a2a_seconds_per_token(k) for k in children + parents)


def cheapest_child_a2a(problem: Problem, length: int, size: int) -> float | None:
    """Least all-to-all seconds per token of a node-local child of a parent of ``size`` that
    holds ``length`` tokens; None when no such child exists."""
    fits = [k for k in problem.child_sizes if k <= size and length <= problem.capacity(k)]
    return min((problem.cost.a2a_seconds_per_token(k) for k in fits), default=None)


def unrepacked_seconds(problem: Problem, size: int, members: Sequence[int]) -> float:
    return unrepacked_parent_seconds(
        problem.cost,
        size,
        sum(problem.full_s[s] for s in members),
        sum(problem.sparse_s[s] for s in members),
        sum(problem.tokens[s] for s in members),
    )


def repacked_bound(problem: Problem, size: int, members: Sequence[int]) -> float:
    """Lower bound of any repacked layout of ``members`` in a parent of ``size``."""
    cost = problem.cost
    if not members:
        return 0.0
    single = max(single_sample_bound(problem, s, size) for s in members)
    work = sum(problem.work_s[s] for s in members) / size
    # Children stay inside a node, so the longest member puts at least L / min(P, G) tokens on
    # some rank; and some rank holds at least the average.
    widest_child = min(size, cost.gpus_per_node)
    m = max(
        ceil_div(sum(problem.tokens[s] for s in members), size),
        ceil_div(max(problem.tokens[s] for s in members), widest_child),
    )
    full = full_layer_seconds(cost, size, sum(problem.full_s[s] for s in members), m)
    return cost.full_layers * full + cost.sparse_layers * max(single, work)


def parent_bound(problem: Problem, size: int, members: Sequence[int], repack: bool) -> float:
    base = unrepacked_seconds(problem, size, members)
    return min(base, repacked_bound(problem, size, members)) if repack else base


def membership_free_bound(problem: Problem, sizes: Sequence[int], repack: bool) -> float:
    """Bound over every membership of the given parent sizes (memoised per request: several
    stages ask for the same sizes, and at 1,024 ranks each call costs tens of milliseconds)."""
    key = ("membership_free_bound", tuple(sizes), repack)
    memo = problem.memo
    if key not in memo:
        memo[key] = _membership_free_bound(problem, sizes, repack)
    return memo[key]


def _membership_free_bound(problem: Problem, sizes: Sequence[int], repack: bool) -> float:
    """Bound over every membership of the given parent sizes.

    The longest sample decides most: wherever it sits, its parent is at least as slow as it
    alone there, and its tokens pay that parent's all-to-all in the full layers (and in the
    sparse layers, unless a node-local child holds it), which the mean rank-seconds must carry.
    Every per-sample term grows with length, so no other sample gives a larger single bound.
    """
    cost = problem.cost
    aggregate = aggregate_bound(problem, sizes)
    longest = max(range(problem.num_samples), key=lambda s: (problem.tokens[s], -s))
    length = problem.tokens[longest]
    fitting = sorted(size for size in set(sizes) if length <= problem.capacity(size))
    a2a = {size: cost.a2a_seconds_per_token(size) for size in set(sizes)}
    cheapest = min(a2a.values())
    # what aggregate_bound already charged this sample's tokens beyond compute
    charged_sparse = sparse_a2a_floor(problem, length, sizes)
    options = []
    for size in fitting:
        sparse_a2a = a2a[size]
        child_a2a = cheapest_child_a2a(problem, length, size) if repack else None
        if child_a2a is not None:
            sparse_a2a = min(sparse_a2a, child_a2a)
        extra = length * (
            cost.full_layers * (a2a[size] - cheapest)
            + cost.sparse_layers * (sparse_a2a - charged_sparse)
        )
        alone = parent_bound(problem, size, [longest], repack)
        options.append(max(alone, aggregate + extra / cost.world_size))
    return max(
        aggregate,
        min(options),
        pigeonhole_bound(problem, sizes, repack),
        memory_bound(problem, sizes, repack),
    )


def memory_bound(problem: Problem, sizes: Sequence[int], repack: bool) -> float:
    """Bound from memory: whatever parent of size ``P`` (among ``sizes``, which tile the
    cluster) holds the longest sample, the other ranks hold at most ``(W - P) * cap`` tokens,
    so that parent also holds ``R = total - L - (W - P) * cap`` tokens of other samples. The
    cheapest such filler is the shortest samples (attention per token grows with length, once
    the per-sample overheads are left out), taken fractionally; the parent's time is bounded
    as in ``parent_bound`` with the filler's sums. Loaders that pack every rank to its
    budget make ``R`` large: this is what bounds the memory-tight steps, where the balance
    bounds assume room that is not there."""
    cost = problem.cost
    longest = max(range(problem.num_samples), key=lambda s: (problem.tokens[s], -s))
    length = problem.tokens[longest]
    total = sum(problem.tokens)
    shortest = sorted(
        (s for s in range(problem.num_samples) if s != longest),
        key=lambda s: (problem.tokens[s], s),
    )
    attention_full, attention_sparse = (
        problem.costs.full_attention_s,
        problem.costs.sparse_attention_s,
    )
    lin = cost.linear_seconds_per_token
    best = float("inf")
    for size in sorted(set(sizes)):
        if problem.capacity(size) < length:
            continue
        need = total - length - (cost.world_size - size) * cost.max_tokens_per_rank
        full, sparse, work, tokens = (
            problem.full_s[longest],
            problem.sparse_s[longest],
            problem.work_s[longest],
            length,
        )
        for s in shortest:  # fillers without their per-sample overheads (node_memory_bound)
            if need <= 0:
                break
            share = min(1.0, need / problem.tokens[s])
            filler_sparse = float(attention_sparse[s])
            full += share * float(attention_full[s])
            sparse += share * filler_sparse
            work += share * (filler_sparse + problem.tokens[s] * lin)
            tokens += min(need, problem.tokens[s])
            need -= problem.tokens[s]
        whole = unrepacked_parent_seconds(cost, size, full, sparse, tokens)
        option = whole
        single = single_sample_bound(problem, longest, size)
        if repack and single < float("inf"):
            m = max(ceil_div(tokens, size), ceil_div(length, min(size, cost.gpus_per_node)))
            repacked = cost.full_layers * full_layer_seconds(cost, size, full, m)
            repacked += cost.sparse_layers * max(work / size, single)
            option = min(whole, repacked)
        best = min(best, option)
    return 0.0 if best == float("inf") else best


PIGEONHOLE_DEPTH = 3
"""Rounds of the pigeonhole bound: among the t*J + 1 longest samples, some parent holds t + 1."""


def pigeonhole_bound(problem: Problem, sizes: Sequence[int], repack: bool) -> float:
    """For J parents of one size: among the ``t * J + 1`` longest samples some parent holds
    ``t + 1`` of them, so it is at least as slow as the ``t + 1`` shortest of those together
    (a parent's bound only grows with its members). 0 when the sizes differ, or when they are
    a menu of allowed sizes rather than the parents tiling the cluster."""
    if len(set(sizes)) != 1 or sum(sizes) != problem.cost.world_size:
        return 0.0
    size, parents = sizes[0], len(sizes)
    by_length = sorted(range(problem.num_samples), key=lambda s: (-problem.tokens[s], s))
    best = 0.0
    for t in range(1, PIGEONHOLE_DEPTH + 1):
        top = t * parents + 1
        if top > len(by_length):
            break
        group = by_length[top - t - 1 : top]
        if sum(problem.tokens[s] for s in group) > problem.capacity(size):
            continue  # such a parent cannot exist; memory already rules it out
        best = max(best, parent_bound(problem, size, group, repack))
    return best


def sizes_bound(problem: Problem, sizes: Sequence[int]) -> float:
    """True for every layout of the parents ``sizes``, any membership, repacked or not (mode
    ``repack+parent``'s model): the node-level memory and split bounds, and the memory every
    parent of the tiling must hold (``tiling_memory_bound``). ``repack+sizing`` prunes
    its ``repack+parent`` candidate with it."""
    return max(
        node_memory_free_bound(problem, sizes, repack=True),
        split_bound(problem, sizes, repack=True, tiling=True),
        tiling_memory_bound(problem, sizes),
    )


def fixed_membership_bound(
    problem: Problem, sizes: Sequence[int], members: Sequence[Sequence[int]]
) -> float:
    """True for every layout of the membership ``members`` of ``sizes`` (mode ``repack``'s
    model), children and unrepacked parents alike: the node-level memory bound of each parent.
    On packed steps it sits well above the per-parent bounds the child search works with (a
    32-GPU step: 4,916 -> 5,126 ms, a layout of that membership 5,168 ms), which lets the
    planner skip searches whose answer cannot matter."""
    return max(
        (
            node_memory_parent_bound(problem, size, group, repack=True)
            for size, group in zip(sizes, members, strict=True)
        ),
        default=0.0,
    )


def collectives_floor(problem: Problem, sizes: Sequence[int], any_tiling: bool = False) -> float:
    """Every parent pays its full layers' fixed time (collective latency, per-layer overhead)
    whatever it holds, an empty one too; with a latency of 100 ms per peer an empty parent is
    the critical one, and the other bounds, all about samples, reported a gap of 100% on an
    optimal plan. ``any_tiling``: the parents' sizes are any of ``sizes`` (the cheapest)."""
    cost = problem.cost
    fixed = [cost.layer_fixed_seconds(size) for size in sizes]
    return cost.full_layers * ((min if any_tiling else max)(fixed, default=0.0))


def reported_bound(
    problem: Problem,
    mode: str,
    sizes: Sequence[int],
    members: Sequence[Sequence[int]],
    allowed: Sequence[int],
) -> float:
    """A bound for the model ``mode`` solves, added to what the search proved on its way:
    the node-level memory bounds (``node_memory_bound``), which the search does not use (its
    decisions, and so the plans, stay as they were). ``repack``: the upstream membership
    ``members`` of ``sizes``; ``repack+parent``: any membership of ``sizes``, with the
    memory every parent of the tiling must hold (``tiling_memory_bound``) and the
    child-level shared-slack bound of those sizes alone on memory-tight steps; the sizing
    modes: any tiling from ``allowed`` (and the upstream ``sizes``), with the shared-slack bound
    (``slack_bound``) for ``sizing``, whose parents are all unrepacked, and its child-level
    version (``repacked_slack_bound``) for ``repack+sizing`` where the step is memory-tight
    (elsewhere the slack covers every long sample and it costs ~10 ms for nothing). 0 for
    ``baseline``."""
    menu = sorted(set(allowed) | set(sizes))
    if mode == "repack":
        return max(
            fixed_membership_bound(problem, sizes, members), collectives_floor(problem, sizes)
        )
    if mode == "repack+parent":
        return max(
            collectives_floor(problem, sizes),
            sizes_bound(problem, sizes),
            repacked_slack_bound(problem, sorted(set(sizes)))
            if problem.fill >= TIGHT_FILL
            else 0.0,
        )
    if mode == "sizing":
        return max(
            collectives_floor(problem, menu, any_tiling=True),
            node_memory_free_bound(problem, menu, repack=False),
            split_bound(problem, menu, repack=False, tiling=False),
            slack_bound(problem, menu),
        )
    if mode == "repack+sizing":
        return max(
            collectives_floor(problem, menu, any_tiling=True),
            node_memory_free_bound(problem, menu, repack=True),
            split_bound(problem, menu, repack=True, tiling=False),
            repacked_slack_bound(problem, menu) if problem.fill >= TIGHT_FILL else 0.0,
        )
    return 0.0
