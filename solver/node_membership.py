"""Membership built at node level: samples onto the nodes of fixed parents, children per node.

The parent-level ``repack`` estimate of ``membership`` sees a parent as one pool of ranks; a
layout is really decided per node (children never leave one), and memory binds per node too.
This stage works on *bins*, the nodes of every parent wider than a node and every narrower
parent as a whole:

1. LPT: samples by decreasing work, each to the bin whose per-rank work stays lowest among those
   with memory for it; a sample longer than any node's memory makes the parent that holds it
   and is least loaded with it *whole* (unrepacked), and that parent then takes samples as one
   bin (where that made a second parent whole although a whole one had room, the stage also
   runs with such samples kept in the whole parents, ``NodeSeed.few_whole``);
2. every bin gets its fastest uniform child size (``node_packing``), every parent the faster
   of that and its unrepacked layout, evaluated exactly under the cost model;
3. greedy moves out of the critical parent: its busiest bin's heaviest samples to the least
   loaded bins of any parent, while the larger of the two parents' exact times drops, under a
   deterministic budget of evaluations.

The planner uses the result as one more candidate membership (and layout) of ``repack+parent``.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

from solver.budget import Budget
from solver.cost_model import (
    ceil_div,
    child_layer_seconds,
    full_layer_seconds,
    unrepacked_parent_seconds,
)
from solver.critical import first_max
from solver.layout import Child, Parent, parent_starts, parent_time, unrepacked
from solver.node_packing import children_of_segment
from solver.problem import Problem
from solver.receiver_floors import EditRow, ReceiverTerms

_Num = TypeVar("_Num", int, float)

MOVE_WORK = 12_000
"""Deterministic work limit of the move phase for a request of up to ``WORK_PAIRS`` (sample x
bin) pairs, in units of one sample re-packed into children (about a microsecond and a half):
a re-pack costs its bin's samples, an edit of a bin's children (``_edited``) ``EDIT_WORK`` per
child. Small requests try every move, large ones the most promising: heaviest samples of the
busiest bins to the least loaded bins."""

WORK_PAIRS = 5_500
"""A packed 64-GPU step (~685 samples x 8 nodes). Larger requests get ``MOVE_WORK`` times their
share of this: the moves a step needs, and the tries each move makes, grow with the samples
and the bins (at 128 and 256 GPUs the fixed limit stopped 1-3 points short of what the same
moves reach, and of the reference heuristic of the tests)."""

MAX_WORK_SCALE = 8.0
"""At most this multiple of ``MOVE_WORK`` (~140 ms on the development machine), reached at
~44,000 pairs (256 GPUs). Measured on 12 packed 256-GPU steps (8-rank parents, the loader of
``scenarios/gpu64-packed.yaml`` on 32 nodes): caps 4 / 8 / 16 gave `repack+parent` -11.05 /
-11.26 / -11.49% (max solve 243 / 296 / 382 ms) and `repack+sizing` -12.38 / -12.48 / -12.60%
(max 684 / 677 / 853 ms); the sizing modes run this stage several times, and 16 left their
1 s deadline too little headroom."""

SECOND_SEED_PAIRS = 2_000
"""Up to this many (sample x bin) pairs (~32 GPUs and a few hundred samples) the stage runs
twice, LPT balancing per-rank seconds with full attention (the default) and one layer's work
alone (the stage's first rule), moves after each, and keeps the faster layout: neither
dominates, and on 40 packed steps of small clusters (2-, 4- and 8-GPU nodes, 16-64 heads)
where `repack`, `repack+parent`, `repack+sizing` or `sizing` ended 0.1-1.2% behind the tests'
reference heuristic, the second seed closed 14 of the 17 the child swaps left. The 64-GPU
steps (~5,500 pairs) keep one seed: their latency target."""

TWO_RULE_PAIRS = 3_000
"""Requests above ``SECOND_SEED_PAIRS`` and up to this many pairs (32 GPUs of 4-GPU nodes
with 250-375 samples) run both LPT rules with the edits' moves, each at ``TWO_RULE_SHARE`` of
the move work, and a fixed membership (mode ``repack``) moves by re-packing both bins. With
one rule, 7 of 80 packed steps of four 8-rank parents (90-99% of memory, pattern FFS, 16
heads) ended 0.15-0.51% behind the tests' reference heuristic; with these none beyond its 0.1%
tolerance (worst +0.10%), at about the same CPU. The 64-GPU bench steps (~3,200 pairs) and
packed steps (~5,500) stay above."""

MIXED_TWO_RULE_PAIRS = 6_000
"""``TWO_RULE_PAIRS`` for requests whose parents are not all one size (a loader's mixed sizes):
there the two LPT rules disagree most on where the longest samples go (per-rank seconds with
full attention favour the widest parent, work alone the first of the narrow ones), and a
hunted 32-GPU step of 4-GPU nodes with sizes ``[4, 4, 2, 2, 2, 2, 8, 8]`` (3,150 pairs) ended
1.66% behind the tests' reference heuristic with the first rule alone, 0.78% ahead with both.
Uniform sizes keep ``TWO_RULE_PAIRS``: raising it to 4,000 took in the 64-GPU bench steps and
cost `repack+parent` 0.07 points there (half the move work each)."""

TWO_RULE_SHARE = 0.5
"""Half the move work each on a free membership: the two seeds cost what one did (the full
share each: one of the seven steps still 0.20% behind, ~+20% CPU). A fixed membership (mode
``repack``, 40-110 ms there) keeps the full share for both: at half, a step of two 16-rank
parents whose move phase needs its whole budget (``hunt-8x4-two-parents-16.json`` of the
tests) went back to 0.29% behind the reference."""

EXACT_FIRST_SHARE = 0.5
"""Share of the move work of a seed whose moves re-pack from the first on (``node_seeds``): on
``repack bench --sizes 16:50 --work-only`` half gave the same plans' quality as the full
share (`repack` -1.18%, `repack+parent` -4.30%, vs -1.16% / -4.27% without these seeds) at
p50 64 / 152 ms instead of 71 / 183 ms (55 / 167 ms without them), and the three hunted
steps they fix still pass."""

EDIT_WORK = 1
"""Work of one child in an edit: a pass over the bin's children plus the parent's time."""


MAX_PAIRS = 1_000_000
"""Above this many (sample x bin) pairs the stage is skipped (the greedy path and the child swaps
cover those requests) unless the step is memory-tight (``TIGHT_FILL``). 1,000,000 takes in ``repack
bench``'s 1,024-GPU steps (60% fill, ~6,000 samples x 128 bins): without the stage `repack+parent`
ended a median 14% above its bound there, with it 0.0% (mean step time -13.8% over 10 steps), and
`repack+sizing`, which must run it to stay ahead of `repack+parent`, 0.2% faster (two steps where
`repack+parent` had won); CPU p50 +34% / +12%, p99 x2.1 / x1.6 on 20 bench steps, after the
vectorised receiver floors (``receiver_floors``). 400,000 (until 2026-12-02) took in packed 512-GPU
steps of 8-rank parents (~5,700 samples x 64 bins), where the greedy path alone ended 1.9% (one
sample longer than a node) and 9.6% (two in one parent) slower than the tests' reference heuristic,
now 8.5% and 1.5% faster (`repack+parent` ~0.3-0.7 s CPU there). At 100,000 (until 2026-12-01) it
took in packed 256-GPU steps (~2,900 samples x 32 bins; before ``_LightestBins`` the placement
scanned every bin per sample and the limit was 60,000)."""

TIGHT_FILL = 0.9
"""A step holding at least this share of the cluster's token memory (a packing loader's) runs
the stage up to ``MAX_TIGHT_PAIRS``: there the greedy child packer runs out of memory and the
node stage is what repacks at all."""

MAX_TIGHT_PAIRS = 2_000_000
"""The limit for memory-tight steps: 1,024 GPUs. A packed 1,024-GPU step (~11,300 samples x 128
bins of 8-rank parents) ended 22% above its lower bound without the stage (5,316 ms, where
mode ``sizing`` found 4,257 ms), 0.2% with it (4,164 ms; +0.3-0.6 s CPU)."""

MAX_WHOLE_PAIRS = 100_000
"""The same limit for the stage with every parent whole (the sizing modes' re-balancing of the
upstream sizes, ``tilings``): mode ``sizing`` already beats the reference on the packed
512-GPU steps without it, and ``repack+sizing`` runs it besides two repacked stages."""

PREFILTER_RECEIVERS = 32
"""From this many receiving bins a move rules receivers out with ``receiver_floors`` (one
numpy pass per sample) before the exact floors: below it numpy's per-call cost is more than
the floors it saves (a packed 64-GPU step has 8-16 receivers)."""

EDIT_SCREEN_RECEIVERS = 64
"""From this many receivers the screen also rules out receivers whose trial edit is too slow
(``ReceiverTerms.screen``): on 1,024-GPU bench steps (128 receivers) the steps whose move
phase spends its whole budget took 25-50% less CPU (max 1,995 -> 1,626 ms on that day's slow
machine, the same plans); on packed 256-GPU steps (32 receivers) it cost 7% more."""


@dataclass
class _Bin:
    parent: int
    start: int
    ranks: int
    samples: list[int] = field(default_factory=list)
    tokens: int = 0
    work: float = 0.0
    full_s: float = 0.0
    sparse_s: float = 0.0
    packed: tuple[list[Child], float, int] | None = None
    """Cached ``children_of_segment`` result: children, sparse-layer time, busiest rank."""
    fresh: bool = False
    sums: list[tuple[float, int, float]] = field(default_factory=list)
    """Per child of ``sums_of``: sparse seconds, tokens and sparse-layer time (for edits)."""
    sums_of: object = None
    child_of: dict[int, int] = field(default_factory=dict)
    """Per sample of ``sums_of``: the index of its child."""
    z_top: tuple[tuple[float, int], float] = ((0.0, -1), 0.0)
    """Of ``sums``: the slowest child's (sparse-layer time, index) and the second slowest
    time (``-inf`` for one child): an edit of one child reads the others' maximum here."""
    m_top: tuple[tuple[int, int], int] = ((0, -1), 0)
    """The same for the busiest rank's tokens of each child."""
    edit_row: EditRow | None = None
    """``NodeSeed._edit_row`` for ``edit_of`` (the packed children it was taken from)."""
    edit_of: object = None


class NodeSeed:
    def __init__(
        self, problem: Problem, sizes: Sequence[int], repack: bool = True, by_work: bool = False
    ) -> None:
        self.p = problem
        self.sizes = list(sizes)
        self.starts = parent_starts(sizes)
        g = problem.cost.gpus_per_node
        self.whole = [not repack] * len(sizes)
        self._widest: int | None = None
        """Most ranks of a bin of a parent that is not whole (``_needs_whole``), or None."""
        self.bins: list[list[_Bin]] = [
            [_Bin(j, start + o, min(size, g)) for o in range(0, size, min(size, g))]
            for j, (start, size) in enumerate(zip(self.starts, sizes, strict=True))
        ]
        self._tokens = [0] * len(sizes)
        """Tokens of each parent (its bins'), kept by ``_add``."""
        self._edits = [0] * len(sizes)
        self._full: list[tuple[int, float]] = [(0, 0.0)] * len(sizes)
        """Per parent: its bins' summed full-attention seconds, and ``_edits`` when summed
        (summed again, bin by bin as before, only after the parent changed: LPT reads it for
        every candidate bin of every sample)."""
        self.times: list[float] = []
        self.fixed = False
        """Membership is given: moves stay between the nodes of one parent."""
        self.work = 0
        self.move_work = MOVE_WORK
        """The request's share of ``MOVE_WORK`` (``Budget.evals``)."""
        cost = problem.cost
        cheapest = min(cost.a2a_seconds_per_token(size) for size in set(sizes))
        self.full_rate = {
            size: 0.0
            if by_work
            else cost.full_layers
            * (cost.linear_seconds_per_token + (cost.a2a_seconds_per_token(size) - cheapest))
            for size in set(sizes)
        }
        """Per parent size: seconds per token of a rank's full layers that LPT counts, linear
        work and the all-to-all beyond the cheapest parent's (see ``_lpt_load``; exactly the
        linear work alone for that parent, so uniform sizes place as before)."""
        self.exact_moves = False
        """Once the edits find no move, try the moves again with both bins re-packed, as the
        reference heuristic of the tests does for every move: for a fixed membership (mode
        ``repack``'s answer, the bar of ``repack+parent`` too) of a small request
        (``SECOND_SEED_PAIRS``). On the free membership of the 16-GPU bench steps this seed
        ended better but ``repack+parent``'s search from it worse (-4.27% -> -4.19%)."""
        self.exact = False
        """The move phase re-packs both bins of a trial instead of editing their children."""
        self.few_whole = False
        """LPT puts a sample longer than a node into a parent that is whole already where one
        has room, instead of the least loaded parent that holds it (``FEW_WHOLE``)."""
        self.split_whole = False
        """LPT made a parent whole for such a sample although a whole one had room for it."""
        self.full_weight = 0 if by_work else cost.full_layers
        self.work_weight = 1 if by_work else cost.sparse_layers
        """LPT's weights of full attention and of a sample's sparse-layer work: ``by_work``
        balances one layer's work per rank alone (``SECOND_SEED_PAIRS``)."""

    # --- bins -------------------------------------------------------------------------------
    def _add(self, b: _Bin, s: int, sign: int = 1) -> None:
        p = self.p
        if sign > 0:
            b.samples.append(s)
        elif b.samples[-1] == s:  # a trial's sample, taken back out: no scan
            b.samples.pop()
        else:
            b.samples.remove(s)
        b.tokens += sign * p.tokens[s]
        b.work += sign * p.work_s[s]
        b.full_s += sign * p.full_s[s]
        b.sparse_s += sign * p.sparse_s[s]
        b.fresh = False
        self._tokens[b.parent] += sign * p.tokens[s]
        self._edits[b.parent] += 1

    def _parent_tokens(self, j: int) -> int:
        return self._tokens[j]

    def _parent_full_s(self, j: int) -> float:
        """``sum(b.full_s for b in self.bins[j])``, summed once per change of the parent."""
        edits, full = self._full[j]
        if edits != self._edits[j]:
            full = sum(b.full_s for b in self.bins[j])
            self._full[j] = (self._edits[j], full)
        return full

    def _room(self, b: _Bin, s: int) -> bool:
        p = self.p
        if self.whole[b.parent]:
            j = b.parent
            return self._parent_tokens(j) + p.tokens[s] <= p.capacity(self.sizes[j])
        return b.tokens + p.tokens[s] <= p.capacity(b.ranks)

    def _load(self, b: _Bin) -> float:
        if self.whole[b.parent]:
            j = b.parent
            return sum(x.work for x in self.bins[j]) / self.sizes[j]
        return b.work / b.ranks

    def _needs_whole(self, s: int, owner: dict[int, int]) -> bool:
        """Whether ``s`` is longer than the memory of every bin it may go to that is not part
        of a whole parent (its own parent's, when membership is fixed), and there is one."""
        p = self.p
        if self.fixed:
            j = owner[s]
            return not self.whole[j] and p.tokens[s] > p.capacity(self.bins[j][0].ranks)
        if self._widest is None:  # kept until a parent goes whole
            self._widest = max(
                (bins[0].ranks for j, bins in enumerate(self.bins) if not self.whole[j]),
                default=0,
            )
        return self._widest > 0 and p.tokens[s] > p.capacity(self._widest)

    def _open_bins(self) -> list[_Bin]:
        """Every bin, a whole parent counting as its first bin only."""
        return [
            b for j, bins in enumerate(self.bins) for b in (bins[:1] if self.whole[j] else bins)
        ]

    # --- construction ----------------------------------------------------------------------
    def place(self, fixed: Sequence[Sequence[int]] | None = None) -> bool:
        """LPT onto bins; False when a sample finds no memory anywhere. With ``fixed`` (the
        members of every parent) a sample only goes to its own parent's bins."""
        p = self.p
        self.fixed = fixed is not None
        owner = {s: j for j, group in enumerate(fixed or []) for s in group}
        lightest = _LightestBins(self)
        for s in sorted(range(p.num_samples), key=lambda s: (-p.work_s[s], s)):
            if not self._needs_whole(s, owner):
                b = self._lightest_of(owner[s], s) if self.fixed else lightest.pick(s)
                if b is not None:
                    self._add(b, s)
                    lightest.done(b)
                    continue
            # No bin has room, or the sample is longer than any node: every parent that holds
            # it is a choice, the whole ones and those it would make whole (else a second
            # such sample would join the first one's parent, the only bin that fits it,
            # however loaded that parent is).
            holders = [
                j
                for j in range(len(self.sizes))
                if self._parent_tokens(j) + p.tokens[s] <= p.capacity(self.sizes[j])
                and (not self.fixed or j == owner[s])
            ]
            if not holders:
                return False
            already = [j for j in holders if self.whole[j]]
            if self.few_whole and already:
                holders = already
            j = min(holders, key=lambda j: (self._parent_load(j, s), j))
            self.split_whole |= bool(already) and not self.whole[j]
            self.whole[j] = True
            self._widest = None
            lightest.went_whole(j)
            self._add(self.bins[j][0], s)
            lightest.done(self.bins[j][0])
        self.times = [self._time(j)[0] for j in range(len(self.sizes))]
        return True

    def _lpt_load(self, b: _Bin) -> float:
        """Per-rank seconds LPT balances: the parent's full-attention layers (Ulysses spreads
        them over all its ranks, so they are shared by its nodes) plus the bin's sparse layers
        and its tokens' linear work in the full layers (the whole parent's, when whole).
        Sparse work alone put a second long sample on the empty second node of the first
        one's parent, doubling that parent's full attention (a packed 256-GPU step of 16-rank
        parents ended 28% above its bound). The tokens also pay the parent's all-to-all beyond
        the cheapest parent size of the request (nothing when all parents are one size): without
        it a wide parent looked cheaper for a long sample than a narrow one, its attention shared
        by more ranks whatever its inter-node all-to-all cost (32 GPUs of 4-GPU nodes, parents
        [4, 4, 4, 4, 16]: the three samples longer than a rank's memory all went to the 16-rank
        parent, which stayed unrepacked, 4.1% slower than one 4-rank parent each)."""
        j = b.parent
        size = self.sizes[j]
        full = self.full_weight * self._parent_full_s(j) / size
        if self.whole[j]:
            return self._parent_load(j)
        return full + (self.work_weight * b.work + self.full_rate[size] * b.tokens) / b.ranks

    def _parent_load(self, j: int, s: int | None = None) -> float:
        """``_lpt_load`` of parent ``j`` as one whole bin, with sample ``s`` in it if given.
        A sample longer than a node picks its parent by the load *with* it: by the load
        before it, every empty parent tied and the first won, so a loader's mixed sizes
        ``[16, 16, 32]`` got a 419,430-token sample in a 16-rank parent, its full attention
        on half the ranks of the 32-rank one (`repack+parent` 2.05% behind the tests'
        reference heuristic, which put it in the 32-rank parent)."""
        bins, size = self.bins[j], self.sizes[j]
        lin, work = self.full_rate[size], self.work_weight
        full = self.full_weight * self._parent_full_s(j)
        load = full + sum(work * x.work + lin * x.tokens for x in bins)
        if s is not None:
            p = self.p
            load += self.full_weight * p.full_s[s] + work * p.work_s[s] + lin * p.tokens[s]
        return load / size

    def _key(self, b: _Bin, s: int) -> tuple[float, int]:
        """LPT's choice among bins with room: lowest ``_lpt_load`` after ``s``, then rank."""
        p = self.p
        size = self.sizes[b.parent]
        ranks = size if self.whole[b.parent] else b.ranks
        extra = self.full_weight * p.full_s[s] / size
        extra += (self.work_weight * p.work_s[s] + self.full_rate[size] * p.tokens[s]) / ranks
        return self._lpt_load(b) + extra, b.start

    def _lightest_of(self, j: int, s: int) -> _Bin | None:
        """The LPT bin of parent ``j`` for ``s`` (membership fixed), None if none has room."""
        bins = self.bins[j][:1] if self.whole[j] else self.bins[j]
        fits = [b for b in bins if self._room(b, s)]
        return min(fits, key=lambda b: self._key(b, s)) if fits else None

    def _packed(self, b: _Bin) -> tuple[list[Child], float, int] | None:
        """The bin's children (re-packed, and charged its members, when it changed)."""
        if not b.fresh:
            size = self.sizes[b.parent]
            if b.tokens > self.p.capacity(b.ranks):
                b.packed = None  # over the node's memory: no children hold it
            else:
                floor = ceil_div(self._parent_tokens(b.parent), size)
                b.packed = children_of_segment(self.p, b.start, b.ranks, b.samples, size, floor)
                self.work += len(b.samples)
            b.fresh = True
        return b.packed

    def _edited(self, b: _Bin, s: int, sign: int) -> tuple[list[Child], float, int] | None:
        """The bin's children as they are, with ``s`` taken out of its child (``sign`` -1) or
        put into the child where it ends fastest with memory for it (1); None when no child
        has room (or the bin has no children). A move tries many of these per re-pack: an
        edit costs one pass over the bin's samples, a re-pack four LPTs."""
        packed = self._packed(b)
        if packed is None or not packed[0]:
            return None
        p, cost = self.p, self.p.cost
        self.work += EDIT_WORK * (1 + len(packed[0]))
        kids, sums = list(packed[0]), self._child_sums(b)
        if sign < 0:
            i = b.child_of[s]
            samples = tuple(u for u in kids[i].samples if u != s)
        else:
            best: tuple[float, int] | None = None
            tokens, sparse = p.tokens[s], p.sparse_s[s]
            for i, (c, (sp, tok, _)) in enumerate(zip(kids, sums, strict=True)):
                if tok + tokens > p.capacity(c.size):
                    continue
                t = child_layer_seconds(cost, c.size, sp + sparse, tok + tokens)
                if best is None or t < best[0]:
                    best = (t, i)
            if best is None:
                return None
            i = best[1]
            samples = (*kids[i].samples, s)
        sp, tok = sums[i][0] + sign * p.sparse_s[s], sums[i][1] + sign * p.tokens[s]
        size = kids[i].size
        kids[i] = Child(kids[i].start, size, samples)
        # The other children's maxima (``z_top``, ``m_top``) with the edited child's: the same
        # values as the maxima over every child, without a pass over them.
        (z_first, z_at), z_second = b.z_top
        (m_first, m_at), m_second = b.m_top
        z = max(child_layer_seconds(cost, size, sp, tok), z_second if z_at == i else z_first)
        m = max(-(-tok // size), m_second if m_at == i else m_first)
        return kids, z, m

    def _time(self, j: int) -> tuple[float, bool]:
        """Parent ``j``'s time and whether that is its per-bin (split) layout."""
        cost, size, bins = self.p.cost, self.sizes[j], self.bins[j]
        full = sum(b.full_s for b in bins)
        whole = unrepacked_parent_seconds(
            cost, size, full, sum(b.sparse_s for b in bins), sum(b.tokens for b in bins)
        )
        if self.whole[j] or size == 1:
            return whole, False
        z, m = 0.0, 0
        for b in bins:
            packed = self._packed(b)
            if packed is None:
                return whole, False
            z, m = max(z, packed[1]), max(m, packed[2])
        split = cost.full_layers * full_layer_seconds(cost, size, full, m)
        split += cost.sparse_layers * z
        return (split, True) if split < whole else (whole, False)

    def _time_floor(self, j: int, changed: _Bin) -> float:
        """A lower bound of ``_time(j)`` without packing children: the unrepacked time, or a
        split layout no faster than the changed bin's work spread on its ranks (every child
        of it is at least that slow on average) and its busiest rank's token share, nor than
        the other bins' children (packed already, they stay as they are)."""
        cost, size, bins = self.p.cost, self.sizes[j], self.bins[j]
        full = sum(b.full_s for b in bins)
        tokens = sum(b.tokens for b in bins)
        whole = unrepacked_parent_seconds(cost, size, full, sum(b.sparse_s for b in bins), tokens)
        if self.whole[j] or size == 1:
            return whole
        m = max(ceil_div(tokens, size), ceil_div(changed.tokens, changed.ranks))
        z = changed.work / changed.ranks
        for b in bins:  # the other bins keep the children they have
            if b is not changed and b.fresh:
                if b.packed is None:
                    return whole
                z, m = max(z, b.packed[1]), max(m, b.packed[2])
        split = cost.full_layers * full_layer_seconds(cost, size, full, m)
        split += cost.sparse_layers * z
        return min(whole, split)

    def layout(self, j: int) -> Parent:
        """Parent ``j`` at the faster of its per-bin children and its unrepacked layout."""
        _, split = self._time(j)
        if not split:
            members = [s for b in self.bins[j] for s in b.samples]
            return unrepacked(self.starts[j], self.sizes[j], members)
        children = [c for b in self.bins[j] for c in (self._packed(b) or ([], 0.0, 0))[0]]
        return Parent(self.starts[j], self.sizes[j], tuple(children))

    # --- moves -----------------------------------------------------------------------------
    def improve(self, clock: Budget | None = None) -> None:
        """Moves while one helps and work is left; where ``exact_moves`` allows, once the
        edits find no move, the same moves tried with both bins re-packed (``exact``)."""
        self.work = 0
        while self.work < self.move_work and not (clock is not None and clock.expired()):
            if self._move_one():
                continue
            if self.exact or not self.exact_moves:
                return
            self.exact = True

    def _move_one(self) -> bool:
        """The first improving move of one sample out of the critical parent: a sample whose
        removal alone does not bring that parent under the step is skipped outright."""
        p = self.p
        c = first_max(self.times)
        target = self.times[c] * (1 - 1e-9)
        sources = sorted(self.bins[c], key=lambda b: (-b.work / b.ranks, b.start))
        receivers = sorted(
            (
                b
                for b in self._open_bins()
                if (b.parent != c or not self.whole[c]) and (not self.fixed or b.parent == c)
            ),
            key=lambda b: (self._load(b), b.start),
        )
        terms = self._receiver_terms(receivers) if len(receivers) >= PREFILTER_RECEIVERS else None
        screened = [False] * len(receivers), [False] * len(receivers)
        for src in sources:
            for s in sorted(src.samples, key=p.heavy_rank.__getitem__):
                if self.work >= self.move_work:
                    return False
                if terms is not None:
                    sample = (p.full_s[s], p.tokens[s], p.sparse_s[s], p.work_s[s])
                    screened = terms.screen(p.cost, target, sample)
                if self._move_sample(c, src, s, target, receivers, screened, terms):
                    return True
        return False

    def _receiver_terms(self, receivers: list[_Bin]) -> ReceiverTerms:
        """What ``_time_floor`` and a trial edit read of each receiver's parent, for
        ``receiver_floors``."""
        rows, edits = [], []
        screen_edits = len(receivers) >= EDIT_SCREEN_RECEIVERS
        sums: dict[int, tuple[float, int, float]] = {}  # per parent, summed once per call
        for dst in receivers:
            q, bins = dst.parent, self.bins[dst.parent]
            z, m, whole_only = 0.0, 0, self.whole[q] or self.sizes[q] == 1
            for b in bins:
                if b is not dst and b.fresh:
                    if b.packed is None:
                        whole_only = True
                    else:
                        z, m = max(z, b.packed[1]), max(m, b.packed[2])
            edits.append(None if whole_only or not screen_edits else self._edit_row(dst))
            if q not in sums:
                sums[q] = (
                    sum(b.full_s for b in bins),
                    sum(b.tokens for b in bins),
                    sum(b.sparse_s for b in bins),
                )
            full, tokens, sparse = sums[q]
            rows.append(
                (
                    self.sizes[q],
                    dst.ranks,
                    full,
                    tokens,
                    sparse,
                    dst.work,
                    dst.tokens,
                    z,
                    m,
                    whole_only,
                )
            )
        return ReceiverTerms.build(self.p.cost, rows, edits)

    def _edit_row(self, dst: _Bin) -> EditRow | None:
        """What a trial edit of ``dst`` reads (``receiver_floors.EditRow``), when that trial is
        an edit that re-packs nothing; else None. Kept on the bin until it is re-packed."""
        q = dst.parent
        packed = dst.packed
        if self.whole[q] or self.sizes[q] == 1 or not dst.fresh or not packed or not packed[0]:
            return None
        if any(not b.fresh or b.packed is None for b in self.bins[q] if b is not dst):
            return None
        if dst.edit_of is not packed:
            sums = self._child_sums(dst)
            dst.edit_row = EditRow(
                sizes=[c.size for c in packed[0]],
                sparse=[sp for sp, _, _ in sums],
                tokens=[tok for _, tok, _ in sums],
                z=max(t for _, _, t in sums),
                m=max(
                    ceil_div(tok, c.size) for c, (_, tok, _) in zip(packed[0], sums, strict=True)
                ),
                charge=EDIT_WORK * (1 + len(packed[0])),
            )
            dst.edit_of = packed
        return dst.edit_row

    def _child_sums(self, b: _Bin) -> list[tuple[float, int, float]]:
        """Per child of ``b``'s packed children: sparse seconds, tokens, sparse-layer time."""
        packed = b.packed
        assert packed is not None
        if b.sums_of is not packed:
            p, cost = self.p, self.p.cost
            b.sums_of = packed
            b.sums = []
            b.child_of = {}
            for i, c in enumerate(packed[0]):
                sp, tok = sum(p.sparse_s[u] for u in c.samples), sum(p.tokens[u] for u in c.samples)
                b.sums.append((sp, tok, child_layer_seconds(cost, c.size, sp, tok)))
                b.child_of.update((u, i) for u in c.samples)
            b.z_top = _top_two([t for _, _, t in b.sums], -math.inf)
            b.m_top = _top_two(
                [-(-tok // c.size) for c, (_, tok, _) in zip(packed[0], b.sums, strict=True)], -1
            )
        return b.sums

    def _move_sample(
        self,
        c: int,
        src: _Bin,
        s: int,
        target: float,
        receivers: list[_Bin],
        screened: tuple[list[bool], list[bool]],
        terms: ReceiverTerms | None,
    ) -> bool:
        """Move ``s`` out of ``src`` into the first receiver that keeps both parents under
        ``target``. Tries edit the bins' children (``_edited``: ``s`` out of its child, into
        the receiver's fastest child with room) rather than re-pack them; a receiver with no
        child that has room is re-packed. The critical parent without ``s`` is evaluated
        once, when a receiver of another parent takes it, and ``s`` is skipped outright when
        that alone does not bring the critical parent under ``target``. ``screened``: per
        receiver, its parent's floor with ``s`` is already known to be above ``target``, or
        its trial edit is (``ReceiverTerms.screen``): the same answers as ``_floor_with`` and
        ``_trial``, charged the same work, at a fraction of their cost."""
        t_without: float | None = None
        floor_out, edit_out = screened
        for i, dst in enumerate(receivers):
            q = dst.parent
            if dst is src or self.work >= self.move_work:
                continue
            self.work += 1  # a receiver looked at
            if q != c and floor_out[i]:
                continue
            if q != c and edit_out[i]:
                assert terms is not None and terms.edits is not None
                self.work += terms.edits.charge[i]
                continue
            if q != c and (
                self._parent_tokens(q) + self.p.tokens[s] > self.p.capacity(self.sizes[q])
            ):
                continue  # a node may overflow (its parent then stays unrepacked), a parent not
            if q != c and (
                self._floor_with(dst, s) >= target
                or self._trial(dst, s, 1, partial(self._seconds, q)) >= target
            ):
                continue
            if t_without is None:
                t_without = self._trial(src, s, -1, partial(self._seconds, c))
            if t_without >= target:
                return False
            if q == c and self._floor_within(src, dst, s) >= target:
                continue
            both = partial(self._trial, dst, s, 1, partial(self._seconds, c))
            if q == c and self._trial(src, s, -1, both) >= target:
                continue
            self._commit(s, src, dst)
            self.times[c] = self._time(c)[0]
            self.times[q] = self._time(q)[0]
            return True
        return False

    def _seconds(self, j: int) -> float:
        return self._time(j)[0]

    def _floor_with(self, dst: _Bin, s: int) -> float:
        """``_time_floor`` of ``dst``'s parent with ``s`` in ``dst``: rules out most receivers
        before their children are edited."""
        saved = (dst.packed, dst.fresh)
        self._add(dst, s)
        floor = self._time_floor(dst.parent, dst)
        self._add(dst, s, -1)
        dst.packed, dst.fresh = saved
        return floor

    def _floor_within(self, src: _Bin, dst: _Bin, s: int) -> float:
        """A lower bound of the time of ``src``'s parent with ``s`` moved from ``src`` to
        ``dst``, another node of that parent, without packing children: its members stay, so
        the unrepacked time is its time now; a split layout is no faster than either changed
        bin's work spread on its ranks, its busiest rank's token share, and the other bins'
        children (as in ``_time_floor``). Most same-parent trials of a heavy sample end here
        (a fixed membership's move phase spent its whole budget on four moves of a 16-rank
        parent of 4-GPU nodes, 0.29% behind the tests' reference heuristic)."""
        p, cost = self.p, self.p.cost
        j = src.parent
        size, bins = self.sizes[j], self.bins[j]
        full = sum(b.full_s for b in bins)
        tokens = sum(b.tokens for b in bins)
        whole = unrepacked_parent_seconds(cost, size, full, sum(b.sparse_s for b in bins), tokens)
        if self.whole[j] or size == 1:
            return whole
        dst_tokens = dst.tokens + p.tokens[s]
        if dst_tokens > p.capacity(dst.ranks):
            return whole  # that node cannot hold it split
        m = max(ceil_div(tokens, size), ceil_div(dst_tokens, dst.ranks))
        z = max((dst.work + p.work_s[s]) / dst.ranks, (src.work - p.work_s[s]) / src.ranks)
        for b in bins:
            if b is not src and b is not dst and b.fresh:
                if b.packed is None:
                    return whole
                z, m = max(z, b.packed[1]), max(m, b.packed[2])
        split = cost.full_layers * full_layer_seconds(cost, size, full, m)
        split += cost.sparse_layers * z
        return min(whole, split)

    def _trial(self, b: _Bin, s: int, sign: int, evaluate: Callable[[], float]) -> float:
        """``evaluate()`` with ``s`` added to (``sign`` 1) or taken out of (-1) bin ``b``'s
        edited children, then everything restored."""
        if self.whole[b.parent]:  # unrepacked: charged as a re-pack, which it replaces
            edited = None
            self.work += len(b.samples)
        else:  # exact: re-packed (and charged) when evaluated
            edited = None if self.exact else self._edited(b, s, sign)
        saved = (b.packed, b.fresh)
        self._add(b, s, sign)
        if edited is not None:
            b.packed, b.fresh = edited, True
        try:
            return evaluate()
        finally:
            self._add(b, s, -sign)
            b.packed, b.fresh = saved

    def _commit(self, s: int, src: _Bin, dst: _Bin) -> None:
        """Apply a tried move as it was tried (both bins' edited children), then re-pack each
        changed bin (``children_of_segment``) and keep that where its parent gets faster."""
        edits = [
            (b, sign, None if self.whole[b.parent] or self.exact else self._edited(b, s, sign))
            for b, sign in ((src, -1), (dst, 1))
        ]
        for b, sign, edited in edits:
            self._add(b, s, sign)
            if edited is not None:
                b.packed, b.fresh = edited, True
        for b, _, edited in edits:
            if edited is None:
                continue  # re-packed when next evaluated
            kept = self._time(b.parent)[0]
            b.fresh = False
            if self._time(b.parent)[0] >= kept:
                b.packed, b.fresh = edited, True

    def members(self) -> list[list[int]]:
        return [sorted(s for b in bins for s in b.samples) for bins in self.bins]


def _max_pairs(problem: Problem, repack: bool) -> int:
    if not repack:
        return MAX_WHOLE_PAIRS
    return MAX_TIGHT_PAIRS if problem.fill >= TIGHT_FILL else MAX_PAIRS


def _pairs(problem: Problem, sizes: Sequence[int]) -> int:
    return problem.num_samples * sum(-(-size // problem.cost.gpus_per_node) for size in sizes)


def small_request(problem: Problem, sizes: Sequence[int]) -> bool:
    """At most ``SECOND_SEED_PAIRS`` (sample x node-bin) pairs: small enough for the extra
    seeds a latency target at 64 GPUs cannot afford."""
    return _pairs(problem, sizes) <= SECOND_SEED_PAIRS


def node_seed(
    problem: Problem,
    sizes: Sequence[int],
    clock: Budget | None = None,
    repack: bool = True,
    fixed: Sequence[Sequence[int]] | None = None,
) -> tuple[list[list[int]], tuple[Parent, ...]] | None:
    """Membership and layout of the node-level LPT + moves; None if LPT runs out of memory.
    Without ``repack`` every parent is one whole bin (mode ``sizing`` on the upstream sizes);
    with ``fixed`` every parent keeps those members (mode ``repack``: only nodes change).
    The fastest of ``node_seeds`` (ties: the first)."""
    found = node_seeds(problem, sizes, clock, repack, fixed)
    return min(found, key=lambda seed: _slowest(problem, seed[1]), default=None)


def node_seeds(
    problem: Problem,
    sizes: Sequence[int],
    clock: Budget | None = None,
    repack: bool = True,
    fixed: Sequence[Sequence[int]] | None = None,
) -> list[tuple[list[list[int]], tuple[Parent, ...]]]:
    """Every layout ``node_seed`` chooses from. Small requests run the stage twice, from two
    LPT rules (``SECOND_SEED_PAIRS``); a little larger ones too, at half the move work each
    (``TWO_RULE_PAIRS``).

    Repacked, small requests also run both rules with moves that re-pack both bins from the
    first move on, as the tests' reference heuristic does (``EXACT_FIRST_SHARE`` of the work
    each): the edits' moves keep children finer than a re-pack makes them, and the layout
    they reach can be a local optimum of the re-packing moves well above where those moves
    lead from LPT (one 8-rank parent of 2-GPU nodes: 0.58% behind the reference with the
    edits first, 0.22% ahead with these seeds; a free membership of 64 GPUs with mixed loader
    sizes: 0.23% behind, 0.20% ahead)."""
    if clock is not None and clock.expired():
        return []
    limit = MIXED_TWO_RULE_PAIRS if len(set(sizes)) > 1 else TWO_RULE_PAIRS
    medium = not small_request(problem, sizes) and _pairs(problem, sizes) <= limit
    share = TWO_RULE_SHARE if medium and fixed is None else 1.0
    run = _seed_run(problem, sizes, clock, repack, fixed, by_work=False, share=share)
    found = [] if run is None else [_result(run)]
    if run is not None and run.split_whole and not (clock is not None and clock.expired()):
        other = _seeded(problem, sizes, clock, repack, fixed, False, share=share, few_whole=True)
        if other is not None:
            found.append(other)
    if medium and not (clock is not None and clock.expired()):
        other = _seeded(problem, sizes, clock, repack, fixed, by_work=True, share=share)
        if other is not None:
            found.append(other)
    if not small_request(problem, sizes):
        return found
    variants = [(True, False)]
    if repack:
        variants += [(False, True), (True, True)]
    for by_work, exact_first in variants:
        if clock is not None and clock.expired():
            break
        other = _seeded(problem, sizes, clock, repack, fixed, by_work, exact_first)
        if other is not None:
            found.append(other)
    return found


def _slowest(problem: Problem, layout: tuple[Parent, ...]) -> float:
    return max(parent_time(par, problem.cost, problem.costs) for par in layout)


def _seeded(
    problem: Problem,
    sizes: Sequence[int],
    clock: Budget | None,
    repack: bool,
    fixed: Sequence[Sequence[int]] | None,
    by_work: bool,
    exact_first: bool = False,
    share: float = 1.0,
    few_whole: bool = False,
) -> tuple[list[list[int]], tuple[Parent, ...]] | None:
    run = _seed_run(problem, sizes, clock, repack, fixed, by_work, exact_first, share, few_whole)
    return None if run is None else _result(run)


def _result(seed: NodeSeed) -> tuple[list[list[int]], tuple[Parent, ...]]:
    return seed.members(), tuple(seed.layout(j) for j in range(len(seed.sizes)))


def _seed_run(
    problem: Problem,
    sizes: Sequence[int],
    clock: Budget | None,
    repack: bool,
    fixed: Sequence[Sequence[int]] | None,
    by_work: bool,
    exact_first: bool = False,
    share: float = 1.0,
    few_whole: bool = False,
) -> NodeSeed | None:
    """The stage run once: LPT by one rule, then the moves; None where LPT runs out of memory
    or the request is too large for it."""
    seed = NodeSeed(problem, sizes, repack, by_work)
    seed.few_whole = few_whole
    pairs = problem.num_samples * sum(len(bins) for bins in seed.bins)
    if pairs > _max_pairs(problem, repack):
        return None
    seed.exact_moves = (fixed is not None and pairs <= TWO_RULE_PAIRS) or (
        exact_first and pairs <= SECOND_SEED_PAIRS
    )
    seed.exact = exact_first and seed.exact_moves
    if clock is not None:  # the request's deterministic work budget
        scale = min(MAX_WORK_SCALE, max(1.0, pairs / WORK_PAIRS))
        share = EXACT_FIRST_SHARE if exact_first else share
        seed.move_work = clock.move_evals(round(MOVE_WORK * scale * share))
    if not seed.place(fixed):
        return None
    seed.improve(clock)
    return seed


class _LightestBins:
    """LPT's bin choice without a scan of every bin per sample (which made the stage
    quadratic: 45 ms at 256 GPUs, 168 ms at 512, ~0.65 s at 1,024 before).

    Every bin of a parent that is not whole, and every whole parent (one bin), sits in one
    heap per (ranks, parent size, whole), by ``NodeSeed._lpt_load``: within one heap a sample
    adds the same per-rank seconds to every entry, so the order after it is the order before
    it, and each heap's lightest entry with memory for the sample is its candidate (entries
    without room are set aside and put back). A bin's load also counts its parent's
    full-attention layers, which its sibling nodes change: an entry carries its parent's
    version and is re-keyed when popped stale (loads only grow during the placement, so a
    stale entry is never popped too late). The pick is the best candidate by
    ``NodeSeed._key``, as the scan chose."""

    def __init__(self, seed: NodeSeed) -> None:
        self.seed = seed
        self.version = [0] * len(seed.bins)
        self.heaps: dict[tuple[int, int, bool], list[_Entry]] = {}
        for j, bins in enumerate(seed.bins):
            for i in [WHOLE] if seed.whole[j] else range(len(bins)):
                self._push(j, i)
        self.popped: dict[tuple[int, int, bool], list[_Entry]] = {}
        self.parked: dict[tuple[int, int, bool], list[tuple[int, _Entry]]] = {}
        """Per heap, the entries popped without memory for a sample, by their free tokens then
        (most first, negated): memory only fills during the placement, so an entry can only
        have room again for a shorter sample, and stays out of the heap until one comes (on a
        loader's packed step most bins are full long before the placement ends: every pick
        popped and pushed back ~28 of them at 1,024 GPUs)."""

    def went_whole(self, j: int) -> None:
        """Parent ``j`` takes samples as one bin from now on (its bins' entries are dropped
        when popped)."""
        self._push(j, WHOLE)

    def _push(self, j: int, i: int) -> None:
        seed = self.seed
        size = seed.sizes[j]
        if i == WHOLE:
            group, load = (size, size, True), seed._parent_load(j)
        else:
            group, load = (seed.bins[j][i].ranks, size, False), seed._lpt_load(seed.bins[j][i])
        entry = (load, seed.bins[j][0 if i == WHOLE else i].start, j, i, self.version[j])
        heapq.heappush(self.heaps.setdefault(group, []), entry)

    def pick(self, s: int) -> _Bin | None:
        seed, p = self.seed, self.seed.p
        best: tuple[tuple[float, int], _Bin] | None = None
        self.popped = {}
        for group, heap in self.heaps.items():
            ranks, _, whole = group
            aside = self.popped.setdefault(group, [])
            capacity = p.capacity(ranks)
            room = capacity - p.tokens[s]
            parked = self.parked.setdefault(group, [])
            while parked and -parked[0][0] >= p.tokens[s]:  # free memory then: an upper bound
                heapq.heappush(heap, heapq.heappop(parked)[1])
            while heap:
                entry = heap[0]
                _, _, j, i, version = entry
                if not whole and seed.whole[j]:
                    heapq.heappop(heap)  # its parent went whole: it has a whole entry now
                    continue
                if version != self.version[j]:
                    heapq.heappop(heap)
                    self._push(j, i)  # a sibling took samples: re-keyed
                    continue
                b = seed.bins[j][0 if whole else i]
                tokens = seed._parent_tokens(j) if whole else b.tokens
                if tokens > room:
                    heapq.heappush(parked, (tokens - capacity, heapq.heappop(heap)))
                    continue
                aside.append(heapq.heappop(heap))
                key = seed._key(b, s)
                if best is None or key < best[0]:
                    best = (key, b)
                break
        if best is None:
            self.done(None)
        return None if best is None else best[1]

    def done(self, chosen: _Bin | None) -> None:
        """Put the set-aside entries back, those of ``chosen``'s parent (which took a sample)
        re-keyed."""
        if chosen is not None:
            self.version[chosen.parent] += 1
        for group, aside in self.popped.items():
            for entry in aside:
                _, _, j, i, _ = entry
                if chosen is not None and j == chosen.parent:
                    self._push(j, i)
                else:
                    heapq.heappush(self.heaps[group], entry)
        self.popped = {}


WHOLE = -1
"""Bin index of a whole parent's entry in ``_LightestBins``."""

_Entry = tuple[float, int, int, int, int]
"""A heap entry of ``_LightestBins``: load, first rank, parent, bin, parent's version."""


def _top_two(values: list[_Num], none: _Num) -> tuple[tuple[_Num, int], _Num]:
    """The largest value with its first index, and the largest of the others (``none`` when
    there are none)."""
    first = max(range(len(values)), key=values.__getitem__)
    rest = [v for k, v in enumerate(values) if k != first]
    return (values[first], first), max(rest, default=none)
