"""Sample swaps between children of a finished layout: the finish of memory-tight steps.

When a loader packed every rank to its token budget, no child has room for one more sample,
so the single-sample moves of the membership search and the node stage stop while the
critical parent is still uneven. Exchanging one of its heavy samples for a lighter one of
about the same length elsewhere keeps every child within memory and still balances (on four
packed 16-rank parents of 64 GPUs it closed the 0.1-0.8% by which those stages trailed the
tests' reference heuristic). Each step takes the first swap (or move, where a child has room)
that brings the critical parent under the step time without putting the receiving parent at
or above it; parent times are updated from per-child sums, never re-evaluated whole. Only
children are exchanged, so parents keep their sizes and children their ranks. An unrepacked
parent is one child as wide as the parent and trades samples like any other: until
2026-12-03 those wider than a rank were left out, and a critical parent holding the longest
sample unrepacked ended the search 0.15% behind the reference (16 GPUs, eight 2-rank parents,
``tests/solver/data/flat-16gpu-111.json``).

When no exchange lowers the critical parent, plateau moves inside it (``_Swaps._flatten``)
trade a sample of its slowest or busiest child for nothing, one shorter sample or a set of
short ones of about its length, keeping the parent's time and lowering a balance potential,
until an improving exchange appears again (since 2026-12-03: several children level at the
top, every rank at the same tokens, is where a long-with-long packing stops).
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass

from solver.budget import Budget, WorkPool
from solver.cost_model import ceil_div, child_layer_seconds
from solver.critical import first_max
from solver.layout import Child, Layout, Parent
from solver.node_membership import TIGHT_FILL
from solver.problem import Problem

SWAP_WORK = 6000
"""Deterministic work per request at the full work budget (``Budget.evals``), in children
looked at and swaps evaluated (a few microseconds each)."""
SWAP_WORLD = 64
"""Ranks of a request that ``SWAP_WORK`` is sized for; a larger memory-tight one gets its share
of more (up to ``MAX_SWAP_SCALE`` times): above 256 ranks the LNS does not run, so the swaps are
the only search after the greedy stages, and a packed step needs more of them (512 GPUs,
packed, 8-rank parents: 4109.7 / 4095.7 / 4072.8 ms at 1x / 2x / 8x, the stage 12 / 19 / 61
ms)."""
MAX_SWAP_SCALE = 8
"""Only for memory-tight steps (``node_membership.TIGHT_FILL``). Below that fill children have
room, the greedy stages balance them, and the swaps' extra work buys nothing: on ``repack
bench``'s 60%-fill 512- and 1,024-GPU steps 8x instead of 1x changed step times by
0.002-0.011% (at most 0.04%) for up to 0.6 s of CPU per request at 1,024 GPUs, most of it
spent on swaps of 1e-6 of the step time each."""
SMALL_WORLD = 32
"""Requests of at most this many ranks get ``SMALL_SWAP_SCALE`` times ``SWAP_WORK``: they solve
in about half the time of the 64-GPU requests the latency target is set for, and on their
memory-tight steps the swaps gain in many small steps (two 16-rank parents of 32 GPUs, both
level at the top in children of one rank, 0.01-0.02% per swap): at 1x five hunted steps ended
0.11-0.17% behind the tests' reference heuristic, at 4x all five 0.02-0.25% ahead, for 40-80
ms more per request (0.13-0.30 s in all)."""
SMALL_SWAP_SCALE = 4
SOURCES = 2
"""Slowest children of the critical parent that give samples away."""
IMPROVEMENT = 1e-9
"""Relative drop of the critical parent a swap must reach (float noise is not a gain)."""


@dataclass
class _Kid:
    start: int
    size: int
    samples: list[int]
    sparse_s: float
    tokens: int
    per_token: float
    """``CostModel.token_seconds`` of the child's size (the terms of ``child_layer_seconds``,
    kept here: the trials below evaluate them millions of times per request)."""
    fixed: float
    """``CostModel.layer_fixed_seconds`` of the child's size."""

    def seconds(self, d_sparse: float = 0.0, d_tokens: int = 0) -> float:
        """``child_layer_seconds`` with the child's sums shifted (the same float operations,
        so the same bits)."""
        tokens = self.tokens + d_tokens
        if tokens == 0:
            return 0.0
        size = self.size
        sparse = (self.sparse_s + d_sparse) / size
        return sparse + ceil_div(tokens, size) * self.per_token + self.fixed


