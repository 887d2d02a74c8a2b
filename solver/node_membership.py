"""Membership built at node level: samples onto the nodes of fixed parents, children per node.

The parent-level ``repack`` estimate of ``membership`` sees a parent as one pool of ranks; a
layout is really decided per node (children never leave one), and memory binds per node too.
This stage works on *bins*, the nodes of every parent wider than a node and every narrower
parent as a whole:

1. LPT: samples by decreasing work, each to the bin whose per-rank work stays lowest among those
   with memory for it; a sample longer than any node's memory makes the least loaded parent
   that holds it *whole* (unrepacked), and that parent then takes samples as one bin;
2. every bin gets its fastest uniform child size (``node_packing``), every parent the faster
   of that and its unrepacked layout, evaluated exactly under the cost model;
3. greedy moves out of the critical parent: its busiest bin's heaviest samples to the least
   loaded bins of any parent, while the larger of the two parents' exact times drops, under a
   deterministic budget of evaluations.

The planner uses the result as one more candidate membership (and layout) of ``repack+parent``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from solver.budget import Budget
from solver.cost_model import ceil_div, full_layer_seconds, unrepacked_parent_seconds
from solver.layout import Child, Parent, parent_starts, unrepacked
from solver.node_packing import children_of_segment
from solver.problem import Problem

MOVE_WORK = 12_000
"""Deterministic work limit of the move phase: samples re-packed into children, summed over
the bins every tried move re-evaluates (small requests try every move, large ones the most
promising: heaviest samples of the busiest bins to the least loaded bins)."""


MAX_PAIRS = 60_000
"""Above this many (sample x bin) pairs the stage is skipped: its placement scans every bin per
sample, which would outlast a 1,024-GPU step's latency budget (the greedy path covers those)."""


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


