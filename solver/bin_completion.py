"""Bins filled to the token by bin completion: a depth-first search over exact fills.

A loader that packs every rank to its exact token budget (cutting the last document to fit, as
packed loaders do) and sends ``parent_sizes`` without ``parent_of``, or no sizes at all, leaves
no free token anywhere: a membership must partition the samples into the parents' memory
exactly. The greedy fills of ``exact_fill`` strand a sample when each parent holds only a few
(one-rank parents of long documents), and CP-SAT's propagation is weak on equality knapsacks
(a 6-bin, 34-sample exact partition stays unsolved at its work limit). Refusing such a step
would tell the caller to shrink a batch that fits. The same holds one level down: a parent
full to the token whose nodes no greedy fill can split stays unrepacked
(``node_packing.pack_by_nodes`` uses this search too, at a smaller work cap).

Bin completion (after Korf's bin-completion search): bins in order of capacity; each takes the
longest sample left and then a *completion*, a subset of the others that fills it to within the
slack still unassigned, longest samples first (the short ones stay behind as filler for the
bins after it). Completions come from suffix reachability bitsets (bit ``t`` of ``reach[i]``:
some subset of the samples from ``i`` on sums to ``t``), at most ``BRANCH`` per bin, and the
search backtracks depth first. Its work is counted in sample-bits of those bitsets and capped
(``WORK_LIMIT``), so the answer depends only on the request; the request's clock is the safety
net, checked between bins.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence

from solver.budget import Budget
from solver.problem import Problem

BRANCH = 8
"""Completions tried per bin, fullest and longest-first; more rarely helps, it multiplies the
search below a wrong choice."""

WORK_LIMIT = 1 << 32
"""Sample-bits of reachability bitsets the search may build (~0.5 s of CPU on the 2-core
development machine); past it the search gives up (the caller's next fallback decides)."""

FRAME_WORK = 1 << 16
"""Work charged for each bin filled, besides its bitsets: the Python of one frame (~8 us with
50 samples) is worth ~2^16 sample-bits at ``WORK_LIMIT``'s rate. Without it, bins of a few
tokens (bitsets of a few bits) made the limit ~3e7 frames, minutes of CPU: 50 samples of 4
tokens into ranks of 7, searched before the count bound proves it hopeless."""

MAX_BITSET = 1 << 27
"""Largest ``samples x (room + 1)`` bitset table of one bin; bins with more room are filled
by the greedy packings (many samples, so they do not strand one)."""


def _completions(
    tokens: Sequence[int], items: Sequence[int], low: int, high: int, limit: int
) -> list[list[int]]:
    """Up to ``limit`` subsets of ``items`` (by decreasing length) summing to a value in
    ``[low, high]``, fullest sum first and, per sum, longer samples first."""
    n = len(items)
    mask = (1 << (high + 1)) - 1
    reach = [0] * (n + 1)
    reach[n] = 1
    for i in range(n - 1, -1, -1):
        reach[i] = (reach[i + 1] | (reach[i + 1] << tokens[items[i]])) & mask
    found: list[list[int]] = []
    for target in range(high, low - 1, -1):
        if not (reach[0] >> target) & 1:
            continue
        # Depth-first over (position, sum left), "take" before "skip"; every branch taken is
        # completable by the reachability test, so each leaf is a completion.
        stack: list[tuple[int, int, int]] = [(0, target, 0)]  # (position, sum left, depth)
        chosen: list[int] = []
        while stack and len(found) < limit:
            i, left, depth = stack.pop()
            del chosen[depth:]
            if left == 0:
                found.append(list(chosen))
                continue
            length = tokens[items[i]]
            if (reach[i + 1] >> left) & 1:
                stack.append((i + 1, left, depth))
            if length <= left and (reach[i + 1] >> (left - length)) & 1:
                chosen.append(items[i])
                stack.append((i + 1, left - length, depth + 1))
        if len(found) >= limit:
            break
    return found


def _greedy_prefix(
    tokens: Sequence[int], items: Sequence[int], cap: int
) -> tuple[list[int], list[int], int]:
    """The longest sample left, and more of the longest ones while the bitsets of the room
    left would exceed ``MAX_BITSET`` (a roomy bin of many samples: its last tokens are what
    needs the exact fill); returns the samples fixed, the others and the room left."""
    fixed = [items[0]]
    room = cap - tokens[items[0]]
    others = list(items[1:])
    if room < 0 or len(others) * (room + 1) <= MAX_BITSET:
        return fixed, others, room
    keep = MAX_BITSET // len(others)  # room the exact part keeps
    rest: list[int] = []
    for s in others:
        if room - tokens[s] >= keep and len(others) * (room + 1) > MAX_BITSET:
            fixed.append(s)
            room -= tokens[s]
        else:
            rest.append(s)
    return fixed, rest, room if len(rest) * (room + 1) <= MAX_BITSET else -1


def too_many_samples(
    tokens: Sequence[int], members: Sequence[int], capacities: Sequence[int]
) -> bool:
    """True when no packing exists, by bounds that need no search: the token total fits but

    - the count does not: a bin of ``c`` tokens holds at most as many samples as the shortest
      ones that fit in ``c`` (50 samples of 4 tokens into 32 one-rank parents of 7 tokens hold
      32 at most), or
    - with equal bins, Martello and Toth's L2 bound exceeds them (40 samples of 4 tokens and 10
      of 3 into 32 bins of 7: no two of the 4s share a bin).

    The searches would only find that out by exhausting their work limits."""
    lengths = sorted(tokens[s] for s in members)
    prefix = list(itertools.accumulate(lengths))
    if sum(bisect.bisect_right(prefix, cap) for cap in capacities) < len(lengths):
        return True
    return len(set(capacities)) == 1 and bins_needed(lengths, capacities[0]) > len(capacities)


def bins_needed(lengths: Sequence[int], cap: int) -> int:
    """Martello and Toth's L2 lower bound on the bins of ``cap`` that ``lengths`` need: for
    each threshold ``a <= cap / 2``, samples above ``cap - a`` take a bin each, those in
    ``(cap / 2, cap - a]`` too, and the ones in ``[a, cap / 2]`` fill what the latter leave
    before opening bins of their own."""
    if not lengths or max(lengths) > cap:
        return len(lengths) + 1 if lengths else 0
    ordered = sorted(lengths)
    total = [0, *itertools.accumulate(ordered)]
    n = len(ordered)
    h = bisect.bisect_right(ordered, cap // 2)  # ordered[h:] are longer than half a bin
    best = max(-(-total[n] // cap), n - h)
    for i in range(h):
        if i and ordered[i] == ordered[i - 1]:
            continue
        a = ordered[i]
        m = bisect.bisect_right(ordered, cap - a)  # ordered[h:m] fit beside an ``a``
        spare = (m - h) * cap - (total[m] - total[h])
        small = total[h] - total[i]
        best = max(best, (n - m) + (m - h) + max(0, -(-(small - spare) // cap)))
    return best


def complete_bins(
    problem: Problem,
    members: Sequence[int],
    capacities: Sequence[int],
    clock: Budget | None = None,
    work_limit: int = WORK_LIMIT,
) -> list[list[int]] | None:
    """``members`` into bins of ``capacities`` tokens (bins in the given order), every bin
    within its memory; None when the search finds no packing within ``work_limit``
    sample-bits (or the clock, which it then marks as fired). Deterministic: sorted orders,
    index tie-breaks."""
    tokens = problem.tokens
    bins = len(capacities)
    slack = sum(capacities) - sum(tokens[s] for s in members)
    if bins == 0 or slack < 0:
        return None
    order = sorted(range(bins), key=lambda b: (capacities[b], b))
    work = 0
    out: list[list[int]] = [[] for _ in range(bins)]
    # One frame per bin filled so far: the samples left before it, the slack left before it,
    # and its untried completions (as whole bins' contents).
    items = sorted(members, key=lambda s: (-tokens[s], s))
    frames: list[tuple[list[int], int, list[list[int]]]] = []
    while True:
        k = len(frames)
        if k == bins - 1 or not items:  # the last bin takes the rest (or nothing is left)
            rest = sum(tokens[s] for s in items)
            if k < bins and rest <= capacities[order[k]]:
                for j in range(k, bins):
                    out[order[j]] = []
                if k < bins:
                    out[order[k]] = list(items)
                return out
            options: list[list[int]] = []
        else:
            cap = capacities[order[k]]
            fixed, others, room = _greedy_prefix(tokens, items, cap)
            options = []
            work += FRAME_WORK
            if room >= 0:
                work += len(others) * (room + 1)
                options = [
                    [*fixed, *sub]
                    for sub in _completions(tokens, others, max(0, room - slack), room, BRANCH)
                ]
            frames.append((items, slack, options))
        # Take the next untried completion, backtracking through exhausted frames.
        while True:
            if not frames or work > work_limit or (clock is not None and clock.expired()):
                return None
            before, slack_before, untried = frames[-1]
            if untried:
                chosen = untried.pop(0)
                k = len(frames) - 1
                out[order[k]] = chosen
                taken = set(chosen)
                items = [s for s in before if s not in taken]
                slack = slack_before - (capacities[order[k]] - sum(tokens[s] for s in chosen))
                break
            frames.pop()