@dataclass
class _Par:
    start: int
    size: int
    kids: list[_Kid]
    full_s: float
    per_token: float
    """``CostModel.token_seconds`` of the parent's size (``full_layer_seconds``' terms)."""
    fixed: float


class _Swaps:
    def __init__(self, problem: Problem, layout: Layout, within: bool = False) -> None:
        self.p = problem
        self.within = within
        """Exchanges only between children of the critical parent (membership kept)."""
        self.pars: list[_Par] = []
        cost = problem.cost
        for parent in layout:
            kids = [
                _Kid(
                    c.start,
                    c.size,
                    list(c.samples),
                    sum(problem.sparse_s[s] for s in c.samples),
                    sum(problem.tokens[s] for s in c.samples),
                    cost.token_seconds(c.size),
                    cost.layer_fixed_seconds(c.size),
                )
                for c in parent.children
            ]
            full = sum(problem.full_s[s] for c in parent.children for s in c.samples)
            size = parent.size
            per_token, fixed = cost.token_seconds(size), cost.layer_fixed_seconds(size)
            self.pars.append(_Par(parent.start, size, kids, full, per_token, fixed))
        self.times = [0.0] * len(self.pars)
        self.cache: list[tuple[list[float], list[int], list[int], list[int]]] = [
            ([], [], [], []) for _ in self.pars
        ]
        self.receivers: list[tuple[float, int, int]] = []
        """Every child as ``(sparse-layer seconds, parent, index)``, ascending, kept sorted by
        ``_refresh`` as commits change two parents: re-sorting all children for every step
        was ~10% of the CPU of the slowest 1,024-GPU bench requests of `repack+sizing`."""
        for j in range(len(self.pars)):
            self._refresh(j)
        self.orders: dict[tuple[int, int], list[int]] = {}
        self.lengths: dict[tuple[int, int], tuple[list[int], list[int]]] = {}
        self.tries = 0

    def _refresh(self, j: int) -> None:
        """Parent ``j``'s time and, per child, its sparse-layer seconds and busiest rank, with
        the three largest of each (what a trial that changes two children needs)."""
        par = self.pars[j]
        secs = [k.seconds() for k in par.kids]
        old = self.cache[j][0]  # empty on the first refresh
        for i, sec in enumerate(secs):
            if i < len(old):
                if old[i] == sec:
                    continue
                del self.receivers[bisect.bisect_left(self.receivers, (old[i], j, i))]
            bisect.insort(self.receivers, (sec, j, i))
        busy = [ceil_div(k.tokens, k.size) for k in par.kids]
        order = range(len(par.kids))
        self.cache[j] = (
            secs,
            busy,
            sorted(order, key=lambda i: -secs[i])[:3],
            sorted(order, key=lambda i: -busy[i])[:3],
        )
        self.times[j] = self._time(j, {})

    def _ordered(self, j: int, i: int) -> list[int]:
        """Samples of child ``i`` of parent ``j``, heaviest first (kept until it changes)."""
        key = (j, i)
        if key not in self.orders:
            samples = self.pars[j].kids[i].samples
            self.orders[key] = sorted(samples, key=self.p.heavy_rank.__getitem__)
        return self.orders[key]

    def _by_tokens(self, j: int, i: int) -> tuple[list[int], list[int]]:
        """Samples of child ``i`` of parent ``j`` by length, and their lengths."""
        key = (j, i)
        if key not in self.lengths:
            samples = sorted(self.pars[j].kids[i].samples, key=lambda s: (self.p.tokens[s], s))
            self.lengths[key] = (samples, [self.p.tokens[s] for s in samples])
        return self.lengths[key]

    def _time(self, j: int, changes: dict[int, tuple[float, int]], d_full: float = 0.0) -> float:
        """Parent ``j``'s time with ``changes`` (child index -> sparse and token deltas of at
        most two children) and its full-layer sum shifted by ``d_full``."""
        cost, par = self.p.cost, self.pars[j]
        secs, busy, top_secs, top_busy = self.cache[j]
        sparse = 0.0
        for i in top_secs:
            if i not in changes:
                sparse = secs[i]
                break
        busiest = 0
        for i in top_busy:
            if i not in changes:
                busiest = busy[i]
                break
        kids = par.kids
        for i, (ds, dt) in changes.items():
            kid = kids[i]
            sec = kid.seconds(ds, dt)
            if sec > sparse:
                sparse = sec
            rank = ceil_div(kid.tokens + dt, kid.size)
            if rank > busiest:
                busiest = rank
        # ``full_layer_seconds``, its terms kept per parent (the same bits)
        full = (par.full_s + d_full) / par.size + busiest * par.per_token + par.fixed
        return cost.full_layers * full + cost.sparse_layers * sparse

    def _trial(self, c: int, ci: int, a: int, q: int, di: int, b: int | None) -> float:
        """The larger of the two parents' times with ``a`` (of child ``ci`` of ``c``) and
        ``b`` (of child ``di`` of ``q``, or nothing) exchanged."""
        p = self.p
        sa, ta = p.sparse_s[a], p.tokens[a]
        sb, tb = (0.0, 0) if b is None else (p.sparse_s[b], p.tokens[b])
        if q == c:
            return self._time(c, {ci: (sb - sa, tb - ta), di: (sa - sb, ta - tb)})
        fa, fb = p.full_s[a], 0.0 if b is None else p.full_s[b]
        here = self._time(c, {ci: (sb - sa, tb - ta)}, fb - fa)
        return max(here, self._time(q, {di: (sa - sb, ta - tb)}, fa - fb))

    def _side(self, j: int, i: int, out: int | None, into: int | None) -> float:
        """Parent ``j``'s time with ``out`` (or nothing) leaving its child ``i`` and ``into``
        (or nothing) joining it: one side of an exchange between two parents."""
        s_out, t_out, f_out = self._load(out)
        s_in, t_in, f_in = self._load(into)
        return self._time(j, {i: (s_in - s_out, t_in - t_out)}, f_in - f_out)

    def _load(self, sample: int | None) -> tuple[float, int, float]:
        p = self.p
        if sample is None:
            return 0.0, 0, 0.0
        return p.sparse_s[sample], p.tokens[sample], p.full_s[sample]

    def _commit(self, c: int, ci: int, a: int, q: int, di: int, b: int | None) -> None:
        p = self.p
        src, dst = self.pars[c].kids[ci], self.pars[q].kids[di]
        src.samples.remove(a)
        dst.samples.append(a)
        src.sparse_s -= p.sparse_s[a]
        dst.sparse_s += p.sparse_s[a]
        src.tokens -= p.tokens[a]
        dst.tokens += p.tokens[a]
        self.pars[c].full_s -= p.full_s[a]
        self.pars[q].full_s += p.full_s[a]
        if b is not None:
            dst.samples.remove(b)
            src.samples.append(b)
            dst.sparse_s -= p.sparse_s[b]
            src.sparse_s += p.sparse_s[b]
            dst.tokens -= p.tokens[b]
            src.tokens += p.tokens[b]
            self.pars[q].full_s -= p.full_s[b]
            self.pars[c].full_s += p.full_s[b]
        for key in ((c, ci), (q, di)):
            self.orders.pop(key, None)
            self.lengths.pop(key, None)
        self._refresh(c)
        self._refresh(q)

    def step(self, limit: int) -> bool:
        """The first improving swap out of the critical parent; False when none is found
        within ``limit`` tries."""
        p = self.p
        c = first_max(self.times)
        target = self.times[c] * (1 - IMPROVEMENT)
        kids = self.pars[c].kids
        secs = self.cache[c][0]
        sources = sorted(range(len(kids)), key=lambda i: (-secs[i], i))[:SOURCES]
        if self.within:
            receivers = sorted((secs[i], c, i) for i in range(len(kids)))
        else:
            receivers = list(self.receivers)  # a commit below re-files it
        for ci in sources:
            for a in self._ordered(c, ci):
                # giving ``a`` away for nothing is the most the critical parent can gain
                if self._time(c, {ci: (-p.sparse_s[a], -p.tokens[a])}, -p.full_s[a]) >= target:
                    continue
                for _, q, di in receivers:
                    if q == c and di == ci:
                        continue
                    if q != c and self.times[q] >= target:
                        continue  # it only gets heavier: ``a`` outweighs any partner of it
                    if self._try_child(c, ci, a, q, di, target, limit):
                        return True
                    if self.tries >= limit:
                        return False
        if self._flatten(c, limit):
            return True
        return not self.within and self._exchange_many(c, target, receivers, limit)

    def _exchange_many(
        self, c: int, target: float, receivers: list[tuple[float, int, int]], limit: int
    ) -> bool:
        """One sample of the critical parent ``c`` (of any of its children, heaviest first)
        for a set of shorter samples of a child of another parent: the exchange that moves
        full-attention work out of ``c`` when every rank is at its token budget.

        When the critical parent's time is its full-attention layer (the longest sample's
        child fixes its busiest rank, so only the sum of its samples' quadratic work can
        fall), no single move fits anywhere and no one-for-one swap of about the same length
        moves enough of that work. A sample traded for several short ones of the same total
        length leaves every rank's tokens where they were and takes most of its quadratic
        work along (two 16-rank parents of 32 GPUs at 89% of memory, children of one rank:
        0.11-0.17% behind the tests' reference heuristic without this exchange)."""
        kids = self.pars[c].kids
        secs = self.cache[c][0]
        for ci in sorted(range(len(kids)), key=lambda i: (-secs[i], i)):
            for a in self._ordered(c, ci):
                for _, q, di in receivers:
                    if q == c or self.times[q] >= target:
                        continue
                    if self.tries >= limit:
                        return False
                    if self._try_many(c, ci, a, q, di, target, limit):
                        return True
        return False

    def _try_many(
        self, c: int, ci: int, a: int, q: int, di: int, target: float, limit: int
    ) -> bool:
        """``a`` for the shortest samples of child ``di`` of ``q`` (at least two, within
        memory on both sides). Taking back more of them makes ``c`` slower and ``q`` faster,
        so the longest prefix that keeps ``c`` under ``target`` is the only one to try, found
        by bisection."""
        p = self.p
        self.tries += 1
        src, dst = self.pars[c].kids[ci], self.pars[q].kids[di]
        samples, lengths = self._by_tokens(q, di)
        ta = p.tokens[a]
        n = bisect.bisect_left(lengths, ta)  # strictly shorter than ``a``
        if n < 2:
            return False
        tokens = list(itertools.accumulate(lengths[:n], initial=0))
        # memory: ``di`` gives back at least ``need`` tokens, ``ci`` takes at most ``room``
        need = dst.tokens + ta - p.capacity(dst.size)
        room = p.capacity(src.size) - src.tokens + ta
        lo = max(2, bisect.bisect_left(tokens, need))
        hi = min(n, bisect.bisect_right(tokens, room) - 1)
        if lo > hi:
            return False
        sparse = list(itertools.accumulate((p.sparse_s[b] for b in samples[:hi]), initial=0.0))
        full = list(itertools.accumulate((p.full_s[b] for b in samples[:hi]), initial=0.0))
        sa, fa = p.sparse_s[a], p.full_s[a]

        def critical(k: int) -> float:
            return self._time(c, {ci: (sparse[k] - sa, tokens[k] - ta)}, full[k] - fa)

        self.tries += 1
        if critical(lo) >= target:
            return False
        while lo < hi:  # the largest k with ``critical(k) < target``
            if self.tries >= limit:
                return False
            self.tries += 1
            mid = (lo + hi + 1) // 2
            if critical(mid) < target:
                lo = mid
            else:
                hi = mid - 1
        self.tries += 1
        k = lo
        if self._time(q, {di: (sa - sparse[k], ta - tokens[k])}, fa - full[k]) >= target:
            return False
        given = samples[:k]
        self._commit(c, ci, a, q, di, None)
        for b in given:
            self._commit(q, di, b, c, ci, None)
        return True

    def _flatten(self, c: int, limit: int) -> bool:
        """A plateau move inside the critical parent ``c``, when no exchange makes it faster:
        a sample of its slowest child or of its busiest rank's child goes to another of its
        children alone, for one shorter sample, or for a set of shorter ones about as long
        (``_partners``), keeping the parent's time and lowering its balance potential
        (``_potential``).

        The parent's time is a maximum over its children (sparse seconds) and ranks
        (tokens), so when several are level at the top no single exchange lowers it: a
        parent whose children had been packed long-with-long stopped there (one 8-rank
        parent of 2-GPU nodes, 0.70% behind the tests' reference heuristic, every rank at
        the same tokens). Trading a medium sample for many short ones of the same length
        keeps the busiest rank and moves sparse work, shorter samples costing less per
        token; once every child at the top is lower, an improving exchange follows. The
        potential only falls, so these moves end."""
        p, kids = self.p, self.pars[c].kids
        secs, busy = self.cache[c][0], self.cache[c][1]
        now = self.times[c]
        slowest = first_max(secs)
        busiest = first_max(busy)
        receivers = sorted(range(len(kids)), key=lambda i: (secs[i], i))
        for ci in dict.fromkeys((slowest, busiest)):
            for a in self._ordered(c, ci):
                sa, ta = p.sparse_s[a], p.tokens[a]
                for di in receivers:
                    if di == ci:
                        continue
                    for given in self._partners(c, ci, di, a):
                        if self.tries >= limit:
                            return False
                        self.tries += 1
                        s_in = sum(p.sparse_s[b] for b in given)
                        t_in = sum(p.tokens[b] for b in given)
                        changes = {ci: (s_in - sa, t_in - ta), di: (sa - s_in, ta - t_in)}
                        if self._potential(c, changes) >= -IMPROVEMENT:
                            continue
                        if self._time(c, changes) <= now:
                            self._commit(c, ci, a, c, di, None)
                            for b in given:
                                self._commit(c, di, b, c, ci, None)
                            return True
        return False

    def _partners(self, c: int, ci: int, di: int, a: int) -> list[tuple[int, ...]]:
        """What child ``di`` of parent ``c`` can give back for ``a`` of child ``ci`` within
        memory on both sides: nothing, one shorter sample, or a set of its shorter samples
        about as long as ``a`` that keeps both children's busiest ranks where they are (its
        shortest first, the rest filled from the longest that fit): the one-for-many
        exchange that single swaps cannot make."""
        p = self.p
        kids = self.pars[c].kids
        src, dst = kids[ci], kids[di]
        ta = p.tokens[a]
        dst_room = p.capacity(dst.size) - dst.tokens - ta
        src_room = p.capacity(src.size) - src.tokens + ta
        samples, lengths = self._by_tokens(c, di)
        found: list[tuple[int, ...]] = [()] if dst_room >= 0 else []
        lo = bisect.bisect_left(lengths, -dst_room)
        hi = min(bisect.bisect_right(lengths, src_room), bisect.bisect_left(lengths, ta))
        found.extend((b,) for b in samples[lo:hi])
        # a set: between what keeps ``di``'s busiest rank (and memory) and what ``ci`` can take
        level = max(self.cache[c][1]) if self.cache[c][1] else 0
        least = max(ta - (level * dst.size - dst.tokens), -dst_room, 0)
        most = min(ta + max(level * src.size - src.tokens, 0), src_room)
        shorter = samples[:hi]
        given: list[int] = []
        total = 0
        for b in shorter:  # shortest first: the least sparse work per token
            if total + p.tokens[b] > most:
                break
            given.append(b)
            total += p.tokens[b]
        for b in reversed(shorter[len(given) :]):  # then the longest that still fit
            if total + p.tokens[b] <= most:
                given.append(b)
                total += p.tokens[b]
        if len(given) >= 2 and total >= least:
            found.append(tuple(given))
        return found

    def _potential(self, c: int, changes: dict[int, tuple[float, int]]) -> float:
        """Change of parent ``c``'s balance potential under ``changes``: the sum over its
        ranks of the squares of their sparse and full-layer token seconds, relative to the
        parent's time. It falls when work goes from a loaded child to a lighter one that
        stays below it, and breaks the ties of the parent's maximum."""
        cost, par = self.p.cost, self.pars[c]
        per_token = cost.full_layers * cost.token_seconds(par.size)
        scale = self.times[c] ** 2
        delta = 0.0
        for i, (ds, dt) in changes.items():
            kid = par.kids[i]
            for sparse, tokens, sign in (
                (kid.sparse_s + ds, kid.tokens + dt, 1.0),
                (kid.sparse_s, kid.tokens, -1.0),
            ):
                sec = cost.sparse_layers * child_layer_seconds(cost, kid.size, sparse, tokens)
                full = per_token * ceil_div(tokens, kid.size)
                delta += sign * kid.size * (sec * sec + full * full) / scale
        return delta

    def _try_child(
        self, c: int, ci: int, a: int, q: int, di: int, target: float, limit: int
    ) -> bool:
        """Swap ``a`` against a lighter sample of child ``di`` of ``q`` (or move it there
        alone), memory kept on both sides. Every per-sample time grows with the length, so
        a shorter sample is a lighter one."""
        p = self.p
        self.tries += 1  # the child looked at
        src, dst = self.pars[c].kids[ci], self.pars[q].kids[di]
        ta = p.tokens[a]
        per_rank = p.cost.max_tokens_per_rank
        src_room = src.size * per_rank - src.tokens + ta
        dst_room = dst.size * per_rank - dst.tokens - ta
        # a swap partner keeps both children within memory
        samples, lengths = self._by_tokens(q, di)
        first = bisect.bisect_left(lengths, -dst_room)
        # shorter than ``a`` (an equal length changes nothing)
        end = min(bisect.bisect_right(lengths, src_room), bisect.bisect_left(lengths, ta))
        if end <= first and dst_room < 0:
            return False  # no partner and no room: nothing to try
        if q == c:
            lighter = samples[first:end][::-1]  # longest first
            return self._try_within(c, ci, a, di, lighter, dst_room >= 0, target, limit)
        if dst_room >= 0:
            self.tries += 1  # the move: the critical side gains the most (``step`` checked)
            if self._side(q, di, None, a) < target:
                self._commit(c, ci, a, q, di, None)
                return True
        # Both sides are monotone in the partner's length: the critical parent gets slower,
        # the receiver faster, the heavier the partner. So the heaviest partner that gets the
        # critical parent under ``target`` is the only one to try: if the receiver is over
        # with it, it is over with every lighter one. It is found by galloping (usually the
        # heaviest partner already does), then bisection. Partner ``k`` (0: the heaviest) is
        # ``samples[end - 1 - k]``.
        count = max(0, end - first)
        lo, hi, step = 0, count, 1
        while lo < hi:
            if self.tries >= limit:
                return False
            self.tries += 1
            probe = min(lo + step - 1, hi - 1)
            if self._side(c, ci, a, samples[end - 1 - probe]) < target:
                hi = probe
                break
            lo, step = probe + 1, step * 2
        while lo < hi:
            if self.tries >= limit:
                return False
            self.tries += 1
            mid = (lo + hi) // 2
            if self._side(c, ci, a, samples[end - 1 - mid]) < target:
                hi = mid
            else:
                lo = mid + 1
        if lo == count or self.tries >= limit:
            return False
        self.tries += 1
        b = samples[end - 1 - lo]
        if self._side(q, di, b, a) < target:
            self._commit(c, ci, a, q, di, b)
            return True
        return False

    def _try_within(
        self,
        c: int,
        ci: int,
        a: int,
        di: int,
        lighter: list[int],
        move: bool,
        target: float,
        limit: int,
    ) -> bool:
        """``_try_child`` between two children of the critical parent: both sides count in
        one time, so the partners are tried one by one, heaviest first."""
        options: list[int | None] = [None] if move else []
        options.extend(lighter)
        for b in options:
            if self.tries >= limit:
                return False
            self.tries += 1
            if self._trial(c, ci, a, c, di, b) < target:
                self._commit(c, ci, a, c, di, b)
                return True
        return False

    def layout(self) -> Layout:
        return tuple(
            Parent(
                par.start,
                par.size,
                tuple(Child(k.start, k.size, tuple(k.samples)) for k in par.kids),
            )
            for par in self.pars
        )


def swap_children(
    problem: Problem,
    layout: Layout,
    budget: Budget,
    within: bool = False,
    pool: WorkPool | None = None,
) -> Layout:
    """``layout`` with samples exchanged between children while the critical parent gets
    faster, within the request's deterministic share of ``SWAP_WORK`` (more for large
    memory-tight requests, ``SWAP_WORLD``); the same layout when no swap helps. ``within``:
    exchanges only between children of the critical parent (mode ``repack``: membership kept).
    ``pool``: the tries are also drawn from it (several layouts finished for one answer)."""
    swaps = _Swaps(problem, layout, within)
    scale = 1
    if problem.fill >= TIGHT_FILL:
        scale = min(MAX_SWAP_SCALE, max(1, problem.cost.world_size // SWAP_WORLD))
    if problem.cost.world_size <= SMALL_WORLD:
        scale = max(scale, SMALL_SWAP_SCALE)
    limit = budget.move_evals(SWAP_WORK * scale)
    if pool is not None:
        limit = pool.cap("child_swaps", limit)
    changed = False
    while swaps.tries < limit and not budget.expired():
        if not swaps.step(limit):
            break
        changed = True
    if pool is not None:
        pool.charge("child_swaps", swaps.tries)
    return swaps.layout() if changed else layout
