"""Bins filled to the token by bin completion (``bin_completion``), and the steps it saves.

A loader that cuts its last document to fill every rank exactly leaves no free token; with a
few samples per parent the greedy fills strand one, and a request without ``parent_of`` was
refused though its loader had packed it (found by a randomised hunt over cluster shapes,
models and token budgets).
"""

from __future__ import annotations

import itertools
import random

import pytest

from solver.bin_completion import _completions, bins_needed, complete_bins, too_many_samples
from solver.exact_fill import fill_bins, first_fit_decreasing
from solver.planner import plan
from solver.problem import Problem
from solver.schema import PlanRequest
from solver.validate import validate_plan

MODES = ("baseline", "sizing", "repack", "repack+parent", "repack+sizing")


def truncating_loader(rng: random.Random, bins: int, capacity: int, median: float) -> list[int]:
    """Samples a loader packs into ``bins`` bins of ``capacity`` tokens, each filled exactly:
    documents of lognormal length, the last one of each bin cut to the room left; shuffled."""
    lengths: list[int] = []
    for _ in range(bins):
        left = capacity
        while left > 0:
            n = max(1, min(left, int(rng.lognormvariate(median, 1.0))))
            lengths.append(n)
            left -= n
    rng.shuffle(lengths)
    return lengths


def problem_of(lengths: list[int], ranks: int, cap: int) -> Problem:
    return Problem.from_request(
        PlanRequest(
            cluster={"nodes": ranks, "gpus_per_node": 1, "max_tokens_per_rank": cap},
            lengths=lengths,
            mode="repack",
        )
    )


def assert_packs(problem: Problem, got: list[list[int]] | None, capacities: list[int]) -> None:
    assert got is not None
    assert sorted(s for group in got for s in group) == list(range(problem.num_samples))
    for group, cap in zip(got, capacities, strict=True):
        assert sum(problem.tokens[s] for s in group) <= cap


@pytest.mark.parametrize("seed", range(30))
def test_completions_are_the_fullest_subsets_in_the_window(seed: int) -> None:
    """Every completion sums into ``[low, high]``, none twice, and they are the fullest ones:
    as many as exist up to the limit, sums never increasing (checked by enumeration)."""
    rng = random.Random(seed)
    tokens = [rng.randint(1, 400) for _ in range(rng.randint(0, 10))]
    items = sorted(range(len(tokens)), key=lambda s: (-tokens[s], s))
    high = rng.randint(0, sum(tokens) + 5)
    low = rng.randint(0, high)
    limit = rng.randint(1, 12)
    got = _completions(tokens, items, low, high, limit)
    every = [
        set(c)
        for r in range(len(items) + 1)
        for c in itertools.combinations(items, r)
        if low <= sum(tokens[s] for s in c) <= high
    ]
    sums = [sum(tokens[s] for s in sub) for sub in got]
    assert len(got) == min(limit, len(every))
    assert len({frozenset(sub) for sub in got}) == len(got)
    assert all(set(sub) in every for sub in got)
    assert sums == sorted(sums, reverse=True)
    if got:
        assert sums[0] == max(sum(tokens[s] for s in c) for c in every)


def test_an_exact_partition_is_found() -> None:
    """Three bins of 29 holding {21, 8}, {17, 6, 6}, {13, 11, 5}: every greedy order strands a
    sample."""
    problem = problem_of([13, 6, 11, 5, 17, 21, 6, 8], 3, 29)
    assert_packs(problem, complete_bins(problem, range(8), [29] * 3), [29] * 3)


def test_no_packing_when_the_tokens_exceed_the_memory() -> None:
    problem = problem_of([10, 10, 10], 3, 10)
    assert complete_bins(problem, range(3), [10, 10]) is None


@pytest.mark.parametrize("seed", range(24))
def test_loader_fills_the_greedy_fills_miss_are_found(seed: int) -> None:
    """Bins filled exactly by a truncating loader with 3-6 samples each: whatever the greedy
    fills leave, bin completion packs (these seeds: all of them; it packed 295 of 300 such
    random steps of up to 128 bins, the rest ~2 samples per bin)."""
    rng = random.Random(seed)
    bins = rng.choice([4, 6, 12, 16, 24, 48])
    cap = rng.choice([4096, 8192, 16384])
    lengths = truncating_loader(rng, bins, cap, rng.choice([7.0, 7.5]))
    problem = problem_of(lengths, bins, cap)
    assert_packs(problem, complete_bins(problem, range(len(lengths)), [cap] * bins), [cap] * bins)


