"""Sample swaps between children (``solver.child_swaps``): what memory-full children still
allow, on packed loader steps whose every child is full."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from solver.budget import Budget
from solver.child_swaps import _Swaps, swap_children
from solver.layout import Child, Layout, Parent, evaluate
from solver.node_membership import node_seed
from solver.planner import plan
from solver.problem import Problem
from solver.schema import Plan, PlanRequest
from solver.validate import validate_plan
from tests.solver.test_reference import loader_request

DATA = Path(__file__).parent / "data"


def layout_of(request: PlanRequest, mode: str) -> tuple[Plan, Layout]:
    """The plan of ``mode`` and its layout rebuilt from the wire format."""
    got = plan(request.model_copy(update={"mode": mode}), deadline_ms=60_000)
    parents = []
    for par in got.parents:
        start, end = par.ranks
        kids = tuple(
            Child(c.ranks[0], c.ranks[1] - c.ranks[0], tuple(c.samples))
            for c in got.children
            if start <= c.ranks[0] < end
        )
        parents.append(Parent(start, end - start, kids))
    return got, tuple(parents)


@pytest.mark.parametrize("case", [(4, 8, 16, 0.0, 3), (4, 8, 8, 0.0, 2), (2, 8, 16, 0.3, 5)])
def test_swaps_keep_memory_samples_and_ranks_and_never_slow_down(
    case: tuple[int, int, int, float, int],
) -> None:
    request = loader_request(*case)
    problem = Problem.from_request(request)
    # the greedy children, before any swap: the stage has work to do there
    _, layout = layout_of(request, "repack")
    before = evaluate(layout, problem.cost, problem.costs).step_s
    swapped = swap_children(problem, layout, Budget(60_000))
    after = evaluate(swapped, problem.cost, problem.costs).step_s
    assert after <= before
    assert [(p.start, p.size) for p in swapped] == [(p.start, p.size) for p in layout]
    for old, new in zip(layout, swapped, strict=True):
        assert [(c.start, c.size) for c in new.children] == [
            (c.start, c.size) for c in old.children
        ]
        for c in new.children:
            assert sum(problem.tokens[s] for s in c.samples) <= problem.capacity(c.size)
    every = sorted(s for p in swapped for c in p.children for s in c.samples)
    assert every == list(range(problem.num_samples))


def test_swaps_speed_up_memory_full_children_and_the_plan_stays_valid() -> None:
    """Two 16-rank parents packed full, no long sample: the node stage's moves stop where no
    child has room for one more sample; swaps still make the step faster, and the planner's
    plan with them passes the solver-independent validation."""
    request = loader_request(4, 8, 16, 0.0, 3)
    problem = Problem.from_request(request)
    seeded = node_seed(problem, list(request.parent_sizes or []), Budget(60_000))
    assert seeded is not None
    layout = seeded[1]
    swapped = swap_children(problem, layout, Budget(60_000))
    before = evaluate(layout, problem.cost, problem.costs).step_s
    assert evaluate(swapped, problem.cost, problem.costs).step_s < before * (1 - 1e-4)
    for mode in ("repack+parent", "repack+sizing"):
        req = request.model_copy(update={"mode": mode})
        got, _ = layout_of(request, mode)
        assert validate_plan(req, got) == []


def test_same_request_same_swaps() -> None:
    request = loader_request(4, 8, 16, 0.0, 3)
    problem = Problem.from_request(request)
    _, layout = layout_of(request, "repack")
    first = swap_children(problem, layout, Budget(60_000))
    second = swap_children(problem, layout, Budget(60_000))
    assert first == second


class ScanSwaps(_Swaps):
    """Every partner of a receiving child tried, longest first, both sides priced (the
    oracle of the galloping search, which relies on both sides being monotone in the
    partner's length)."""

    def _try_child(
        self, c: int, ci: int, a: int, q: int, di: int, target: float, limit: int
    ) -> bool:
        p = self.p
        src, dst = self.pars[c].kids[ci], self.pars[q].kids[di]
        src_room = p.capacity(src.size) - src.tokens + p.tokens[a]
        dst_room = p.capacity(dst.size) - dst.tokens - p.tokens[a]
        partners = sorted(
            (b for b in dst.samples if -dst_room <= p.tokens[b] <= src_room),
            key=lambda b: (-p.tokens[b], -b),
        )
        options: list[int | None] = [None] if dst_room >= 0 else []
        options.extend(b for b in partners if p.tokens[b] < p.tokens[a])
        for b in options:
            if self._trial(c, ci, a, q, di, b) < target:
                self._commit(c, ci, a, q, di, b)
                return True
        return False


def run_all(swaps: _Swaps) -> Layout:
    while swaps.step(10**9):
        pass
    return swaps.layout()


@pytest.mark.parametrize("case", [(4, 8, 16, 0.0, 3), (4, 8, 8, 0.0, 2), (2, 8, 16, 0.3, 5)])
def test_galloping_partner_search_swaps_as_a_scan_of_every_partner(
    case: tuple[int, int, int, float, int],
) -> None:
    request = loader_request(*case)
    problem = Problem.from_request(request)
    seeded = node_seed(problem, list(request.parent_sizes or []), Budget(60_000))
    assert seeded is not None
    layout = seeded[1]  # memory-full children, an uneven critical parent
    fast = run_all(_Swaps(problem, layout))
    assert fast != layout  # there is something to swap
    assert fast == run_all(ScanSwaps(problem, layout))


def level_parent() -> tuple[Problem, Layout]:
    """One 4-rank parent, four children of one rank at the same tokens: two hold two samples
    longer than the sparse window each, two hold 16 short ones each. Every rank is the
    busiest and both long children are the slowest, so no single move or one-for-one swap
    lowers the parent: each raises some rank's tokens or leaves the other long child at the
    top."""
    long, short = 16384, 2048
    lengths = [long] * 4 + [short] * 32
    request = PlanRequest.model_validate(
        {
            "cluster": {"nodes": 1, "gpus_per_node": 4, "max_tokens_per_rank": 40000},
            "model": {"sparse_window": 4096},
            "lengths": lengths,
            "parent_sizes": [4],
            "parent_of": [0] * len(lengths),
        }
    )
    problem = Problem.from_request(request)
    groups = [(0, 1), (2, 3), tuple(range(4, 20)), tuple(range(20, 36))]
    kids = tuple(Child(i, 1, g) for i, g in enumerate(groups))
    return problem, (Parent(0, 4, kids),)


def test_level_children_trade_a_long_sample_for_many_short_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    problem, layout = level_parent()
    before = evaluate(layout, problem.cost, problem.costs).step_s
    swapped = swap_children(problem, layout, Budget(60_000), within=True)
    after = evaluate(swapped, problem.cost, problem.costs).step_s
    assert after < before * (1 - 1e-4)
    for child in swapped[0].children:  # the long samples now share children with short ones
        assert sum(problem.tokens[s] for s in child.samples) <= problem.capacity(child.size)
        assert sum(1 for s in child.samples if s < 4) == 1
    # without the plateau moves nothing changes: the exchange is what the test is about
    monkeypatch.setattr(_Swaps, "_flatten", lambda self, c, limit: False)
    assert swap_children(problem, layout, Budget(60_000), within=True) == layout


def test_a_sample_of_the_critical_parent_goes_for_many_short_ones_of_another() -> None:
    """Two 16-rank parents of 32 GPUs at 89% of memory, children of one rank (a hunted step):
    once no move, one-for-one swap or plateau move helps, the one-for-many exchange between
    parents still makes the step faster, within memory, one sample for several shorter
    ones."""
    request = PlanRequest.model_validate(
        json.loads((DATA / "hunt-4x8-two-parents-16-555.json").read_text())
    )
    problem = Problem.from_request(request)
    _, layout = layout_of(request, "repack+parent")
    swaps = _Swaps(problem, layout)
    many = swaps._exchange_many
    swaps._exchange_many = lambda *args: False  # type: ignore[method-assign]
    while swaps.step(10**7):
        pass
    stuck = swaps.layout()
    before = evaluate(stuck, problem.cost, problem.costs).step_s
    swaps._exchange_many = many  # type: ignore[method-assign]
    assert swaps.step(10**7)
    after_layout = swaps.layout()
    after = evaluate(after_layout, problem.cost, problem.costs).step_s
    assert after < before * (1 - 1e-9)
    moved = [
        (j, sorted(set(new.samples) - set(old.samples)))
        for j, (old, new) in enumerate(zip(stuck, after_layout, strict=True))
    ]
    counts = sorted(len(samples) for _, samples in moved)
    assert counts[0] == 1 and counts[-1] >= 2  # one sample one way, several the other
    for parent in after_layout:
        for child in parent.children:
            assert sum(problem.tokens[s] for s in child.samples) <= problem.capacity(child.size)


@pytest.mark.parametrize("case", [(4, 8, 16, 0.0, 3), (4, 8, 8, 0.0, 2)])
def test_receivers_stay_every_child_in_order_of_its_seconds_after_each_swap(
    case: tuple[int, int, int, float, int],
) -> None:
    """The receivers are kept sorted as swaps change parents, not re-sorted every step: after
    each step they are exactly what a fresh sort of every child gives."""
    request = loader_request(*case)
    problem = Problem.from_request(request)
    _, layout = layout_of(request, "repack")
    swaps = _Swaps(problem, layout)
    steps = 0
    while swaps.step(10_000):
        steps += 1
        fresh = sorted(
            (kid.seconds(), j, i)
            for j, par in enumerate(swaps.pars)
            for i, kid in enumerate(par.kids)
        )
        assert swaps.receivers == fresh
    assert steps > 0  # the invariant was checked after some swap
