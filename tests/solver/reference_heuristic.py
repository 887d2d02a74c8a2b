"""A simple reference planner the real one must never lose to (issue: never beaten by a simple
heuristic). Written independently of the solver's search code; it only shares the layout types
and the cost model's evaluation, which define what a plan costs.

1. LPT of samples onto *bins*: the nodes of every parent (a parent narrower than a node is one
   bin). A sample longer than a node's memory makes its parent whole (unrepacked), chosen as
   the least loaded parent with room.
2. Best child size per bin: for every child size ``k``, LPT of the bin's samples onto its
   ``q / k`` children of ``k`` ranks within memory; the fastest ``k`` is kept. A parent that
   is faster unrepacked stays unrepacked.
3. Greedy moves out of the critical parent: a sample of the critical parent moves to another
   bin (of any parent, or of the same parent when membership is fixed) while that lowers the
   larger of the two parents' exact times.

Without repacking (mode ``sizing``) the same LPT + moves run on whole parents.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from solver.cost_model import child_layer_seconds
from solver.layout import Child, Layout, Parent, evaluate, parent_starts, parent_time, unrepacked
from solver.problem import Problem

MAX_MOVES = 200


@dataclass
class _Bin:
    parent: int
    start: int
    ranks: int
    samples: list[int] = field(default_factory=list)

    def tokens(self, p: Problem) -> int:
        return sum(p.tokens[s] for s in self.samples)

    def key(self) -> tuple[int, int, tuple[int, ...]]:
        """What ``_lpt_children`` depends on: LPT sorts the samples, so their order does not
        count."""
        return (self.start, self.ranks, tuple(sorted(self.samples)))

    def children(self, p: Problem, memo: dict[object, list[Child] | None]) -> list[Child] | None:
        key = self.key()
        if key not in memo:
            memo[key] = _lpt_children(p, self.samples, self.start, self.ranks)
        return memo[key]


def _lpt_children(p: Problem, samples: Sequence[int], start: int, q: int) -> list[Child] | None:
    """Fastest uniform child size for a bin of ``q`` ranks (LPT on work, memory-checked)."""
    best: tuple[float, list[Child]] | None = None
    for k in p.child_sizes:
        if k > q:
            break
        n = q // k
        load, toks, sparse = [0.0] * n, [0] * n, [0.0] * n
        groups: list[list[int]] = [[] for _ in range(n)]
        ok = True
        for s in sorted(samples, key=lambda s: (-p.work_s[s], s)):
            room = [i for i in range(n) if toks[i] + p.tokens[s] <= p.capacity(k)]
            if not room:
                ok = False
                break
            i = min(room, key=lambda i: (load[i], i))
            groups[i].append(s)
            load[i] += p.work_s[s]
            toks[i] += p.tokens[s]
            sparse[i] += p.sparse_s[s]
        if not ok:
            continue
        z = max(child_layer_seconds(p.cost, k, sparse[i], toks[i]) for i in range(n))
        if best is None or z < best[0]:
            best = (z, [Child(start + i * k, k, tuple(groups[i])) for i in range(n)])
    return None if best is None else best[1]


class Reference:
    def __init__(self, p: Problem, sizes: Sequence[int], repack: bool) -> None:
        self.p, self.sizes, self.repack = p, list(sizes), repack
        self.starts = parent_starts(sizes)
        g = p.cost.gpus_per_node
        self.whole = [not repack] * len(sizes)
        # Pure functions of a bin's (a parent's) sample set, memoised: the moves re-try the
        # same sets after every accepted move, which changes only two bins (the tests' runtime).
        self.children_memo: dict[object, list[Child] | None] = {}
        self.time_memo: dict[object, float] = {}
        self.bins: list[list[_Bin]] = []
        for j, (start, size) in enumerate(zip(self.starts, sizes, strict=True)):
            q = size if (size <= g or not repack) else g
            self.bins.append([_Bin(j, start + o, q) for o in range(0, size, q)])

    def parent(self, j: int) -> Parent | None:
        """Parent ``j`` at its faster layout, None if its samples overflow its memory."""
        p, size, start = self.p, self.sizes[j], self.starts[j]
        members = [s for b in self.bins[j] for s in b.samples]
        if sum(p.tokens[s] for s in members) > p.capacity(size):
            return None
        whole = unrepacked(start, size, members)
        if self.whole[j]:
            return whole
        children: list[Child] = []
        for b in self.bins[j]:
            kids = b.children(p, self.children_memo)
            if kids is None:
                return whole
            children += kids
        split = Parent(start, size, tuple(children))
        t = parent_time
        return split if t(split, p.cost, p.costs) < t(whole, p.cost, p.costs) else whole

    def time(self, j: int) -> float:
        key = (self.starts[j], self.sizes[j], self.whole[j], tuple(b.key() for b in self.bins[j]))
        if key not in self.time_memo:
            parent = self.parent(j)
            p = self.p
            self.time_memo[key] = (
                float("inf") if parent is None else parent_time(parent, p.cost, p.costs)
            )
        return self.time_memo[key]

    def place(self, samples: Sequence[int]) -> bool:
        """LPT onto bins; False when a sample finds no memory."""
        p = self.p
        for s in sorted(samples, key=lambda s: (-p.work_s[s], s)):
            options = []
            for j, bins in enumerate(self.bins):
                if self.whole[j] or len(bins) == 1:
                    total = sum(b.tokens(p) for b in bins)
                    if total + p.tokens[s] <= p.capacity(self.sizes[j]):
                        ranks = self.sizes[j]
                        load = sum(p.work_s[u] for b in bins for u in b.samples) / ranks
                        options.append((load + p.work_s[s] / ranks, j, 0))
                    continue
                for i, b in enumerate(bins):
                    if b.tokens(p) + p.tokens[s] <= p.capacity(b.ranks):
                        load = sum(p.work_s[u] for u in b.samples) / b.ranks
                        options.append((load + p.work_s[s] / b.ranks, j, i))
            if not options:
                # longer than any node: a parent with room becomes whole
                for j in range(len(self.bins)):
                    total = sum(b.tokens(p) for b in self.bins[j])
                    if total + p.tokens[s] <= p.capacity(self.sizes[j]):
                        load = sum(p.work_s[u] for b in self.bins[j] for u in b.samples)
                        options.append((load / self.sizes[j], j, 0))
                if not options:
                    return False
                _, j, _ = min(options)
                self.whole[j] = True
                self.bins[j][0].samples.append(s)
                continue
            _, j, i = min(options)
            self.bins[j][i].samples.append(s)
        return True

    def improve(self, same_parent: bool) -> None:
        """Greedy moves of one sample out of the critical parent while the step shrinks."""
        p = self.p
        times = [self.time(j) for j in range(len(self.sizes))]
        for _ in range(MAX_MOVES):
            c = max(range(len(times)), key=lambda j: (times[j], -j))
            if not self._move_one(c, times, same_parent, p):
                return

    def _move_one(self, c: int, times: list[float], same_parent: bool, p: Problem) -> bool:
        for src in self.bins[c]:
            for s in sorted(src.samples, key=lambda s: (-p.work_s[s], s)):
                for q, bins in enumerate(self.bins):
                    if same_parent and q != c:
                        continue
                    for dst in bins:
                        if dst is src:
                            continue
                        src.samples.remove(s)
                        dst.samples.append(s)
                        new_c, new_q = self.time(c), self.time(q)
                        if max(new_c, new_q) < times[c] * (1 - 1e-9):
                            times[c], times[q] = new_c, new_q
                            return True
                        dst.samples.remove(s)
                        src.samples.append(s)
        return False

    def layout(self) -> Layout | None:
        parents = [self.parent(j) for j in range(len(self.sizes))]
        if any(x is None for x in parents):
            return None
        return tuple(x for x in parents if x is not None)


def reference_step_s(
    p: Problem,
    sizes: Sequence[int],
    repack: bool,
    fixed: Sequence[Sequence[int]] | None = None,
) -> float | None:
    """Predicted step time of the reference layout; ``fixed`` keeps each parent's members
    (mode ``repack``). None when the heuristic finds no layout within memory."""
    ref = Reference(p, sizes, repack)
    if fixed is None:
        if not ref.place(range(p.num_samples)):
            return None
    else:
        for j, group in enumerate(fixed):
            one = Reference(p, [sizes[j]], repack)
            one.starts = [ref.starts[j]]
            one.bins = [[_Bin(j, b.start, b.ranks) for b in ref.bins[j]]]
            if not one.place(group):
                return None
            ref.bins[j], ref.whole[j] = one.bins[0], one.whole[0]
    ref.improve(same_parent=fixed is not None)
    layout = ref.layout()
    return None if layout is None else evaluate(layout, p.cost, p.costs).step_s