def test_the_hunt_step_defeats_the_greedy_fills() -> None:
    """The pinned step below is one the greedy fills cannot pack (why it was refused)."""
    problem = problem_of(SIX_ONE_RANK_PARENTS, 6, 16384)
    caps = [16384] * 6
    members = range(problem.num_samples)
    assert fill_bins(problem, members, caps, [1] * 6) is None
    assert first_fit_decreasing(problem, members, caps) is None
    assert_packs(problem, complete_bins(problem, members, caps), caps)


SIX_ONE_RANK_PARENTS = [
    14745,
    1639,
    2314,
    3220,
    1148,
    76,
    788,
    8838,
    2438,
    6258,
    335,
    506,
    3127,
    3720,
    4835,
    1676,
    88,
    74,
    149,
    3785,
    710,
    202,
    4865,
    6105,
    251,
    781,
    153,
    2876,
    6218,
    4952,
    876,
    959,
    2898,
    6699,
]  # 6 x 16,384 tokens exactly: sizes given, no parent_of

SIZES_DERIVED = [
    1228,
    86,
    2782,
    318,
    23,
    3755,
    244,
    1026,
    202,
    2624,
    3598,
    498,
    58,
    1635,
    723,
    1680,
    334,
    1048,
    1783,
    931,
    1470,
    100,
    1455,
    1071,
    2082,
    875,
    208,
    247,
    57,
    627,
    567,
    3529,
    2394,
    123,
    1236,
    129,
    158,
    56,
    4096,
    4096,
    220,
    646,
    1567,
    283,
    1380,
    4096,
    95,
    439,
    1330,
    233,
    121,
    1878,
    1192,
    2904,
    134,
    9,
    433,
    3520,
    1395,
    655,
    2046,
    4096,
    4096,
    352,
    2069,
    581,
    151,
    943,
    2322,
    1774,
    351,
    3745,
    1961,
    2135,
]  # 24 x 4,096 tokens exactly: no sizes, no parent_of

FULL_TO_THE_TOKEN = [
    (
        {"nodes": 3, "gpus_per_node": 2, "max_tokens_per_rank": 16384},
        {"heads": 24, "kv_heads": 6},
        SIX_ONE_RANK_PARENTS,
        [1] * 6,
    ),
    (
        {"nodes": 12, "gpus_per_node": 2, "max_tokens_per_rank": 4096},
        {"heads": 12, "kv_heads": 3},
        SIZES_DERIVED,
        None,
    ),
]


@pytest.mark.parametrize(("cluster", "model", "lengths", "sizes"), FULL_TO_THE_TOKEN)
@pytest.mark.parametrize("mode", MODES)
def test_a_step_full_to_the_token_is_planned_not_refused(
    cluster: dict[str, int],
    model: dict[str, int],
    lengths: list[int],
    sizes: list[int] | None,
    mode: str,
) -> None:
    """Every rank full to the token, no ``parent_of``: every mode refused these ('fits in no
    parent's remaining memory', 'no uniform parent size can hold these samples')."""
    world = cluster["nodes"] * cluster["gpus_per_node"]
    assert sum(lengths) == world * cluster["max_tokens_per_rank"]
    req = PlanRequest(cluster=cluster, model=model, lengths=lengths, parent_sizes=sizes, mode=mode)
    got = plan(req)
    assert validate_plan(req, got) == []
    assert sorted(s for p in got.parents for s in p.samples) == list(range(len(lengths)))


