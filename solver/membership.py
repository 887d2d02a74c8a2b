"""Parent membership: which samples share a parent (a min-max balancing problem over parents).

Three objectives use the same machinery, a longest-processing-time greedy followed by a bounded,
deterministic local search (moves and swaps out of the critical parent):

* ``tokens``: tokens per rank, what a data loader without a cost model balances (memory); this
  is the service's default upstream membership when a request gives no ``parent_of``;
* ``baseline``: the exact time of unrepacked parents (the best membership without repacking);
* ``repack``: a lower-bound estimate of the repacked parent time, which makes parents hold
  samples that their node-local children can balance (the parent solver's first stage).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from solver.bin_completion import WORK_LIMIT, complete_bins, too_many_samples
from solver.budget import Budget
from solver.critical import first_max
from solver.errors import InfeasibleRequestError
from solver.exact_fill import fill_bins, first_fit_decreasing
from solver.node_packing import segments_fit, unplaced_tokens
from solver.packing_search import search_packing
from solver.problem import Problem

Objective = Literal["tokens", "baseline", "repack"]

LOCAL_SEARCH_EVALS = 2_000
"""Deterministic work limit of the local search, in candidate evaluations."""

RECEIVERS = 4
"""Least-loaded parents tried as receivers of a move or swap out of the critical parent."""

SWAP_CANDIDATES = 6
"""Lighter samples of a receiver tried against each heavy sample of the critical parent."""

SPECULATIVE_FILL_WORK = 1 << 27
"""``complete_bins``' work cap for a speculative membership (``balance(exhaustive=False)``):
the node-level cap (``node_packing.NODE_WORK_LIMIT``), 1/32 of the cap of a membership the
request cannot do without. A candidate tiling of many narrow parents on a step full to 99.7%
(256 GPUs of 32-GPU nodes, 906 samples, 16,384 tokens per rank; the 2026-12-07 evening fuzz)
spent its full cap, ~0.8 s, and then CP-SAT's 0.2 deterministic s, on two tilings that were
not found: 2.5 s of `repack+sizing`'s CPU."""

IMPROVEMENT_EPS = 1e-12
"""Relative improvement below which a move is not taken (guards float noise cycles)."""


@dataclass
class ParentLoad:
    size: int
    capacity: int
    full_s: float = 0.0
    sparse_s: float = 0.0
    tokens: int = 0
    members: list[int] = field(default_factory=list)
    single: float = 0.0
    """Largest single-sample bound among the members (repack objective only)."""


CostFn = Callable[[int, float, float, int, float], float]
"""``(size, full_s, sparse_s, tokens, longest single-sample bound) -> seconds``."""


def single_sample_bound(problem: Problem, sample: int, size: int) -> float:
    """Least sparse-layer time of ``sample`` alone in a node-local child of a parent of
    ``size``; ``inf`` when no child can hold it (the parent must then stay unrepacked)."""
    return problem.single_bounds(size)[sample]


