"""Never beaten by a simple heuristic: every optimising mode's plan is at most 0.1% slower than
the reference of ``reference_heuristic.py`` (LPT onto nodes, best child size per node, greedy
moves), on random packed (memory-tight, ``parent_of`` given) and unpacked requests.

Mode ``baseline`` is left out: it is the upstream layout by definition, not a search.
"""

from __future__ import annotations

import itertools
import json
import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from solver.planner import plan
from solver.problem import Problem
from solver.schema import ClusterSpec, ModelSpec, Plan, PlanRequest, allowed_parent_sizes
from solver.trace import Scenario, load_trace
from solver.validate import validate_plan
from tests.solver.reference_heuristic import reference_step_s

MAX_TOKENS = 32768
PACKED_SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "gpu64-packed.yaml"
SCENARIO_200 = PACKED_SCENARIO.with_name("gpu64-200steps.yaml")
TOLERANCE = 1e-3
MODES = ("sizing", "repack", "repack+parent", "repack+sizing")


def packed_lengths(
    rng: random.Random, sizes: list[int], long_share: float | Sequence[float]
) -> tuple[list[int], list[int]]:
    """Every parent filled to >= 99% of its memory, as a packing loader does; parent 0 may
    start with long samples (``long_share`` of its memory each: a loader filling parents in
    arrival order puts two long samples drawn close together into one parent)."""
    shares = [long_share] if isinstance(long_share, float | int) else list(long_share)
    lengths: list[int] = []
    parent_of: list[int] = []
    for j, size in enumerate(sizes):
        cap = size * MAX_TOKENS
        left = cap
        for share in shares if j == 0 else []:
            n = int(share * cap)
            if n <= 0:
                continue
            lengths.append(n)
            parent_of.append(j)
            left -= n
        while left > 0.01 * cap:
            n = max(16, min(left, int(rng.lognormvariate(7.5, 1.0))))
            lengths.append(n)
            parent_of.append(j)
            left -= n
    return lengths, parent_of