def loader_step(seed: int, size: int, median: float, share: float = 0.4) -> PlanRequest:
    """A 64-GPU step as a truncating loader sends it: parents of ``size`` ranks of 32,768
    tokens each, filled to the token (the first with a sample of ``share`` of it, the rest
    documents of lognormal length, the last one cut to fit), ``parent_sizes`` and ``parent_of``
    given."""
    rng = random.Random(seed)
    sizes = [size] * (64 // size)
    lengths: list[int] = []
    parent_of: list[int] = []
    for j, ranks in enumerate(sizes):
        left = ranks * 32768
        if j == 0:
            lengths.append(int(share * left))
            parent_of.append(j)
            left -= lengths[-1]
        while left > 0:
            lengths.append(min(left, max(16, int(rng.lognormvariate(median, 1.0)))))
            parent_of.append(j)
            left -= lengths[-1]
    return PlanRequest(
        cluster={"nodes": 8, "gpus_per_node": 8},
        lengths=lengths,
        parent_sizes=sizes,
        parent_of=parent_of,
        mode="repack",
    )


@pytest.mark.parametrize(
    ("seed", "size", "share"),
    [(0, 16, 0.4), (1, 16, 0.4), (3, 16, 0.4), (2, 32, 0.2), (3, 32, 0.2)],
)
def test_parents_full_to_the_token_are_repacked_into_node_local_children(
    seed: int, size: int, share: float
) -> None:
    """Parents full to the token, ~2 documents a rank: their nodes must be filled exactly,
    which the greedy fills missed, so the parents stayed unrepacked (16-rank parents: 7 of 8
    such steps at 1.000x, ~1.15x now; two 32-rank parents, one with a sample of 20% of it: 4
    of 6 at 1.000x, ~1.37x now, which needs the node-level work cap of 2^27, not 2^24)."""
    req = loader_step(seed, size, 9.0, share)
    assert sum(req.lengths) == 64 * 32768
    got = plan(req)
    assert validate_plan(req, got) == []
    widths = {p.id: p.ranks[1] - p.ranks[0] for p in got.parents}
    assert all(c.ranks[1] - c.ranks[0] <= 8 for c in got.children)  # node-local
    assert any(c.ranks[1] - c.ranks[0] < widths[c.parent] for c in got.children)
    assert got.metrics.step_time_ms < got.metrics.baseline_step_time_ms


# --- tiny bins: bounds first, and a work limit that counts every frame -------------------------
# A hostile-input hunt (2026-12-07): 50 samples of 4 tokens on 32 ranks of 7 tokens kept a
# `baseline` request in bin completion for minutes (the service killed its worker on every
# retry): parents of 1 and 2 ranks cannot hold 50 samples, and the work limit counted only the
# bitsets, a few bits per bin of 7 tokens, so it allowed ~3e7 frames.


def _fits(ordered: list[int], loads: list[int], cap: int, i: int = 0) -> bool:
    """``ordered[i:]`` fit on top of ``loads`` (depth first, equal loads tried once)."""
    if i == len(ordered):
        return True
    for b, load in enumerate(loads):
        if load + ordered[i] <= cap and load not in loads[:b]:
            loads[b] += ordered[i]
            if _fits(ordered, loads, cap, i + 1):
                return True
            loads[b] -= ordered[i]
    return False


def _min_bins(lengths: list[int], cap: int) -> int:
    """The exact least number of bins, by search (tiny cases only)."""
    ordered = sorted(lengths, reverse=True)
    return next(k for k in range(1, len(ordered) + 1) if _fits(ordered, [0] * k, cap))


@pytest.mark.parametrize("seed", range(300))
def test_the_bins_needed_are_a_lower_bound(seed: int) -> None:
    rng = random.Random(seed)
    cap = rng.randint(2, 20)
    lengths = [rng.randint(1, cap) for _ in range(rng.randint(1, 8))]
    assert bins_needed(lengths, cap) <= _min_bins(lengths, cap)


@pytest.mark.parametrize(
    ("lengths", "capacities"),
    [
        ([4] * 50, [7] * 32),  # the count: one sample of 4 per bin of 7
        ([4] * 50, [14] * 16),  # three per bin of 14: 48
        ([4] * 40 + [3] * 10, [7] * 32),  # L2: no two 4s share a bin, 40 > 32
    ],
)
def test_hopeless_packings_are_known_without_search(
    lengths: list[int], capacities: list[int]
) -> None:
    assert sum(lengths) <= sum(capacities)
    assert too_many_samples(lengths, range(len(lengths)), capacities)


@pytest.mark.timeout(120)
def test_a_hopeless_packing_of_tiny_bins_stops_at_the_work_limit() -> None:
    """No bound proves this one (bins of 7 and 14 tokens, 30 samples of 4 and 6 of 3): the
    search must give up within its work limit, which now charges every frame."""
    lengths = [4] * 30 + [3] * 6
    capacities = [7] * 16 + [14] * 4
    problem = problem_of(lengths, 24, 7)
    assert not too_many_samples(problem.tokens, range(len(lengths)), capacities)
    assert complete_bins(problem, range(len(lengths)), capacities) is None


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", MODES)
def test_the_hunted_request_of_tiny_ranks_is_planned(mode: str) -> None:
    req = PlanRequest.model_validate(
        {
            "cluster": {"nodes": 4, "gpus_per_node": 8, "max_tokens_per_rank": 7},
            "lengths": [4] * 50,
            "mode": mode,
        }
    )
    got = plan(req, deadline_ms=60_000)
    assert validate_plan(req, got) == []
