"""Bins filled to the token (``exact_fill``): subset sums and the greedy + repair fill."""

from __future__ import annotations

import itertools
import random

import pytest

from solver.errors import InfeasibleRequestError
from solver.exact_fill import EXACT_ROOM, fill_bins, subset_fill
from solver.planner import plan
from solver.problem import Problem
from solver.schema import PlanRequest
from solver.validate import validate_plan


def best_sum(lengths: list[int], room: int) -> int:
    """The largest subset sum <= room, by enumeration."""
    return max(
        sum(c)
        for r in range(len(lengths) + 1)
        for c in itertools.combinations(lengths, r)
        if sum(c) <= room
    )


@pytest.mark.parametrize("seed", range(40))
def test_subset_fill_finds_the_largest_sum_within_the_room(seed: int) -> None:
    rng = random.Random(seed)
    lengths = [rng.randint(1, 3000) for _ in range(rng.randint(0, 12))]
    room = rng.randint(0, min(EXACT_ROOM, sum(lengths) + 10))
    chosen = subset_fill(lengths, room)
    assert len(set(chosen)) == len(chosen)
    assert sum(lengths[i] for i in chosen) == best_sum(lengths, room)


def test_subset_fill_fills_a_large_room_greedily_then_exactly() -> None:
    rng = random.Random(7)
    lengths = [rng.randint(64, 9000) for _ in range(300)]
    room = 200_000
    got = sum(lengths[i] for i in subset_fill(lengths, room))
    assert room - 16 <= got <= room  # many short lengths: every room is reachable


def problem_of(lengths: list[int], nodes: int = 4) -> Problem:
    return Problem.from_request(
        PlanRequest.model_validate({"cluster": {"nodes": nodes}, "lengths": lengths})
    )


@pytest.mark.parametrize("seed", range(10))
def test_fill_bins_places_every_member_within_memory(seed: int) -> None:
    rng = random.Random(seed)
    cap = 8 * 32768
    lengths = [int(rng.lognormvariate(7.5, 1.0)) + 16 for _ in range(600)]
    lengths = [min(n, 60_000) for n in lengths]
    # four bins, filled to all but a few tokens in total
    while sum(lengths) > 4 * cap - 20:
        lengths.pop()
    lengths.append(4 * cap - 20 - sum(lengths))
    problem = problem_of(lengths)
    out = fill_bins(problem, range(len(lengths)), [cap] * 4, [8] * 4)
    assert out is not None
    assert sorted(s for b in out for s in b) == list(range(len(lengths)))
    assert all(sum(lengths[s] for s in b) <= cap for b in out)


def test_fill_bins_refuses_what_cannot_fit() -> None:
    problem = problem_of([100, 100, 100])
    assert fill_bins(problem, [0, 1, 2], [150, 140], [1, 1]) is None  # 300 > 290
    assert fill_bins(problem, [0, 1, 2], [150, 150], [1, 1]) is None  # one bin gets two
    assert fill_bins(problem, [0, 1], [100, 100], [1, 1]) is not None


LUMPY = [
    # 3 ranks of 6,000 tokens at 100%: LPT and the reserve's subset sums leave a 2000 over
    ({"nodes": 3, "gpus_per_node": 1, "max_tokens_per_rank": 6000}, [3000] * 4 + [2000] * 3, None),
    # 3 nodes of 8 at 100% less one token: two samples of 4 ranks fill a parent each
    ({"nodes": 3}, [131072] * 4 + [87381] * 3, None),
    ({"nodes": 3}, [131072] * 4 + [87381] * 3, [8, 8, 8]),
    # only exact partitions fit ({21, 8}, {17, 6, 6}, {13, 11, 5}): every greedy order strands
    # a sample, CP-SAT finds one (``packing_search``)
    (
        {"nodes": 3, "gpus_per_node": 1, "max_tokens_per_rank": 29000},
        [13000, 6000, 11000, 5000, 17000, 21000, 6000, 8000],
        None,
    ),
    ({"nodes": 3}, [117507, 54234, 99429, 45195, 153663, 189819, 54234, 72312], [8, 8, 8]),
]


@pytest.mark.parametrize(("cluster", "lengths", "sizes"), LUMPY)
def test_a_lumpy_step_that_fits_is_planned_not_refused(
    cluster: dict[str, int], lengths: list[int], sizes: list[int] | None
) -> None:
    """Few samples, each a large share of a parent, filling memory to the token: a packing
    exists (first fit decreasing finds it), so every mode plans the step (found by a
    randomised hunt: every mode refused these with 'no uniform parent size can hold these
    samples' or 'fits in no parent's remaining memory')."""
    req = PlanRequest(cluster=cluster, lengths=lengths, parent_sizes=sizes)
    for mode in ("baseline", "sizing", "repack", "repack+parent", "repack+sizing"):
        got = plan(req.model_copy(update={"mode": mode}))
        assert validate_plan(req, got) == []
        assert sorted(s for p in got.parents for s in p.samples) == list(range(len(lengths)))


def test_a_step_no_membership_fits_is_refused_with_the_reason() -> None:
    """Full to the token with no exact partition (3 ranks of 29,000 tokens and samples of
    20, 20, 20, 10, 9 and 8 thousand: each 20 needs a rank of its own, and only one of them
    can be topped up to 29): the search proves it, and the error says that no membership
    fits, not that one sample found no room."""
    req = PlanRequest(
        cluster={"nodes": 3, "gpus_per_node": 1, "max_tokens_per_rank": 29000},
        lengths=[20000, 20000, 20000, 10000, 9000, 8000],
        parent_sizes=[1, 1, 1],
    )
    with pytest.raises(InfeasibleRequestError) as raised:
        plan(req)
    assert raised.value.field == "lengths"
    assert "fit no membership" in str(raised.value)
