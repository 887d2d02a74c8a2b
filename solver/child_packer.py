"""Greedy child layout of one parent: node-local children of 1/2/4/8 ranks, balanced.

For a target sparse-layer time ``Z`` the packer places samples heaviest first, into the fullest
open child that stays under ``Z``, else into a new child of the smallest size that can take the
sample under ``Z`` (small children pay less all-to-all). Child ranks come from a buddy allocator
per node, so every child is contiguous and aligned. Children whose buddy block stayed free are
then doubled while that shortens them. A bisection on ``Z`` finds the tightest packing; the
unrepacked layout is always a candidate, so the result is never slower than the baseline.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from solver.buddy import Buddy
from solver.cost_model import ceil_div, full_layer_seconds
from solver.layout import Child, Parent, unrepacked
from solver.node_packing import pack_by_nodes
from solver.problem import Problem

BISECTION_STEPS = 6
INITIAL_SLACK = 0.02
MAX_GROWTHS = 12


@dataclass(slots=True)
class _OpenChild:
    start: int
    size: int
    sparse_s: float
    tokens: int
    samples: list[int]
    cap: int = 0
    """Most tokens this child may hold in the current pack (``size * mcap``)."""
    per_token: float = 0.0
    """``child_layer_seconds``' per-token term for ``size``, looked up once."""
    fixed: float = 0.0
    """``child_layer_seconds``' fixed term for ``size``."""


@dataclass(frozen=True)
class ChildSolution:
    parent: Parent
    seconds: float