def loader_request(
    nodes: int, gpus: int, size: int, long_share: float | Sequence[float], seed: int
) -> PlanRequest:
    """A packed step as a loader sends it: parents of ``size`` ranks, each filled to >= 99%,
    ``parent_of`` given; parent 0 starts with a sample of ``long_share`` of its memory."""
    sizes = [size] * (nodes * gpus // size)
    lengths, parent_of = packed_lengths(random.Random(seed), sizes, long_share)
    return PlanRequest.model_validate(
        {
            "cluster": {"nodes": nodes, "gpus_per_node": gpus},
            "lengths": lengths,
            "parent_sizes": sizes,
            "parent_of": parent_of,
        }
    )


@st.composite
def requests(draw: st.DrawFn) -> PlanRequest:
    nodes = draw(st.integers(1, 4))
    gpus = draw(st.sampled_from([2, 4, 8]))
    world = nodes * gpus
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    cluster = ClusterSpec(nodes=nodes, gpus_per_node=gpus)
    allowed = [s for s in allowed_parent_sizes(cluster, ModelSpec()) if s >= 2]
    data: dict[str, Any] = {"cluster": {"nodes": nodes, "gpus_per_node": gpus}}
    if draw(st.booleans()) and allowed:  # packed by a loader
        size = draw(st.sampled_from(allowed))
        sizes = [size] * (world // size)
        shares = draw(st.sampled_from([(0.0,), (0.3,), (0.6,), (0.35, 0.35), (0.45, 0.3)]))
        data["lengths"], data["parent_of"] = packed_lengths(rng, sizes, shares)
        data["parent_sizes"] = sizes
    else:
        fill = draw(st.floats(0.05, 0.6))
        n = draw(st.integers(1, 60))
        raw = [rng.lognormvariate(0, 1.5) for _ in range(n)]
        scale = fill * world * MAX_TOKENS / sum(raw)
        longest = int(0.9 * max(allowed or [1]) * MAX_TOKENS)
        data["lengths"] = [max(1, min(longest, int(x * scale))) for x in raw]
    return PlanRequest.model_validate(data)


def reference_for(req: PlanRequest, mode: str, base: Plan) -> float | None:
    """The reference's step time for ``mode``. An unrepacked layout is a layout of every
    repacking mode too, so the modes that choose membership must beat both references."""
    problem = Problem.from_request(req)
    sizes = [p.ranks[1] - p.ranks[0] for p in base.parents]
    if mode == "repack":
        fixed = [list(p.samples) for p in base.parents]
        return reference_step_s(problem, sizes, repack=True, fixed=fixed)
    found = [reference_step_s(problem, sizes, repack=False)]
    if mode != "sizing":
        found.append(reference_step_s(problem, sizes, repack=True))
    return min((t for t in found if t is not None), default=None)


@settings(
    max_examples=int(os.environ.get("REPACK_REFERENCE_EXAMPLES", "25")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
)
@given(requests())
def test_no_mode_is_beaten_by_the_reference(req: PlanRequest) -> None:
    base = plan(req.model_copy(update={"mode": "baseline"}))
    for mode in MODES:
        ref = reference_for(req, mode, base)
        if ref is None:
            continue
        got = plan(req.model_copy(update={"mode": mode}), deadline_ms=60_000)
        assert got.metrics.step_time_ms / 1e3 <= ref * (1 + TOLERANCE), (mode, ref)


@pytest.mark.parametrize(
    ("nodes", "gpus", "size", "long_share", "seed"),
    [
        # 64 GPUs, four 16-rank parents packed full, one with a 60% sample: every parent ends
        # up unrepacked in the reference, which moves short samples out of the critical one
        # into the others' spare memory. The node stage only moves a sample into a node with
        # room (none, the loader filled them); the LNS's heavy swaps close it once its budget
        # allows ~30 moves (it stopped 0.12% slower after 3).
        (8, 8, 16, 0.6, 1),
        # Eight 8-rank parents (one node each): 0.29% slower. The node stage alone still loses
        # (its move phase spends its work re-packing the critical node for heavy samples no
        # receiver can take); the LNS stage after it (membership_lns) closes the gap.
        (8, 8, 8, 0.6, 1),
        # Packed with no long sample: every child is full, so single moves stop 0.36% (two
        # 16-rank parents) and 0.17% (four 8-rank parents) slower; swaps of a heavy sample
        # for a lighter one of about its length (``child_swaps``) close it.
        (4, 8, 16, 0.0, 3),
        (4, 8, 8, 0.0, 2),
    ],
)
def test_packed_parents_give_short_samples_to_unrepacked_ones(
    nodes: int, gpus: int, size: int, long_share: float, seed: int
) -> None:
    req = loader_request(nodes, gpus, size, long_share, seed)
    ref = reference_step_s(Problem.from_request(req), [size] * (nodes * gpus // size), True)
    assert ref is not None
    got = plan(req.model_copy(update={"mode": "repack+parent"}), deadline_ms=60_000)
    assert got.metrics.step_time_ms / 1e3 <= ref * (1 + TOLERANCE)


@pytest.mark.parametrize(("gpus", "shares"), [(8, (0.36, 0.35)), (4, (0.3, 0.28))])
def test_two_samples_longer_than_a_node_in_one_packed_parent(
    gpus: int, shares: tuple[float, float]
) -> None:
    """A loader filling parents in arrival order put two samples longer than a node into one
    full parent (an independent 64-GPU packed trace: -0.85% instead of -20%). Each must end in
    a parent of its own; only a swap of one of them against hundreds of short samples gets
    there, which no single move or bounded neighbourhood makes."""
    req = loader_request(8, gpus, 4 * gpus, shares, 3)
    node_tokens = gpus * MAX_TOKENS
    assert sum(n > node_tokens for n in req.lengths) == 2
    problem = Problem.from_request(req)
    sizes = list(req.parent_sizes or [])
    refs = [reference_step_s(problem, sizes, repack=r) for r in (False, True)]
    ref = min(t for t in refs if t is not None)
    for mode in ("repack+parent", "repack+sizing"):
        got = plan(req.model_copy(update={"mode": mode}), deadline_ms=60_000)
        assert got.metrics.step_time_ms / 1e3 <= ref * (1 + TOLERANCE), (mode, ref)


@pytest.mark.slow
def test_step_50_of_the_packed_scenario_is_not_beaten_by_the_reference() -> None:
    """Four full 16-rank parents: with the LNS at 4x its budget (2026-12-01) `repack+parent`
    stopped 0.12% slower than the reference (the node stage ends 1.6% behind it there). The
    repacked reference takes ~2 minutes on this step (it re-packs every bin per trial)."""
    scenario = Scenario.model_validate(yaml.safe_load(PACKED_SCENARIO.read_text()))
    req = next(itertools.islice(scenario.requests(), 50, None))
    base = plan(req.model_copy(update={"mode": "baseline"}))
    ref = reference_for(req, "repack+parent", base)
    assert ref is not None
    got = plan(req.model_copy(update={"mode": "repack+parent"}), deadline_ms=60_000)
    assert got.metrics.step_time_ms / 1e3 <= ref * (1 + TOLERANCE)


DATA = Path(__file__).resolve().parent / "data"


def test_a_critical_unrepacked_parent_still_trades_samples() -> None:
    """16 GPUs, 111 short samples (12% of memory), eight 2-rank parents: the critical parent
    holds the longest sample unrepacked, and the child swaps, which left unrepacked parents
    wider than a rank alone, stopped there 0.15% behind the reference (found by a randomised
    hunt over cluster shapes and models)."""
    req = PlanRequest.model_validate(json.loads((DATA / "flat-16gpu-111.json").read_text()))
    base = plan(req.model_copy(update={"mode": "baseline"}))
    ref = reference_for(req, "repack+parent", base)
    assert ref is not None
    got = plan(req.model_copy(update={"mode": "repack+parent"}), deadline_ms=60_000)
    assert validate_plan(req, got) == []
    assert got.metrics.step_time_ms / 1e3 <= ref * (1 + TOLERANCE)


@pytest.mark.slow
def test_step_11_of_the_200_step_scenario_is_not_beaten_by_the_reference() -> None:
    """Two 32-rank parents, one holding a 247k-token sample unrepacked: every move of the LNS
    was a heavy swap worth 1e-6 of the step, each taken, so the budget ran out 0.07% behind
    the reference (``membership_lns.MIN_GAIN``)."""
    req = next(itertools.islice(load_trace(SCENARIO_200), 11, None))
    base = plan(req.model_copy(update={"mode": "baseline"}))
    ref = reference_for(req, "repack+parent", base)
    assert ref is not None
    got = plan(req.model_copy(update={"mode": "repack+parent"}), deadline_ms=60_000)
    assert got.metrics.step_time_ms / 1e3 <= ref


def test_long_samples_go_to_narrow_parents_when_the_wide_one_crosses_nodes() -> None:
    """32 GPUs of 4-GPU nodes, parents [4, 4, 4, 4, 16], three samples longer than a rank's
    memory: the node stage's LPT saw the 16-rank parent's shared attention but not its
    inter-node all-to-all, put all three there, unrepacked, and ended 4.1% behind the
    reference, which gives each a 4-rank parent (found by a randomised hunt)."""
    req = PlanRequest.model_validate(
        json.loads((DATA / "wide-parent-4gpu-nodes-30.json").read_text())
    )
    base = plan(req.model_copy(update={"mode": "baseline"}))
    for mode in ("repack+parent", "repack+sizing"):
        ref = reference_for(req, mode, base)
        assert ref is not None
        got = plan(req.model_copy(update={"mode": mode}), deadline_ms=60_000)
        assert validate_plan(req, got) == []
        assert got.metrics.step_time_ms / 1e3 <= ref * (1 + TOLERANCE)


HUNTED = [
    # (request file, modes that ended behind the reference before the fix)
    ("hunt-2x4-parents-of-2.json", ("repack+parent", "repack+sizing")),  # +0.53%
    ("hunt-2x4-sizing.json", ("sizing",)),  # +0.20%
    ("hunt-2x4-one-parent.json", ("repack",)),  # +0.60%
    ("hunt-2x8-heads-64.json", ("repack+parent",)),  # +0.99%
    ("hunt-8x2-one-parent.json", ("repack", "repack+parent")),  # +0.90% / +0.18%
    ("hunt-4x8-one-parent-35.json", ("repack", "repack+parent")),  # +0.145%
    ("hunt-2x4-heads-64-kv-4.json", ("repack", "repack+parent")),  # +0.31%
    # 32 GPUs of 4-GPU nodes, two full 16-rank parents, 317 samples: the move phase spent its
    # whole budget on four moves (heavy samples tried into every node of their own parent).
    ("hunt-8x4-two-parents-16.json", ("repack",)),  # +0.29%
    # 16 GPUs of 2-GPU nodes, a loader's mixed parent sizes, one sample longer than a node:
    # every parent unrepacked and balanced by exact time beats every repacked membership.
    ("hunt-8x2-parents-4-8-2-2.json", ("repack+parent",)),  # +1.35%
    ("hunt-8x2-parents-4-8-4.json", ("repack+parent",)),  # +0.27%
    # One 8-rank parent on two 4-GPU nodes at 99% of memory: a child of 4 on one node for its
    # lower busiest rank, though the other node's children of 2 set the parent's anyway.
    ("hunt-2x4-child-sizes-per-node.json", ("repack", "repack+parent")),  # +0.40%
    # One 32-rank parent on eight 4-GPU nodes at 99% of memory, one sample longer than a rank:
    # the node with it chose one child of 4 over two of 2 for its lower busiest rank, though
    # the other nodes' full ranks set the parent's; the moves then balanced the wrong nodes.
    ("hunt-8x4-one-parent-memory-tight.json", ("repack", "repack+parent")),  # +0.27%
    # One 8-rank parent on four 2-GPU nodes at 37% fill: the node stage's layout was slower
    # than the polished children before the swaps and faster after them.
    ("hunt-4x2-one-parent-37.json", ("repack", "repack+parent")),  # +0.26%
    # One 8-rank parent of 2-GPU nodes, 86 / 88 samples: every seed of the node stage had
    # reached a local optimum of the re-packing moves through edits, the children
    # long-with-long; the seeds that re-pack from the first move (``node_seeds``) fix both.
    ("hunt-4x2-one-parent-86.json", ("repack",)),  # +0.70%
    ("hunt-4x2-one-parent-88.json", ("repack",)),  # +0.24%
    # 64 GPUs, a loader's mixed sizes [4, 4, 32, 16, 8], 61 samples at 41% fill: every parent
    # level at the step time after the moves with edits; re-packing moves from LPT by work
    # end below the reference (which keeps one 4-rank parent unrepacked).
    ("hunt-8x8-mixed-sizes-61.json", ("repack+parent",)),  # +0.23%
    # 32 GPUs of 4-GPU nodes, four 8-rank parents packed to 90% (FFS, 16 heads), 287 / 322
    # samples: just above the small requests' 2,000 pairs, one LPT rule alone; both rules at
    # half the move work each, and re-packing moves for a fixed membership, up to 3,000 pairs.
    ("hunt-8x4-four-parents-8-39.json", ("repack+parent", "repack+sizing")),  # +0.51%
    ("hunt-8x4-four-parents-8-32.json", ("repack",)),  # +0.15%
    # 32 GPUs of 4-GPU nodes, two 16-rank parents at 99% / 98.6% of memory (pattern FS, 64
    # heads, 8 kv heads), 369 / 357 samples: the reference runs nodes of the critical parent
    # as four children of 1 rank filled to within 50 tokens; LPT by work found no such packing
    # and the planner kept children of 2 and 4 (level at the top: no single move lowered the
    # parent). Children narrower than a node are now filled to the token where LPT runs out
    # of memory (``node_packing.packed_children``).
    ("hunt-8x4-two-parents-16-node-of-ones.json", ("repack",)),  # +0.18%
    ("hunt-8x4-two-parents-16-node-of-four.json", ("repack",)),  # +0.64%
    # 64 GPUs, a loader's mixed sizes [16, 16, 32] at 98.5% (FSSSSSS, 32 heads), a sample of
    # 419,430 tokens: the node stage made the first empty parent that holds it whole (a
    # 16-rank one, every empty parent tied on its load before the sample); by the load with
    # it, the 32-rank parent.
    ("hunt-8x8-parents-16-16-32.json", ("repack+parent",)),  # +2.05%
    # 32 GPUs of 4-GPU nodes, a loader's sizes [4, 4, 2, 2, 2, 2, 8, 8] at 98.9%, 315 samples
    # (3,150 pairs, just above ``TWO_RULE_PAIRS``): LPT with full attention gave the longest
    # sample (2.4 ranks' worth) to an 8-rank parent, which then was the critical one; LPT by
    # work alone gives it a 4-rank one, as the reference does (``MIXED_TWO_RULE_PAIRS``).
    ("hunt-8x4-mixed-sizes-4-4-2-2-2-2-8-8.json", ("repack+parent",)),  # +1.66%
    # Mode ``repack`` on requests above the small ones kept only the faster of the polished
    # children and the node stage's best seed *before* the child swaps and per-node sizes,
    # and the other one was ahead after them; both are finished now (``_fixed_best``).
    # 32 GPUs of 2-GPU nodes, four 8-rank parents at 94.6% (FFS, 32 heads), 310 samples: the
    # seed was ahead before (6468.0 vs 6474.8 ms), the polished children after (6405.9 vs
    # 6433.0 ms; the reference 6406.0 ms).
    ("hunt-16x2-parents-8.json", ("repack",)),  # +0.42%
    # 32 GPUs of 4-GPU nodes, two 16-rank parents at 94% (FSSS, 64 heads), 341 samples: the
    # polished children (7273.5 ms) kept the long samples on nodes 0-1 of the critical parent,
    # level at the top, where no swap lowers it; the node stage's seeds (7415.6 / 7419.3 ms,
    # long samples spread over the nodes, as the reference's LPT onto nodes) finish at
    # 7232.4 / 7230.7 ms (the reference 7245.9 ms). (bench/hunt_reference.py --family
    # two-parents-16-8x4, seed 129.)
    ("hunt-8x4-two-parents-16-129.json", ("repack",)),  # +0.37%
    # Two 16-rank parents of 32 GPUs (and one unpacked 32-GPU step of 75 samples), both
    # parents level at the top in children of one rank: the swaps gain there in many steps of
    # 0.01-0.02% each and ran out of work, and no one-for-one swap moves enough of the
    # critical parent's full-attention work. Fixed by the one-for-many exchange between
    # parents (``child_swaps._Swaps._exchange_many``) and four times the swap work on
    # requests of up to 32 ranks (``child_swaps.SMALL_WORLD``); open until 2026-12-05.
    # 32 GPUs of 8-GPU nodes, two 16-rank parents at 89.7% (FSSS, window 1,024), 282 samples.
    ("hunt-4x8-two-parents-16.json", ("repack+parent",)),  # +0.14%
    # 32 GPUs of 8-GPU nodes, 75 samples unpacked, sizes derived (2026-12-03 evening hunt).
    ("hunt-4x8-unpacked-75.json", ("repack+parent",)),  # +0.11%
    # 32 GPUs of 4-GPU nodes, two 16-rank parents at 94% (FSSS), 330 samples (2026-12-04,
    # bench/hunt_reference.py --family two-parents-16-8x4, seed 238; 1 of 40): both parents
    # level at the top in children of 1 rank, ours with the long samples on a few ranks and
    # the short ones on others, the reference one long and ten medium samples per rank.
    ("hunt-8x4-two-parents-16-238.json", ("repack+parent",)),  # +0.115%
    # 32 GPUs of 8-GPU nodes, two 16-rank parents at 89% (2026-12-04, --family
    # two-parents-16-4x8, seed 511; 1 of 30, and 0 of 150 new `mixed` requests): the same
    # level plateau, children of 1 rank with long and short samples apart.
    ("hunt-4x8-two-parents-16-511.json", ("repack+parent",)),  # +0.166%
    # The same family on new seeds after the fill-priced tilings (2026-12-04 evening, seed 555;
    # 1 of 30, 0 of 30 `two-parents-16-8x4`, 0 of 80 `mixed`): behind by the same amount with
    # the code before them, the same plateau.
    ("hunt-4x8-two-parents-16-555.json", ("repack+parent",)),  # +0.137%
    # 32 GPUs of 8-GPU nodes, two 16-rank parents at 94% (2026-12-05, --family
    # two-parents-16-4x8, seed 3010; 1 of 16 after the one-for-many exchange): mode ``repack``
    # kept a 5,585-token sample in the critical parent's child of 8 beside the longest sample
    # (235,929 tokens), the children of 2 on its other node each ~2,300 tokens short of memory
    # for it, so no swap took it; that node packed again with it does (``node_repack_moves``).
    ("hunt-4x8-two-parents-16-3010.json", ("repack",)),  # +0.415%
    # 32 GPUs of 8-GPU nodes, two 16-rank parents at 98.5% (FFS, 64 heads, window 1,024), 328
    # samples (2026-12-06, --family two-parents-16-4x8, seed 920021; 1 of 60): the critical
    # parent's node 0 is one child of 8 around a 157,286-token sample, node 1 eight children
    # of 1 rank level at 32,340 tokens, the busiest ranks of its full layers. No single move
    # lowers eight level ranks; the reference moves samples from node 1 to node 0 and re-packs
    # node 1 each time, which levels every rank of the parent near 32,170 tokens.
    ("hunt-4x8-two-parents-16-920021.json", ("repack",)),  # +0.139%
    # 32 GPUs of 4-GPU nodes, four 8-rank parents (FFS, 16 heads), 312 samples (2026-12-06
    # night, --family four-parents-8x4, seed 9001015; 1 of ~20): the critical parent's second
    # node as two children of 2 at 29,609 tokens a rank, where the reference moves ~1,900
    # tokens to the first node's child of 4 and packs the second as four children of 1. The
    # node re-packing moves do that, but only ran up to 2,000 sample x node-bin pairs (this
    # step has 2,496); they now run on every request of up to 32 ranks.
    ("hunt-8x4-four-parents-8-9001015.json", ("repack",)),  # +0.201%
    # 32 GPUs of 2-GPU nodes, four 8-rank parents at 89.5% (FS, 16 heads), 271 samples, three
    # of them longer than a node's 65,536 tokens (2026-12-07 night, --family
    # four-parents-8-16x2, seed 5300032; 1 of 34): the node stage's LPT made a second parent
    # whole for the second such sample (the least loaded parent that holds it), and no move
    # makes a parent split again: 4,304.1 ms against the reference's 4,158.0, which keeps
    # them in one whole parent. The stage now also runs from the LPT that puts such a sample
    # into a whole parent with room (``NodeSeed.few_whole``): 4,081.2 ms (the bound 4,076.9).
    ("hunt-16x2-four-parents-8-5300032.json", ("repack+parent",)),  # +3.514%
]


OPEN: list[tuple[str, tuple[str, ...]]] = [
    # Known steps still behind the reference by more than the tolerance.
    # 64 GPUs of 8-GPU nodes, two 32-rank parents at 98.2% (FFS, 64 heads, 16 kv heads, window
    # 8,192), 686 samples (2026-12-07, the loader of bench/hunt_reference.py's `wide_packed`
    # on 8 x 8 with parents [32, 32], seed 920003; 1 of 12, 0 of 48 in three other new
    # families): mode ``repack`` 8,716.9 ms against the reference's 8,688.9 (+0.32%). Parent 0
    # ends as one child of 2 and thirty children of 1, each full to ~32,7xx of 32,768 tokens,
    # so no swap moves anything; the reference spreads the parent's samples over its nodes by
    # work first and packs nodes 0-1 as children of 2 and nodes 2-3 as children of 1. The node
    # re-packing moves only run up to 32 ranks (and did not help here when forced on). The node
    # stage's moves with a fixed membership reach it with more work: 4x / 8x / 16x gave
    # 8,707.7 / 8,687.6 / 8,685.9 ms for 161 / 270 / 452 ms of CPU (79 now), and 8x took
    # `repack+parent`'s max CPU on 10 steps of this family from 402 to 606 ms (it computes
    # mode `repack`'s answer where owed) for -0.02% summed step time, so not taken. For scale:
    # the reference itself takes ~12 s of CPU here (33,704 parent re-packings over 50 moves;
    # its LPT start alone is 8,747.4 ms, 0.35% behind the planner).
    ("hunt-8x8-two-parents-32-920003.json", ("repack",)),  # +0.32%
    # 48 GPUs of 8-GPU nodes, 65,536 tokens per rank, loader sizes [32, 16] without
    # `parent_of` (the upstream membership token-balanced), 517 samples at 95% (64 heads, 8 kv
    # heads, FFS, window 8,192; 2026-12-07, second session's hunt of new shapes: 1 of 576
    # requests over 15 families, none in any other mode): mode ``repack`` 17,254.1 ms against
    # the reference's 17,231.7 (+0.13%). The node stage's moves at 2x / 4x / 8x work gave
    # 17,241.8 / 17,247.3 / 17,247.3 ms, so more of the same work does not reach it; the
    # reference takes 9.4 s of CPU here against the planner's 82 ms.
    ("hunt-6x8-parents-32-16-no-parent-of-1019.json", ("repack",)),  # +0.13%
    # 32 GPUs of 8-GPU nodes, four 8-rank parents (one node each), 32 unpacked samples at 30%
    # (2026-12-07 afternoon: the property test's own strategy from hypothesis seed 11, 1 of
    # 2,400 examples over seeds 11-16): `repack+parent` and `repack+sizing` 2,158.7 ms against
    # the reference's 2,156.0 (+0.125%). The parents end level within 1.6 ms; the reference's
    # moves end with two parents as two children of 4, every node-stage seed with one. A
    # whole-problem joint-model move reaches it at 0.1 deterministic seconds, at 2.7x the
    # 16-GPU bench's CPU (docs/solver.md, the reference heuristic), so not taken.
    ("hunt-4x8-unpacked-32-seed11.json", ("repack+parent", "repack+sizing")),  # +0.125%
]


@pytest.mark.xfail(strict=True, reason="open hunt finding: see OPEN")
@pytest.mark.parametrize(("name", "modes"), OPEN)
def test_open_hunt_findings_are_still_behind_the_reference(
    name: str, modes: tuple[str, ...]
) -> None:
    """Known steps where a mode still ends behind the reference by more than the tolerance,
    kept so that a fix shows up (the strict xfail then fails and the entry moves to
    ``HUNTED``)."""
    test_packed_steps_of_small_clusters_are_not_beaten_by_the_reference(name, modes)


@pytest.mark.parametrize(("name", "modes"), HUNTED)
def test_packed_steps_of_small_clusters_are_not_beaten_by_the_reference(
    name: str, modes: tuple[str, ...]
) -> None:
    """Packed loader steps of 2-, 4- and 8-GPU nodes (one or a few parents, 16-64 heads) from
    a randomised hunt, each behind the reference by 0.15-1.0% in the modes named: the node
    stage now also seeds from LPT by work alone on small requests
    (``node_membership.SECOND_SEED_PAIRS``) and ends with moves that re-pack both nodes, and
    mode ``repack``'s layout gets the child swaps inside its parents."""
    req = PlanRequest.model_validate(json.loads((DATA / name).read_text()))
    base = plan(req.model_copy(update={"mode": "baseline"}))
    for mode in modes:
        ref = reference_for(req, mode, base)
        assert ref is not None
        # the wall clock out of reach: the plan is the deterministic budget's on any machine
        # (hunt-4x2-one-parent-37 takes ~1 s of CPU and hit the 1 s safety net under load)
        got = plan(req.model_copy(update={"mode": mode}), deadline_ms=60_000)
        assert validate_plan(req, got) == []
        assert got.metrics.step_time_ms / 1e3 <= ref * (1 + TOLERANCE), mode
