"""Node-level packing of one parent: samples onto its nodes first, then one child size per node.

Real data loaders fill every rank to its token budget, so a parent often holds 99.9% of
``P * max_tokens_per_rank``. A child of ``k`` ranks holds at most ``k * max_tokens_per_rank``
tokens and never leaves its node, so repacking such a parent is a bin-packing problem at node
level before it is a balancing problem: the child packer's heaviest-first greedy, which opens
small children first, runs out of memory on it. This module packs *segments* first (the
parent's nodes, or its two halves when the parent fits in a node), by work (LPT, least loaded
segment with room) or, if memory is too tight for that, by tokens (first fit decreasing), then
picks for every segment the uniform child size whose LPT packing (or, where LPT runs out of
memory, a fill to the token: ``packed_children``) is fastest.

``segments_fit`` is the same test as a yes/no answer: the membership stage uses it to know
when a parent cannot be repacked and samples must move to another parent to make room.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import cast

from solver.bin_completion import complete_bins
from solver.cost_model import ceil_div, child_layer_seconds, full_layer_seconds
from solver.exact_fill import fill_bins, first_fit_decreasing
from solver.layout import Child, Parent
from solver.problem import Problem

NODE_WORK_LIMIT = 1 << 27
"""``bin_completion``'s work cap (sample-bits) for a parent's nodes filled to the token: node
packings run many times per request, so a search that fails must fail in a few tens of
milliseconds. A node of 8 x 32,768 tokens and ~60 samples takes ~16M sample-bits a node, so
2^24 only sufficed for 16-rank parents (two 32-rank parents full to the token stayed
unrepacked at 1.000x on 4 of 6 steps). (Children are not filled this way: more
exactly-full child options left the LNS stuck in them, `repack+parent` up to 3.5% slower on
single steps of a truncating loader's trace.)"""


def segment_size(problem: Problem, size: int) -> int:
    """Ranks of one segment: a node of a parent wider than a node, else half the parent (a
    child as wide as the parent is the unrepacked layout, so it does not count)."""
    g = problem.cost.gpus_per_node
    return g if size > g else max(size // 2, 1)


def _first_fit_decreasing(
    problem: Problem, members: Sequence[int], bins: int, capacity: int
) -> list[list[int]] | None:
    """Members by decreasing length into ``bins`` bins of ``capacity`` tokens (first fit)."""
    return first_fit_decreasing(problem, members, [capacity] * bins)


def lpt_bins(
    problem: Problem,
    members: Sequence[int],
    bins: int,
    ranks: int,
    capacity: int,
    *,
    ordered: bool = False,
) -> tuple[list[list[int]], list[int], list[float]] | None:
    """Members by decreasing work, each to the least loaded bin with room (LPT); bins of
    ``ranks`` ranks with ``capacity`` tokens. ``(groups, tokens, sparse seconds)`` per bin, or
    None when a member finds no room. ``ordered``: ``members`` are in ``heavy_rank`` order
    already."""
    work, tokens, sparse = problem.work_s, problem.tokens, problem.sparse_s
    heap = [(0.0, b) for b in range(bins)]
    room = [capacity] * bins
    sparse_sum = [0.0] * bins
    out: list[list[int]] = [[] for _ in range(bins)]
    for s in members if ordered else sorted(members, key=problem.heavy_rank.__getitem__):
        n = tokens[s]
        if bins == 1:
            if room[0] < n:
                return None
            room[0] -= n
            out[0].append(s)
            sparse_sum[0] += sparse[s]
            continue
        skipped = []
        while heap and room[heap[0][1]] < n:
            skipped.append(heapq.heappop(heap))
        if not heap:
            return None
        load, b = heap[0]
        room[b] -= n
        out[b].append(s)
        sparse_sum[b] += sparse[s]
        heapq.heapreplace(heap, (load + work[s] / ranks, b))
        for item in skipped:
            heapq.heappush(heap, item)
    return out, [capacity - r for r in room], sparse_sum


def packed_children(
    problem: Problem, members: Sequence[int], bins: int, ranks: int, *, ordered: bool = False
) -> tuple[list[list[int]], list[int], list[float]] | None:
    """``lpt_bins`` onto ``bins`` children of ``ranks`` ranks; where LPT runs out of memory,
    the children filled to the token by subset sums (``exact_fill.fill_bins``). A loader fills
    its ranks to 99.9% and more: LPT by work then fails for every child narrower than the
    segment, which ran as one child at the widest size's all-to-all (a 4-rank parent of a
    packed 64-GPU step: one child of 4, 82.8 ms a sparse layer; four children of 1 filled to
    the token, 77 ms). Memoised per request (``Problem.packings``; on packed 1,024-GPU steps
    35-43% of the calls repeat one, each costing a fill): callers must not modify the result."""
    key = (tuple(members), ordered, bins, ranks)
    cache = problem.packings
    if key not in cache:
        cache[key] = _packed_children(problem, members, bins, ranks, ordered)
    return cast("Packed | None", cache[key])


Packed = tuple[list[list[int]], list[int], list[float]]
"""Per child: its members, tokens and sparse seconds."""


def _packed_children(
    problem: Problem, members: Sequence[int], bins: int, ranks: int, ordered: bool
) -> Packed | None:
    capacity = problem.capacity(ranks)
    packed = lpt_bins(problem, members, bins, ranks, capacity, ordered=ordered)
    if packed is not None or bins == 1:
        return packed
    tokens = problem.tokens
    if any(tokens[s] > capacity for s in members):
        return None  # a sample longer than a child (LPT's usual failure below 90% fill)
    groups = fill_bins(problem, members, [capacity] * bins, [ranks] * bins)
    if groups is None:
        return None
    held = [sum(tokens[s] for s in g) for g in groups]
    sparse = [sum(problem.sparse_s[s] for s in g) for g in groups]
    return groups, held, sparse


def segments_fit(problem: Problem, size: int, members: Sequence[int]) -> bool:
    """Whether some node-local repacked layout holds ``members`` within memory (first fit
    decreasing onto segments; a sufficient test, exact in the common case)."""
    seg = segment_size(problem, size)
    if seg == size:
        return False  # a 1-rank parent cannot be repacked
    cap = problem.capacity(seg)
    total = sum(problem.tokens[s] for s in members)
    bins = size // seg
    longest = max((problem.tokens[s] for s in members), default=0)
    if longest > cap:
        return False
    if total <= bins * cap - (bins - 1) * longest:
        return True  # first fit cannot fail: a failing item would find every bin fuller
    return _first_fit_decreasing(problem, members, bins, cap) is not None


def unplaced_tokens(problem: Problem, size: int, members: Sequence[int]) -> int:
    """Tokens that first fit decreasing leaves without a segment (0 when the members fit)."""
    seg = segment_size(problem, size)
    room = [problem.capacity(seg)] * (size // seg)
    left = 0
    for s in sorted(members, key=lambda s: (-problem.tokens[s], s)):
        n = problem.tokens[s]
        b = next((b for b in range(len(room)) if room[b] >= n), None)
        if b is None:
            left += n
        else:
            room[b] -= n
    return left


def children_of_segment(
    problem: Problem,
    start: int,
    seg: int,
    members: list[int],
    parent_size: int,
    busiest_floor: int = 0,
) -> tuple[list[Child], float, int] | None:
    """Fastest uniform child size for one segment: ``(children, sparse-layer time, busiest
    rank's tokens)``; the proxy weighs time and tokens as the parent's step does.

    ``busiest_floor``: tokens the parent's busiest rank holds whatever this segment does (its
    tokens over its ranks, rounded up). The full layers wait for the parent's busiest rank, so
    a segment's busiest rank below that floor saves nothing: a memory-tight 32-rank parent
    gave the node holding its longest sample one child of 4 (a busiest rank 1% lower than
    two children of 2, the other nodes' full ranks set the parent's anyway) for 3% slower
    sparse layers, and the moves then balanced against that node (0.27% behind the tests'
    reference heuristic)."""
    cost = problem.cost
    full_tok = cost.full_layers * (
        cost.linear_seconds_per_token + cost.a2a_seconds_per_token(parent_size)
    )
    best: tuple[float, list[Child], float, int] | None = None
    order = sorted(members, key=problem.heavy_rank.__getitem__)  # once for every size
    bounds = _SegmentBounds(problem, order)
    for k in problem.child_sizes:
        if k > seg:
            break
        if best is not None and bounds.score(k, seg, full_tok, busiest_floor) > best[0] * SLACK:
            continue  # cannot win (nor tie): its packing is not worth computing
        packed = packed_children(problem, order, seg // k, k, ordered=True)
        if packed is None:
            continue
        groups, tokens, sparse = packed
        z = max(
            child_layer_seconds(cost, k, sp, tok) for sp, tok in zip(sparse, tokens, strict=True)
        )
        m = ceil_div(max(tokens), k)
        score = cost.sparse_layers * z + max(m, busiest_floor) * full_tok
        if best is None or score < best[0]:
            kids = [Child(start + i * k, k, tuple(g)) for i, g in enumerate(groups)]
            best = (score, kids, z, m)
    return None if best is None else (best[1], best[2], best[3])


SLACK = 1.0 + 1e-9
"""A size is skipped only when its lower bound beats the best score by more than rounding: the
bound sums the same terms in another order, so ties (kept first-found) are never pruned."""


class _SegmentBounds:
    """Lower bounds on ``children_of_segment``'s score of a child size, from the segment's
    totals and its heaviest samples alone: a packed step's segments try four sizes, each an
    LPT (or a fill to the token), and the bound rules most of them out for a few additions.

    Any packing of ``seg // k`` children of ``k`` ranks has a child at least as busy as the
    average child (sparse seconds and tokens over the segment's ranks) and a child holding
    the heaviest (and the longest) sample; its busiest rank holds at least the segment's
    tokens over its ranks and the longest sample's share of ``k``."""

    def __init__(self, problem: Problem, order: Sequence[int]) -> None:
        tokens, sparse = problem.tokens, problem.sparse_s
        self.cost = problem.cost
        self.tokens = sum(tokens[s] for s in order)
        self.sparse = sum(sparse[s] for s in order)
        self.heaviest = (sparse[order[0]], tokens[order[0]]) if order else (0.0, 0)
        longest = max(order, key=tokens.__getitem__) if order else None
        self.longest = (sparse[longest], tokens[longest]) if longest is not None else (0.0, 0)

    def score(self, k: int, seg: int, full_tok: float, busiest_floor: int) -> float:
        if self.tokens == 0:
            return 0.0
        cost = self.cost
        per_token = cost.token_seconds(k)
        z = (self.sparse + self.tokens * per_token) / seg + cost.layer_fixed_seconds(k)
        for sp, tok in (self.heaviest, self.longest):
            z = max(z, child_layer_seconds(cost, k, sp, tok))
        m = max(ceil_div(self.tokens, seg), ceil_div(self.longest[1], k), busiest_floor)
        return cost.sparse_layers * z + m * full_tok


def pack_by_nodes(
    problem: Problem, start: int, size: int, members: Sequence[int]
) -> tuple[Parent, float] | None:
    """The faster of the work-balanced and the token-first node packings of a parent, with
    its time; None when neither fits in memory."""
    seg = min(size, problem.cost.gpus_per_node)  # one bin per node, or the whole parent
    if size == 1 or not members:
        return None
    bins, cap = size // seg, problem.capacity(seg)
    best: tuple[Parent, float] | None = None
    by_work = lpt_bins(problem, members, bins, seg, cap)
    for assign in (
        by_work[0] if by_work is not None else None,
        _first_fit_decreasing(problem, members, bins, cap),
    ):
        if assign is None:
            continue
        parent = _parent_from_segments(problem, start, size, seg, assign)
        if parent is not None and (best is None or parent[1] < best[1]):
            best = parent
    if best is None:  # full to the token: nodes filled by subset sums (``exact_fill``)
        filled = fill_bins(problem, members, [cap] * bins, [seg] * bins)
        if filled is None:  # a few samples per node (``bin_completion``)
            filled = complete_bins(problem, members, [cap] * bins, work_limit=NODE_WORK_LIMIT)
        if filled is not None:
            best = _parent_from_segments(problem, start, size, seg, filled)
    return best


def _parent_from_segments(
    problem: Problem, start: int, size: int, seg: int, assign: list[list[int]]
) -> tuple[Parent, float] | None:
    cost = problem.cost
    children: list[Child] = []
    z, m = 0.0, 0
    floor = ceil_div(sum(problem.tokens[s] for g in assign for s in g), size)
    for b, group in enumerate(assign):
        made = children_of_segment(problem, start + b * seg, seg, group, size, floor)
        if made is None:
            return None
        kids, zb, mb = made
        children += kids
        z, m = max(z, zb), max(m, mb)
    full_s = sum(problem.full_s[s] for g in assign for s in g)
    seconds = cost.full_layers * full_layer_seconds(cost, size, full_s, m) + cost.sparse_layers * z
    return Parent(start, size, tuple(children)), seconds