class ChildPacker:
    """Packs the members of one parent; reusable across targets."""

    def __init__(self, problem: Problem, start: int, size: int, members: Sequence[int]) -> None:
        self.p = problem
        self.start, self.size = start, size
        rank = problem.heavy_rank  # the (-work_s, index) order, precomputed per problem
        self.members = sorted(members, key=rank.__getitem__)
        g = problem.cost.gpus_per_node
        seg = min(size, g)
        self.segments = [(start + o, seg) for o in range(0, size, seg)]
        self.sizes = [k for k in problem.child_sizes if k <= seg]
        self.full_s = sum(problem.full_s[s] for s in members)
        # The packs of one solve evaluate ``child_layer_seconds`` hundreds of thousands of
        # times at 1,024 GPUs: its per-size terms are looked up once here, and each member's
        # time alone in a child of each size (what ``_open`` tests) is computed once per solve.
        self._terms: dict[int, tuple[float, float]] = {}
        self.z_mattered = False
        self._items = [(s, problem.tokens[s], problem.sparse_s[s]) for s in self.members]
        self._alone = [(k, problem.alone_s[k]) for k in self.sizes]
        # Fewest tokens and least sparse time among the members from the i-th on (``_full``).
        self._least_tokens = [0] * len(self._items)
        self._least_sparse = [0.0] * len(self._items)
        least_tokens, least_sparse = math.inf, math.inf
        for i in reversed(range(len(self._items))):
            _, length, sparse = self._items[i]
            least_tokens, least_sparse = min(least_tokens, length), min(least_sparse, sparse)
            self._least_tokens[i], self._least_sparse[i] = int(least_tokens), least_sparse

    # --- evaluation ---------------------------------------------------------------------
    def terms(self, size: int) -> tuple[float, float]:
        """``child_layer_seconds``' per-token and fixed terms for a child of ``size`` (the
        same float operations, so ``child_s`` returns the same bits)."""
        terms = self._terms.get(size)
        if terms is None:
            cost = self.p.cost
            per_token = cost.linear_seconds_per_token + cost.a2a_seconds_per_token(size)
            terms = self._terms[size] = (per_token, cost.layer_fixed_seconds(size))
        return terms

    def child_s(self, size: int, sparse: float, tokens: int) -> float:
        """``child_layer_seconds``, bit for bit, with the per-size terms memoised."""
        if tokens == 0:
            return 0.0
        per_token, fixed = self.terms(size)
        return sparse / size + ceil_div(tokens, size) * per_token + fixed

    def parent_s(self, children: Sequence[_OpenChild]) -> float:
        cost = self.p.cost
        m = max((ceil_div(c.tokens, c.size) for c in children), default=0)
        z = max((self.child_s(c.size, c.sparse_s, c.tokens) for c in children), default=0.0)
        full = full_layer_seconds(cost, self.size, self.full_s, m)
        return cost.full_layers * full + cost.sparse_layers * z

    def lower_bounds(self) -> tuple[float, int]:
        """No child layout beats this sparse-layer time nor this busiest-rank token count.

        The first is every rank busy with no all-to-all, or the slowest member alone in its best
        child; the second is the even spread, or that member's share of its best child.
        """
        p = self.p
        z = sum(p.work_s[s] for s in self.members) / self.size
        m = ceil_div(sum(p.tokens[s] for s in self.members), self.size)
        choices = p.single_choices(self.size)
        for s in self.members:
            t, n = choices[s]
            if math.isinf(t):
                return math.inf, m
            z, m = max(z, t), max(m, n)
        return z, m

    # --- packing ------------------------------------------------------------------------
    def pack(self, z: float, mcap: int) -> list[_OpenChild] | None:
        """Children with sparse-layer time <= z and at most ``mcap`` tokens on any rank.

        Sets ``z_mattered``: whether any test against ``z`` failed. A pack that fails without
        one would take the same steps, and fail the same way, under any larger ``z``."""
        p = self.p
        mcap = min(mcap, p.cost.max_tokens_per_rank)
        self.z_mattered = False
        buddies = [Buddy(s, n) for s, n in self.segments]
        children: list[_OpenChild] = []
        live: list[_OpenChild] = []  # children some remaining member may still fit, in order
        for i, (s, length, sparse) in enumerate(self._items):
            best, best_t = None, -1.0
            for c in live:
                tokens = c.tokens + length
                if tokens > c.cap:
                    continue
                # child_s(c.size, c.sparse_s + sparse, tokens), inlined: the hottest line
                if tokens == 0:
                    t = 0.0
                else:
                    k = c.size
                    t = (c.sparse_s + sparse) / k + (-(-tokens // k)) * c.per_token + c.fixed
                if t > z:
                    self.z_mattered = True
                elif t > best_t:
                    best, best_t = c, t
            if best is None:
                # Children full even for the smallest remaining member stay out of later scans
                # (no choice changes: they would be skipped anyway). Swept only here, when the
                # scan found no room, so the sweep costs little.
                live = self._unfilled(live, i, z)
                best = self._open(buddies, children, s, length, z, mcap)
                if best is None:
                    return None
                live.append(best)
            best.tokens += length
            best.sparse_s += sparse
            best.samples.append(s)
        self._grow(buddies, children)
        # Idle ranks become empty children of allowed sizes: on nodes wider than the largest
        # child size (16+ GPUs), a free buddy block can be wider than any child may be.
        largest = max(self.sizes)
        return children + [
            _OpenChild(start + offset, min(size, largest), 0.0, 0, [])
            for buddy in buddies
            for start, size in buddy.free
            for offset in range(0, size, largest)
        ]

    def _unfilled(self, children: list[_OpenChild], i: int, z: float) -> list[_OpenChild]:
        """``children`` that a member from the ``i``-th on may still fit under ``z``: a child
        too full for one with the fewest tokens and the least sparse time among them is too
        full for all of them (``child_s`` only grows with either, float rounding included)."""
        least_tokens, least_sparse = self._least_tokens[i], self._least_sparse[i]
        kept = []
        for c in children:
            tokens = c.tokens + least_tokens
            if tokens > c.cap:
                continue
            if tokens != 0:  # child_s(c.size, c.sparse_s + least_sparse, tokens) > z, inlined
                k = c.size
                if (c.sparse_s + least_sparse) / k + (-(-tokens // k)) * c.per_token + c.fixed > z:
                    self.z_mattered = True
                    continue
            kept.append(c)
        return kept

    def _open(
        self,
        buddies: list[Buddy],
        children: list[_OpenChild],
        s: int,
        length: int,
        z: float,
        mcap: int,
    ) -> _OpenChild | None:
        """A new child for sample ``s``: of the smallest size that takes it under ``z``, in the
        segment whose smallest fitting free block is smallest (the first such on ties)."""
        for k, alone in self._alone:
            if length > k * mcap:
                continue
            if alone[s] > z:
                self.z_mattered = True
                continue
            # The smallest free block of at least k over all segments (Buddy.smallest_fit per
            # segment, then the least (fit, segment)), in one pass.
            best_fit, best_i = 0, -1
            for i, b in enumerate(buddies):
                for _, fit in b.free:
                    if fit >= k and (best_i < 0 or fit < best_fit):
                        best_fit, best_i = fit, i
            if best_i < 0:
                continue
            start = buddies[best_i].take(k)
            assert start is not None
            per_token, fixed = self.terms(k)
            child = _OpenChild(start, k, 0.0, 0, [], k * mcap, per_token, fixed)
            children.append(child)
            return child
        return None

    def _grow(self, buddies: list[Buddy], children: list[_OpenChild]) -> None:
        """Double the slowest child into its free buddy block while that shortens it."""
        seg_of = {s: i for i, (s, _) in enumerate(self.segments)}
        seg_size = self.segments[0][1]
        while children:
            c = max(children, key=lambda c: (self.child_s(c.size, c.sparse_s, c.tokens), -c.start))
            if 2 * c.size > seg_size or 2 * c.size not in self.sizes:
                return
            base = c.start - (c.start - self.start) % seg_size
            now = self.child_s(c.size, c.sparse_s, c.tokens)
            if self.child_s(2 * c.size, c.sparse_s, c.tokens) >= now:
                return
            start = buddies[seg_of[base]].grow(c.start, c.size, origin=base)
            if start is None:
                return
            c.start, c.size = start, 2 * c.size
            c.per_token, c.fixed = self.terms(c.size)  # (cap no longer read: packing is over)

    # --- search -------------------------------------------------------------------------
    def to_parent(self, children: Sequence[_OpenChild]) -> Parent:
        ordered = sorted(children, key=lambda c: c.start)
        return Parent(
            self.start,
            self.size,
            tuple(Child(c.start, c.size, tuple(c.samples)) for c in ordered),
        )

    def solve(self, target: float | None = None) -> ChildSolution:
        """Best packing found by bisecting a common slack on both bounds (or a single pack
        sized for ``target`` seconds if that meets it)."""
        p = self.p
        base = unrepacked(self.start, self.size, self.members)
        sparse = sum(p.sparse_s[s] for s in self.members)
        tokens = sum(p.tokens[s] for s in self.members)
        best = ChildSolution(
            base, self.parent_s([_OpenChild(self.start, self.size, sparse, tokens, [])])
        )
        if self.size == 1:
            return best  # one rank: its only child is the parent itself
        z0, m0 = self.lower_bounds()
        if math.isinf(z0) or not self.members:
            return best
        by_nodes = pack_by_nodes(p, self.start, self.size, self.members)
        if by_nodes is not None and by_nodes[1] < best.seconds:
            # Nodes first: the only packing that fits when memory is tight, often the best.
            best = ChildSolution(*by_nodes)

        # Per token cap (as ``pack`` clamps it): the least z whose pack failed without any
        # test against z failing, so every pack with that cap and a z at least that fails too
        # (at 1,024 GPUs most parents are token-bound and the slack growth repeats such packs).
        hopeless: dict[int, float] = {}

        def consider(slack: float) -> bool:
            nonlocal best
            mcap = p.cost.max_tokens_per_rank if math.isinf(slack) else math.floor(m0 * (1 + slack))
            z = z0 * (1 + slack)
            cap = min(mcap, p.cost.max_tokens_per_rank)
            if z >= hopeless.get(cap, math.inf):
                return False
            children = self.pack(z, mcap)
            if children is None:
                if not self.z_mattered:
                    hopeless[cap] = min(z, hopeless.get(cap, math.inf))
                return False
            t = self.parent_s(children)
            if t < best.seconds:
                best = ChildSolution(self.to_parent(children), t)
            return True

        if target is not None:
            slack = max(0.0, (target / self.lower_bound_s(z0, m0)) - 1)
            if consider(slack) and best.seconds <= target:
                return best
        lo, hi = 0.0, INITIAL_SLACK
        if consider(lo):
            return best
        for _ in range(MAX_GROWTHS):
            if consider(hi):
                break
            lo, hi = hi, hi * 2
        else:
            return best
        for _ in range(BISECTION_STEPS):
            mid = (lo + hi) / 2
            if consider(mid):
                hi = mid
            else:
                lo = mid
        return best

    def lower_bound_s(self, z0: float, m0: int) -> float:
        cost = self.p.cost
        full = full_layer_seconds(cost, self.size, self.full_s, m0)
        return cost.full_layers * full + cost.sparse_layers * z0