class NodeSeed:
    def __init__(self, problem: Problem, sizes: Sequence[int], repack: bool = True) -> None:
        self.p = problem
        self.sizes = list(sizes)
        self.starts = parent_starts(sizes)
        g = problem.cost.gpus_per_node
        self.whole = [not repack] * len(sizes)
        self.bins: list[list[_Bin]] = [
            [_Bin(j, start + o, min(size, g)) for o in range(0, size, min(size, g))]
            for j, (start, size) in enumerate(zip(self.starts, sizes, strict=True))
        ]
        self.times: list[float] = []
        self.fixed = False
        """Membership is given: moves stay between the nodes of one parent."""
        self.work = 0
        self.move_work = MOVE_WORK
        """The request's share of ``MOVE_WORK`` (``Budget.evals``)."""

    # --- bins -------------------------------------------------------------------------------
    def _add(self, b: _Bin, s: int, sign: int = 1) -> None:
        p = self.p
        if sign > 0:
            b.samples.append(s)
        else:
            b.samples.remove(s)
        b.tokens += sign * p.tokens[s]
        b.work += sign * p.work_s[s]
        b.full_s += sign * p.full_s[s]
        b.sparse_s += sign * p.sparse_s[s]
        b.fresh = False

    def _parent_tokens(self, j: int) -> int:
        return sum(b.tokens for b in self.bins[j])

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
        for s in sorted(range(p.num_samples), key=lambda s: (-p.work_s[s], s)):
            fits = [
                b
                for b in self._open_bins()
                if self._room(b, s) and (not self.fixed or b.parent == owner[s])
            ]
            if fits:
                b = min(fits, key=lambda b: (self._load(b) + p.work_s[s] / b.ranks, b.start))
                self._add(b, s)
                continue
            holders = [
                j
                for j in range(len(self.sizes))
                if self._parent_tokens(j) + p.tokens[s] <= p.capacity(self.sizes[j])
                and (not self.fixed or j == owner[s])
            ]
            if not holders:
                return False
            j = min(holders, key=lambda j: (sum(b.work for b in self.bins[j]) / self.sizes[j], j))
            self.whole[j] = True
            self._add(self.bins[j][0], s)
        self.times = [self._time(j)[0] for j in range(len(self.sizes))]
        return True

    def _packed(self, b: _Bin) -> tuple[list[Child], float, int] | None:
        if not b.fresh:
            size = self.sizes[b.parent]
            b.packed = children_of_segment(self.p, b.start, b.ranks, b.samples, size)
            b.fresh = True
        return b.packed

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
        of it is at least that slow on average) and its busiest rank's token share."""
        cost, size, bins = self.p.cost, self.sizes[j], self.bins[j]
        full = sum(b.full_s for b in bins)
        tokens = sum(b.tokens for b in bins)
        whole = unrepacked_parent_seconds(cost, size, full, sum(b.sparse_s for b in bins), tokens)
        if self.whole[j] or size == 1:
            return whole
        m = max(ceil_div(tokens, size), ceil_div(changed.tokens, changed.ranks))
        split = cost.full_layers * full_layer_seconds(cost, size, full, m)
        split += cost.sparse_layers * changed.work / changed.ranks
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
        while self.work < self.move_work and not (clock is not None and clock.expired()):
            if not self._move_one():
                return

    def _move_one(self) -> bool:
        """The first improving move of one sample out of the critical parent: a sample whose
        removal alone does not bring that parent under the step is skipped outright."""
        p = self.p
        c = max(range(len(self.times)), key=lambda j: (self.times[j], -j))
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
        for src in sources:
            for s in sorted(src.samples, key=p.heavy_rank.__getitem__):
                if self.work >= self.move_work:
                    return False
                saved = (src.packed, src.fresh)
                self._add(src, s, -1)
                self.work += len(src.samples)
                t_without = self._time(c)[0]
                if t_without < target and self._place_moved(
                    c, src, s, t_without, target, receivers
                ):
                    return True
                self._add(src, s)
                src.packed, src.fresh = saved
        return False

    def _place_moved(
        self, c: int, src: _Bin, s: int, t_without: float, target: float, receivers: list[_Bin]
    ) -> bool:
        """Put ``s`` (already out of ``src``) into the first receiver that keeps both parents
        under ``target``; False leaves it out."""
        for dst in receivers:
            if dst is src or not self._room(dst, s) or self.work >= self.move_work:
                continue
            q = dst.parent
            saved = (dst.packed, dst.fresh)
            self._add(dst, s)
            if q != c and self._time_floor(q, dst) >= target:
                self._add(dst, s, -1)
                dst.packed, dst.fresh = saved
                continue
            self.work += len(dst.samples)
            t_q = self._time(q)[0]
            if t_q < target:
                t_c = t_q if q == c else t_without
                self.times[c], self.times[q] = t_c, t_q
                return True
            self._add(dst, s, -1)
            dst.packed, dst.fresh = saved
        return False

    def members(self) -> list[list[int]]:
        return [sorted(s for b in bins for s in b.samples) for bins in self.bins]


def node_seed(
    problem: Problem,
    sizes: Sequence[int],
    clock: Budget | None = None,
    repack: bool = True,
    fixed: Sequence[Sequence[int]] | None = None,
) -> tuple[list[list[int]], tuple[Parent, ...]] | None:
    """Membership and layout of the node-level LPT + moves; None if LPT runs out of memory.
    Without ``repack`` every parent is one whole bin (mode ``sizing`` on the upstream sizes);
    with ``fixed`` every parent keeps those members (mode ``repack``: only nodes change)."""
    seed = NodeSeed(problem, sizes, repack)
    if clock is not None:
        seed.move_work = clock.evals(MOVE_WORK)  # the request's deterministic work budget
    if problem.num_samples * sum(len(bins) for bins in seed.bins) > MAX_PAIRS:
        return None
    if not seed.place(fixed):
        return None
    seed.improve(clock)
    layout = tuple(seed.layout(j) for j in range(len(sizes)))
    return seed.members(), layout
