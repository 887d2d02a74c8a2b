"""Heterogeneous parent sizes, chosen together with membership (modes sizing, repack+sizing).

The same idea as the child packer, one level up: for a target step time ``T`` the samples are
placed longest first, each into the least loaded open parent that stays under ``T``, else into
a new parent of the smallest size that holds it under ``T`` (a long sample gets a wide parent,
short ones share narrow, node-local ones). Parent ranks come from a buddy allocator over the
cluster, so every parent is aligned. Parents whose buddy block stayed free are doubled while
that shortens them; blocks still free become empty parents for the rebalancing that follows.
A bisection on ``T`` finds the tightest packing. Per-parent times are the membership
objectives' estimates (``membership.make_cost_fn``): exact for unrepacked parents, a lower
bound for repacked ones; the planner then solves children for the sizes found.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from solver.buddy import Buddy
from solver.budget import Budget
from solver.membership import Objective, make_cost_fn
from solver.problem import Problem

BISECTION_STEPS = 6


@dataclass
class _OpenParent:
    start: int
    size: int
    full_s: float = 0.0
    sparse_s: float = 0.0
    tokens: int = 0
    single: float = 0.0
    members: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class SizedMembership:
    sizes: list[int]
    """Parent sizes in rank order (aligned, tiling the cluster)."""
    members: list[list[int]]
    estimate_s: float
    """The objective's estimate of the step time for this membership."""


