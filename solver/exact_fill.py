"""Bins filled to the token: samples into bins of fixed memory when there is almost no slack.

A loader that packs every rank to 99.99% of ``max_tokens_per_rank`` leaves a few dozen tokens
of slack in a 32-rank parent. Repacking that parent into node-local children first needs its
samples split over its nodes with every node within ``G * max_tokens_per_rank``: a bin-packing
problem where the bins must be filled to the token. Greedy packings (LPT by work, first fit
decreasing) leave a sample with nowhere to go and the parent then stays unrepacked, whose
sparse layers pay the cross-node all-to-all (on a 64-GPU step with two such 32-rank parents
the unrepacked layout was 46% slower than the node-local one).

Exact fills are easy with many short samples: the greedy places the long samples (by work,
least loaded bin with room), and the shortest samples, a reserve of ``RESERVE_SHARE`` of the
tokens, then fill each bin's room as exactly as a subset sum allows (a bitset over the room's
token counts, one shift per sample), the last bin taking what is left. Pure and deterministic;
None when no fill is found (the caller keeps its other layouts).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from solver.problem import Problem

RESERVE_SHARE = 0.15
"""Tokens held back from the greedy, shortest samples first, for the subset sums: with many
short samples every room is reachable to the token."""


EXACT_ROOM = 1 << 14
"""Tokens of a bin's room filled by the exact subset sum; more room is first filled greedily,
longest sample first, so that the bitsets stay small (~2 KB a state)."""


def subset_fill(lengths: Sequence[int], room: int) -> list[int]:
    """Indices of a subset of ``lengths`` whose sum is at most ``room`` and, within the last
    ``EXACT_ROOM`` tokens, the largest such sum.

    Lengths are taken longest first while at least ``EXACT_ROOM`` tokens of room stay free;
    the rest is an exact subset sum over the lengths left: bit ``t`` of the state after ``i``
    of them says whether some subset of those ``i`` sums to ``t``, and the subset is read back
    from the states, last length first."""
    chosen: list[int] = []
    rest: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        if room - lengths[i] >= EXACT_ROOM:
            chosen.append(i)
            room -= lengths[i]
        else:
            rest.append(i)
    if room <= 0 or not rest:
        return sorted(chosen)
    mask = (1 << (room + 1)) - 1
    states = [1]
    for i in rest:
        states.append((states[-1] | (states[-1] << lengths[i])) & mask)
    target = states[-1].bit_length() - 1
    for k in range(len(rest) - 1, -1, -1):
        if not (states[k] >> target) & 1:  # unreachable without this length: it is in
            chosen.append(rest[k])
            target -= lengths[rest[k]]
    return sorted(chosen)


def fill_bins(
    problem: Problem,
    members: Sequence[int],
    capacities: Sequence[int],
    weights: Sequence[float],
) -> list[list[int]] | None:
    """``members`` into bins of ``capacities`` tokens, every bin within its memory.

    The members outside the reserve go, heaviest first (``Problem.heavy_rank``), to the bin of
    least ``load / weight`` with room (``weight``: a bin's ranks, so that loads are per rank);
    the reserve then fills the bins' rooms, tightest room first, by subset sums. None when a
    member of the greedy part finds no room or the reserve does not fit the rooms left."""
    tokens = problem.tokens
    bins = len(capacities)
    if bins == 0:
        return None
    total = sum(tokens[s] for s in members)
    if total > sum(capacities):
        return None
    shortest = sorted(members, key=lambda s: (tokens[s], s))
    reserve: list[int] = []
    held = 0
    for s in shortest:
        if held >= RESERVE_SHARE * total:
            break
        reserve.append(s)
        held += tokens[s]
    kept = set(reserve)
    work = problem.work_s
    room = list(capacities)
    out: list[list[int]] = [[] for _ in range(bins)]
    heap = [(0.0, b) for b in range(bins)]  # (load per weight, bin), least loaded first
    for s in sorted((s for s in members if s not in kept), key=problem.heavy_rank.__getitem__):
        n = tokens[s]
        full = []
        while heap and room[heap[0][1]] < n:
            full.append(heapq.heappop(heap))
        if not heap:
            return None
        per_weight, b = heap[0]
        out[b].append(s)
        room[b] -= n
        heapq.heapreplace(heap, (per_weight + work[s] / weights[b], b))
        for item in full:
            heapq.heappush(heap, item)
    left = sorted(reserve, key=lambda s: (-tokens[s], s))
    order = sorted(range(bins), key=lambda b: (room[b], b))
    for b in order[:-1]:
        picked = set(subset_fill([tokens[s] for s in left], room[b]))
        out[b] += [s for i, s in enumerate(left) if i in picked]
        room[b] -= sum(tokens[s] for i, s in enumerate(left) if i in picked)
        left = [s for i, s in enumerate(left) if i not in picked]
    last = order[-1]
    if sum(tokens[s] for s in left) > room[last]:
        return None
    out[last] += left
    return out


def first_fit_decreasing(
    problem: Problem, members: Sequence[int], capacities: Sequence[int]
) -> list[list[int]] | None:
    """``members`` by decreasing length, each into the first bin (in the given order) with
    room for it; None when one finds none. Packs the lumpy steps the subset sums of
    ``fill_bins`` miss: few samples, each a large share of a bin (3 ranks of 6,000 tokens
    holding 3000 x 4 + 2000 x 3, where the reserve is one sample of 2000)."""
    room = list(capacities)
    out: list[list[int]] = [[] for _ in room]
    tokens = problem.tokens
    for s in sorted(members, key=lambda s: (-tokens[s], s)):
        n = tokens[s]
        b = next((b for b, free in enumerate(room) if free >= n), None)
        if b is None:
            return None
        room[b] -= n
        out[b].append(s)
    return out