def make_cost_fn(problem: Problem, objective: Objective) -> CostFn:
    cost = problem.cost
    nf, ns = cost.full_layers, cost.sparse_layers
    lin = cost.linear_seconds_per_token
    # Per parent size: (1/P, seconds per busiest-rank token of a full layer, of both layers,
    # the fixed latency of an unrepacked parent's all-to-all calls (0 by default), of its full
    # layers only). Precomputed because these functions run millions of times per request:
    # the same float operations in the same order as written out in full.
    coef: dict[int, tuple[float, float, float, float, float]] = {}
    for size in {1 << i for i in range(cost.world_size.bit_length())}:
        a2a = cost.a2a_seconds_per_token(size)
        full_tok, sparse_tok = nf * (lin + a2a), ns * (lin + a2a)
        full_latency = nf * cost.layer_fixed_seconds(size)
        unrepacked_latency = full_latency + ns * cost.layer_fixed_seconds(size)
        coef[size] = (1.0 / size, full_tok, full_tok + sparse_tok, unrepacked_latency, full_latency)

    def baseline(size: int, full: float, sparse: float, tokens: int, _: float) -> float:
        inv, _f, both_tok, unrepacked_latency, _l = coef[size]
        return (nf * full + ns * sparse) * inv + -(-tokens // size) * both_tok + unrepacked_latency

    def repack(size: int, full: float, sparse: float, tokens: int, single: float) -> float:
        # The parent may also stay unrepacked: never estimate it slower than that.
        inv, full_tok, both_tok, unrepacked_latency, full_latency = coef[size]
        n = -(-tokens // size)
        unrepacked = (nf * full + ns * sparse) * inv + n * both_tok + unrepacked_latency
        if single == math.inf:
            return unrepacked
        spread = (sparse + tokens * lin) * inv
        repacked = nf * full * inv + n * full_tok + ns * max(spread, single)
        repacked += full_latency  # the children's latency is in ``single`` already
        return min(unrepacked, repacked)

    def tokens_per_rank(size: int, _f: float, _s: float, tokens: int, _l: float) -> float:
        return tokens / size

    return {"tokens": tokens_per_rank, "baseline": baseline, "repack": repack}[objective]


class _Balancer:
    def __init__(
        self,
        problem: Problem,
        sizes: Sequence[int],
        objective: Objective,
        repack_caps: Sequence[int] | None = None,
    ) -> None:
        self.p = problem
        self.loads = [ParentLoad(size=s, capacity=problem.capacity(s)) for s in sizes]
        self.cost_fn = make_cost_fn(problem, objective)
        self.use_single = objective == "repack"
        self.repack_caps = list(repack_caps) if repack_caps is not None else None
        self.evals = 0

    def single_of(self, s: int, size: int) -> float:
        return self.p.single_bounds(size)[s]

    def longest(self, j: int, add: int | None, remove: int | None) -> float:
        if not self.use_single:
            return 0.0
        ld = self.loads[j]
        best = ld.single
        if remove is not None and self.single_of(remove, ld.size) >= best:
            best = max((self.single_of(m, ld.size) for m in ld.members if m != remove), default=0.0)
        return best if add is None else max(best, self.single_of(add, ld.size))

    def cost(self, j: int, add: int | None = None, remove: int | None = None) -> float:
        """Cost of parent j with one sample added and/or removed (without changing it)."""
        self.evals += 1
        ld, p = self.loads[j], self.p
        full, sparse, tokens = ld.full_s, ld.sparse_s, ld.tokens
        if add is not None:  # added, then removed: the float sums' order is part of the bits
            full += p.full_s[add]
            sparse += p.sparse_s[add]
            tokens += p.tokens[add]
        if remove is not None:
            full -= p.full_s[remove]
            sparse -= p.sparse_s[remove]
            tokens -= p.tokens[remove]
        single = self.longest(j, add, remove)
        if self.repack_caps is not None and tokens > self.repack_caps[j]:
            single = math.inf  # no node-local packing holds this many tokens: stays whole
        return self.cost_fn(ld.size, full, sparse, tokens, single)

    def fits(self, j: int, add: int, remove: int | None = None) -> bool:
        ld = self.loads[j]
        out = self.p.tokens[remove] if remove is not None else 0
        return ld.tokens + self.p.tokens[add] - out <= ld.capacity

    def place(self, j: int, s: int) -> None:
        ld, p = self.loads[j], self.p
        if self.use_single:
            ld.single = self.longest(j, s, None)
        ld.members.append(s)
        ld.full_s += p.full_s[s]
        ld.sparse_s += p.sparse_s[s]
        ld.tokens += p.tokens[s]

    def unplace(self, j: int, s: int) -> None:
        ld, p = self.loads[j], self.p
        if self.use_single:
            ld.single = self.longest(j, None, s)
        ld.members.remove(s)
        ld.full_s -= p.full_s[s]
        ld.sparse_s -= p.sparse_s[s]
        ld.tokens -= p.tokens[s]

    def projected(self, j: int, add: int | None = None) -> float:
        """Cost of parent j (with ``add``) once its free memory is filled at ``fill_price``."""
        ld = self.loads[j]
        free = ld.capacity - ld.tokens - (0 if add is None else self.p.tokens[add])
        return self.cost(j, add=add) + self.fill_price[ld.size] * free

    def greedy(self, order: Sequence[int], fill_price: Mapping[int, float] | None = None) -> None:
        """Each sample, heaviest first, to the parent it makes least costly (LPT).

        Parents of one size are interchangeable but for their load, so per size only the least
        costly parent with room is a candidate: one heap per size keeps that cheap. With
        ``fill_price`` (seconds per free token, per parent size) a parent's cost counts its free
        memory as filled at that price: on a packed step every parent ends full, so a parent
        that looks light now is one that still has to take tokens (``projected_balance``).
        """
        self.fill_price = {} if fill_price is None else dict(fill_price)
        key = self.cost if fill_price is None else self.projected
        heaps: dict[int, list[tuple[float, int]]] = {}
        for j, ld in enumerate(self.loads):
            heaps.setdefault(ld.size, []).append((key(j), j))
        for heap in heaps.values():
            heapq.heapify(heap)
        # Parents without room for a sample wait here, most room first, with their heap entry:
        # samples come longest first, so one leaves only for a sample it holds, and every
        # parent with room is in its heap when a sample is placed (packed steps, where the
        # cheap parents are the full ones, park many; each is parked once per sample it gets).
        parked: dict[int, list[tuple[int, tuple[float, int]]]] = {size: [] for size in heaps}
        for s in order:
            length = self.p.tokens[s]
            best: tuple[float, int, int] | None = None  # (new cost, parent, size)
            for size, heap in heaps.items():
                waiting = parked[size]
                while waiting and -waiting[0][0] >= length:
                    heapq.heappush(heap, heapq.heappop(waiting)[1])
                while heap and not self.fits(heap[0][1], s):
                    item = heapq.heappop(heap)
                    ld = self.loads[item[1]]
                    heapq.heappush(waiting, (ld.tokens - ld.capacity, item))
                if heap:
                    c = key(heap[0][1], s)
                    if best is None or (c, heap[0][1]) < best[:2]:
                        best = (c, heap[0][1], size)
            if best is None:
                raise InfeasibleRequestError(
                    "lengths",
                    f"sample {s} ({self.p.tokens[s]} tokens) fits in no parent's remaining memory; "
                    "give wider parents or fewer tokens",
                )
            c, j, size = best
            heapq.heapreplace(heaps[size], (c, j))
            self.place(j, s)

    def improve(self, budget: int, clock: Budget | None = None) -> None:
        """Moves and swaps out of the critical parent while one makes it faster.

        Each round prices every parent; only the two a move changed are computed again, the
        others' costs are kept (the same bits: their loads did not change) and still charged
        as evaluations, so the search and its budget are as if all were recomputed."""
        costs: list[float] | None = None
        changed: tuple[int, int] | None = None
        while self.evals < budget and not (clock is not None and clock.expired()):
            if costs is None or changed is None:
                costs = [self.cost(j) for j in range(len(self.loads))]
            else:
                self.evals += len(self.loads) - len(changed)
                for j in changed:
                    costs[j] = self.cost(j)
            c = first_max(costs)
            changed = self._improve_critical(c, costs, budget)
            if changed is None:
                return

    def _improve_critical(self, c: int, costs: list[float], budget: int) -> tuple[int, int] | None:
        """The two parents a move or swap out of the critical parent ``c`` changed, None if
        none makes ``c`` faster.

        A swap is priced on the receiver's side first, where it nearly always fails (the
        critical parent gets a lighter sample for a heavier one), and the critical parent's
        side is then not priced but still charged: the evaluations counted, hence the search
        and its plans, are those of pricing both (22% fewer cost calls on packed steps)."""
        target = costs[c] * (1 - IMPROVEMENT_EPS)
        receivers = sorted(
            (j for j in range(len(self.loads)) if j != c), key=lambda j: (costs[j], j)
        )
        receivers = receivers[:RECEIVERS]
        work, tokens = self.p.work_s, self.p.tokens
        room = [self.loads[q].capacity - self.loads[q].tokens for q in receivers]
        heavy_first = sorted(self.loads[c].members, key=self.p.heavy_rank.__getitem__)
        for s in heavy_first:  # moves
            # ``c`` without ``s`` is the same for every receiver: computed once, each use
            # still charged as an evaluation (the budget counts them), so the search is as it was
            t_s, without = tokens[s], None
            for q, room_q in zip(receivers, room, strict=True):
                if t_s > room_q:  # ``fits``, inlined
                    continue
                if without is None:
                    without = self.cost(c, remove=s)
                else:
                    self.evals += 1
                if max(without, self.cost(q, add=s)) < target:
                    self.unplace(c, s)
                    self.place(q, s)
                    return c, q
        room_c = self.loads[c].capacity - self.loads[c].tokens
        for q, room_q in zip(receivers, room, strict=True):  # swaps with a lighter sample
            light = sorted(self.loads[q].members, key=self.p.light_rank.__getitem__)
            light_work = [work[u] for u in light]
            for s in heavy_first:
                if self.evals >= budget:
                    return None
                hi = bisect.bisect_left(light_work, work[s])
                t_s = tokens[s]
                for u in reversed(light[max(0, hi - SWAP_CANDIDATES) : hi]):
                    grow = t_s - tokens[u]  # ``fits`` on both sides, inlined
                    if grow > room_q or -grow > room_c:
                        continue
                    if self.cost(q, add=s, remove=u) >= target:
                        self.evals += 1  # the critical parent's side, not priced
                        continue
                    if self.cost(c, add=u, remove=s) < target:
                        self.unplace(c, s)
                        self.unplace(q, u)
                        self.place(c, u)
                        self.place(q, s)
                        return c, q
        return None


def fill_prices(problem: Problem, sizes: Sequence[int]) -> dict[int, float]:
    """Seconds per token, per parent size, of the cheapest filler of an unrepacked parent (the
    least attention per token, i.e. the shortest sample, plus every token's linear and
    all-to-all time). On a packed step every parent ends full; LPT by current cost fills the
    light parents with the mid-length samples first and leaves the long samples' parents the
    slack, and memory then forces whatever is left into them. Costed as if already full, a
    parent's load says what it will weigh at the end. Measured on a packed 64-GPU step (16-rank
    loader parents, 99.5% full), 64 parents of one rank: LPT by current cost + local search
    3,928 ms (500 evaluations) / 3,772 ms (5,000), fill-priced 3,705 ms, and the linear
    relaxation (the 9 samples over half a rank whole, the rest fractional) 3,686 ms."""
    cost = problem.cost
    nf, ns = cost.full_layers, cost.sparse_layers
    attention = min(
        (nf * problem.full_s[s] + ns * problem.sparse_s[s]) / max(problem.tokens[s], 1)
        for s in range(problem.num_samples)
    )
    per_token = (nf + ns) * cost.linear_seconds_per_token
    return {
        size: (attention + per_token + (nf + ns) * cost.a2a_seconds_per_token(size)) / size
        for size in set(sizes)
    }


def heavy_order(problem: Problem) -> list[int]:
    """Samples by decreasing length; index breaks ties (determinism): a stable sort of the
    negated lengths, ~20x faster than a Python key at 6,000 samples."""
    order: list[int] = np.argsort(-problem.costs.tokens, kind="stable").tolist()
    return order


def balance(
    problem: Problem,
    sizes: Sequence[int],
    objective: Objective,
    start: Sequence[Sequence[int]] | None = None,
    evals: int = LOCAL_SEARCH_EVALS,
    clock: Budget | None = None,
    repack_caps: Sequence[int] | None = None,
    fill: bool = True,
    fill_price: Mapping[int, float] | None = None,
    exhaustive: bool = True,
) -> list[list[int]]:
    """Members of each parent (in index order), improved from ``start`` or built greedily;
    the local search stops after ``evals`` evaluations or when ``clock`` runs out. With
    ``repack_caps`` (objective ``repack``), a parent holding more tokens than its cap is
    costed unrepacked: its samples cannot be packed node-locally. Where the greedy runs out of
    memory, the parents filled to the token are the start (``fill``; else it raises).
    ``fill_price``: the greedy counts free memory as filled at that price (``fill_prices``).
    ``exhaustive=False`` (a speculative membership the caller can do without, a candidate
    tiling's): the fill to the token stops at the node-level bin completion's work cap
    (``SPECULATIVE_FILL_WORK``) and never asks CP-SAT (``packing_search``); it raises
    ``InfeasibleRequestError`` where those give up."""
    if objective == "tokens" and start is None and evals == 0 and len(set(sizes)) == 1:
        lpt = _lpt_by_tokens(problem, sizes[0], len(sizes))
        if lpt is not None:
            return [sorted(group) for group in lpt]
    bal = _Balancer(problem, sizes, objective, repack_caps)
    if start is None:
        try:
            bal.greedy(heavy_order(problem), fill_price)
        except InfeasibleRequestError:
            if not fill:
                raise
            # Memory full to a few tokens (a loader at 99.99%): LPT leaves a sample with no
            # room, subset sums fill the parents to the token (``exact_fill``).
            capacities = [problem.capacity(size) for size in sizes]
            samples = range(problem.num_samples)
            if too_many_samples(problem.tokens, samples, capacities):
                raise _no_membership(problem, sizes) from None
            start = fill_bins(problem, samples, capacities, list(sizes))
            if start is None:  # few samples, each a large share of a parent
                start = first_fit_decreasing(problem, samples, capacities)
            if start is None:  # a few samples per parent, full to the token
                work = WORK_LIMIT if exhaustive else SPECULATIVE_FILL_WORK
                start = complete_bins(problem, samples, capacities, clock, work)
            if start is None and not exhaustive:
                raise InfeasibleRequestError(
                    "lengths", "no fill to the token within its cap"
                ) from None
            if start is None:  # only exact partitions fit (``packing_search``)
                found = search_packing(problem, samples, capacities, clock)
                if found.proven_infeasible:
                    raise _no_membership(problem, sizes) from None
                start = found.members
            if start is None:  # not proven infeasible: say what was not found, and why
                used = sum(problem.tokens)
                raise InfeasibleRequestError(
                    "lengths",
                    f"no membership of these samples within the parents' memory was found "
                    f"(parents of {sorted(set(sizes))} ranks, {used} of {sum(capacities)} "
                    "tokens used); send parent_of or leave some memory free",
                ) from None
            bal = _Balancer(problem, sizes, objective, repack_caps)
    if start is not None:
        for j, group in enumerate(start):
            for s in group:
                bal.place(j, s)
    if evals > 0 and clock is not None:
        evals = clock.evals(evals)  # the request's deterministic work budget
    if evals > 0:
        bal.improve(bal.evals + evals, clock)
    return [sorted(ld.members) for ld in bal.loads]


def _no_membership(problem: Problem, sizes: Sequence[int]) -> InfeasibleRequestError:
    """Proven: by a bound on the bins (``too_many_samples``) or by CP-SAT."""
    return InfeasibleRequestError(
        "lengths",
        "these samples fit no membership of the parents' memory "
        f"(parents of {sorted(set(sizes))} ranks, "
        f"{problem.cost.max_tokens_per_rank} tokens per rank)",
    )


def _lpt_by_tokens(problem: Problem, size: int, parents: int) -> list[list[int]] | None:
    """``_Balancer.greedy`` by tokens per rank over parents of one size, on integer keys: the
    same members in the same order (a parent's cost is its tokens over one common size, so
    ordering by tokens is ordering by cost, ties by index as there), without a cost-function
    call per sample; None where a sample fits no parent (the general path then decides). The
    upstream membership of requests without ``parent_sizes`` ranks every size this way: ~60
    ms of a 1,024-GPU request of 6,000 samples."""
    cap = problem.capacity(size)
    tokens = problem.tokens
    heap = [(0, j) for j in range(parents)]  # sorted, so already a heap
    parked: list[tuple[int, tuple[int, int]]] = []  # (-room, entry): most room first
    members: list[list[int]] = [[] for _ in range(parents)]
    for s in heavy_order(problem):
        length = tokens[s]
        while parked and -parked[0][0] >= length:
            heapq.heappush(heap, heapq.heappop(parked)[1])
        while heap and heap[0][0] + length > cap:
            entry = heapq.heappop(heap)
            heapq.heappush(parked, (entry[0] - cap, entry))
        if not heap:
            return None
        load, j = heap[0]
        heapq.heapreplace(heap, (load + length, j))
        members[j].append(s)
    return members


MEMORY_ROUNDS = 3
"""Rounds of ``make_room``: re-balance, re-check every parent's node-level packing."""


def make_room(
    problem: Problem,
    sizes: Sequence[int],
    members: Sequence[Sequence[int]],
    evals: int = LOCAL_SEARCH_EVALS,
    clock: Budget | None = None,
) -> list[list[int]]:
    """Membership re-balanced knowing which parents cannot be repacked for lack of memory.

    The ``repack`` estimate assumes a parent's samples fit node-local children; a parent that
    a loader filled to 99.9% of its memory usually does not. Each round finds the parents whose
    repacked estimate beats their unrepacked time but whose samples fail a node-level packing
    (``node_packing.segments_fit``), caps their tokens below what they hold by the tokens that
    did not fit (at least one member), and re-balances under those caps: the local search then
    sees such a parent at its unrepacked time and moves samples out of it where another parent
    has room, or leaves it whole where moving costs more.
    """
    cost_fn = make_cost_fn(problem, "repack")
    caps = [problem.capacity(s) for s in sizes]
    current = [list(m) for m in members]
    for _ in range(MEMORY_ROUNDS):
        tightened = False
        for j, (size, group) in enumerate(zip(sizes, current, strict=True)):
            tokens = sum(problem.tokens[s] for s in group)
            if not group or tokens > caps[j] or segments_fit(problem, size, group):
                continue
            single = max(problem.single_bounds(size)[s] for s in group)
            full = sum(problem.full_s[s] for s in group)
            sparse = sum(problem.sparse_s[s] for s in group)
            if math.isinf(single):
                continue  # a member longer than a node: the parent stays whole anyway
            if cost_fn(size, full, sparse, tokens, single) >= cost_fn(
                size, full, sparse, tokens, math.inf
            ):
                continue  # repacking would not pay: no reason to move anything
            shortest = min(problem.tokens[s] for s in group)
            caps[j] = tokens - max(unplaced_tokens(problem, size, group), shortest)
            tightened = True
        if not tightened or (clock is not None and clock.expired()):
            break
        current = balance(
            problem, sizes, "repack", start=current, evals=evals, clock=clock, repack_caps=caps
        )
    return current


def members_from_parent_of(parent_of: Sequence[int], num_parents: int) -> list[list[int]]:
    groups: list[list[int]] = [[] for _ in range(num_parents)]
    for s, j in enumerate(parent_of):
        groups[j].append(s)
    return groups