class ParentPacker:
    def __init__(self, problem: Problem, allowed: list[int], objective: Objective) -> None:
        self.p = problem
        self.allowed = sorted(allowed)
        self.cost_fn = make_cost_fn(problem, objective)
        self.repack = objective == "repack"
        self.order = sorted(range(problem.num_samples), key=lambda s: (-problem.tokens[s], s))
        self.capacity = {size: problem.capacity(size) for size in self.allowed}
        self.singles = (
            {size: problem.single_bounds(size) for size in self.allowed} if self.repack else None
        )
        self._alone: dict[tuple[int, int], float] = {}

    def single(self, s: int, size: int) -> float:
        if not self.repack:
            return 0.0
        return self.p.single_bounds(size)[s]

    def cost(self, par: _OpenParent, s: int | None = None) -> float:
        p = self.p
        if s is None:
            return self.cost_fn(par.size, par.full_s, par.sparse_s, par.tokens, par.single)
        return self.cost_fn(
            par.size,
            par.full_s + p.full_s[s],
            par.sparse_s + p.sparse_s[s],
            par.tokens + p.tokens[s],
            max(par.single, self.single(s, par.size)),
        )

    def add(self, par: _OpenParent, s: int) -> None:
        p = self.p
        par.full_s += p.full_s[s]
        par.sparse_s += p.sparse_s[s]
        par.tokens += p.tokens[s]
        par.single = max(par.single, self.single(s, par.size))
        par.members.append(s)

    def pack(self, target: float) -> list[_OpenParent] | None:
        """Parents holding every sample under ``target`` seconds, or None if ranks run out.

        The hot loop of the sizing modes (about eight packs of every sample per request), so
        ``cost`` and ``add`` are inlined here: the same float operations in the same order."""
        p = self.p
        tokens, full_s, sparse_s = p.tokens, p.full_s, p.sparse_s
        capacity = self.capacity
        singles = self.singles
        cost_fn = self.cost_fn
        buddy = Buddy(0, p.cost.world_size)
        parents: list[_OpenParent] = []
        heap: list[tuple[float, int]] = []  # (cost, index) of open parents, least loaded first
        for s in self.order:
            length = tokens[s]
            if heap:
                j = heap[0][1]
                par = parents[j]
                size = par.size
                total = par.tokens + length
                if total <= capacity[size]:
                    full = par.full_s + full_s[s]
                    sparse = par.sparse_s + sparse_s[s]
                    single = par.single
                    if singles is not None:
                        single = max(single, singles[size][s])
                    new = cost_fn(size, full, sparse, total, single)
                    if new <= target:
                        par.full_s, par.sparse_s = full, sparse
                        par.tokens, par.single = total, single
                        par.members.append(s)
                        heapq.heapreplace(heap, (new, j))
                        continue
            opened = self._open(buddy, s, target)
            if opened is None:
                return None
            par, new = opened
            self.add(par, s)
            parents.append(par)
            heapq.heappush(heap, (new, len(parents) - 1))
        self._grow(buddy, parents)
        return parents + [_OpenParent(start, size) for start, size in self._allowed_blocks(buddy)]

    def _allowed_blocks(self, buddy: Buddy) -> list[tuple[int, int]]:
        """Free blocks split in halves until each is an allowed parent size (1 always is)."""
        allowed, out = set(self.allowed), []
        todo = list(buddy.free)
        while todo:
            start, size = todo.pop()
            if size in allowed:
                out.append((start, size))
            else:
                todo += [(start, size // 2), (start + size // 2, size // 2)]
        return out

    def _open(self, buddy: Buddy, s: int, target: float) -> tuple[_OpenParent, float] | None:
        """A new parent for ``s`` and its cost with ``s`` alone (what ``cost`` gives once
        ``s`` is added), or None."""
        for size in self.allowed:
            if self.p.tokens[s] > self.capacity[size] or buddy.smallest_fit(size) is None:
                continue
            alone = self.alone_cost(s, size)
            if alone <= target:
                start = buddy.take(size)
                assert start is not None
                return _OpenParent(start, size), alone
        return None

    def alone_cost(self, s: int, size: int) -> float:
        """``cost`` of a parent of ``size`` holding ``s`` only: the same for every target, so
        memoised across the bisection's packs."""
        key = (s, size)
        memo = self._alone
        if key not in memo:
            memo[key] = self.cost(_OpenParent(0, size), s)
        return memo[key]

    def _grow(self, buddy: Buddy, parents: list[_OpenParent]) -> None:
        """Double the slowest parent into its free buddy block while that shortens it."""
        allowed = set(self.allowed)
        while parents:
            par = max(parents, key=lambda q: (self.cost(q), -q.start))
            if 2 * par.size not in allowed:
                return
            wider = _OpenParent(par.start, 2 * par.size)
            for s in par.members:
                self.add(wider, s)
            if self.cost(wider) >= self.cost(par):
                return
            start = buddy.grow(par.start, par.size, origin=0)
            if start is None:
                return
            wider.start = start
            parents[parents.index(par)] = wider

    def solve(
        self, low: float, high: float, clock: Budget | None = None, below: float = math.inf
    ) -> SizedMembership | None:
        """Tightest packing found by bisection on the target between ``low`` and ``high``,
        cut short (keeping the best so far) when ``clock`` runs out.

        ``below``: the caller only has use for packings whose estimate is under it (a layout
        that fast is in hand, and the estimates bound layouts from below), so only targets
        under it are searched, to the resolution the whole range would have had: each halving
        of the range saves a bisection step."""
        steps = BISECTION_STEPS
        if low < below < high:
            steps = max(1, steps - int(math.log2((high - low) / (below - low))))
            high = below
        best: list[_OpenParent] | None = None
        best_t = math.inf

        def consider(target: float) -> bool:
            nonlocal best, best_t
            parents = self.pack(target)
            if parents is None:
                return False
            t = max(self.cost(q) for q in parents)
            if t < best_t:
                best, best_t = parents, t
            return True

        top = high
        fallback: list[_OpenParent] | None = None
        top_tried = False
        for _ in range(steps):
            if clock is not None and clock.expired():
                break
            mid = (low + high) / 2
            if consider(mid):
                high = mid
                continue
            low = mid
            if best is None and not top_tried:
                # Nothing packed yet: if the loosest target does not pack either, give up. On
                # a packing loader's steps (>= 99% of memory) no target ever packs (all 120
                # solves of 60 packed 32/64-GPU steps), and the other bisection steps were
                # 110-170 ms of each 1,024-GPU step.
                top_tried, fallback = True, self.pack(top)
                if fallback is None:
                    return None
        # The packing at ``top`` is only the fallback, used when no tighter target packed:
        # a packing's cost is at most its target, so a tighter one that packs all but always
        # costs less (a greedy packing ``top`` tighter than every lower target is possible in
        # principle; no plan of the test scenarios or bench steps changed).
        if best is None:
            if not top_tried:
                fallback = self.pack(top)
            if fallback is None:
                return None
            best, best_t = fallback, max(self.cost(q) for q in fallback)
        ordered = sorted(best, key=lambda q: q.start)
        return SizedMembership(
            sizes=[q.size for q in ordered],
            members=[sorted(q.members) for q in ordered],
            estimate_s=best_t,
        )
