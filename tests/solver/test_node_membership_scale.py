"""The node-level membership stage on clusters larger than 64 GPUs (issue: never beaten by a
simple heuristic, on other cluster sizes too).

At 256 GPUs a packed step whose longest sample makes a 16-rank parent unrepacked used to end
1.2 points slower than the reference heuristic: the move phase only moved a sample into a node
with memory for it, while the loader had filled every node, and its fixed work limit covered a
handful of moves on ~1,700 samples x 32 nodes.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from itertools import islice

import pytest

from cli.bench import BenchSize
from solver.budget import Budget
from solver.layout import evaluate
from solver.node_membership import NodeSeed, node_seed
from solver.planner import _baseline_parents, plan
from solver.problem import Problem
from solver.schema import PlanRequest
from solver.trace import Scenario
from solver.validate import validate_plan
from tests.solver.reference_heuristic import reference_step_s
from tests.solver.test_reference import loader_request, reference_for

TOLERANCE = 1e-3


def packed_step(nodes: int, seed: int, step: int) -> PlanRequest:
    """One step of a packing loader on ``nodes`` x 8 GPUs (parents of 16 ranks or wider)."""
    scenario = Scenario.model_validate(
        {
            "job_id": "scale",
            "cluster": {"nodes": nodes, "gpus_per_node": 8},
            "trace": {
                "seed": seed,
                "steps": step + 1,
                "loader": {"min_fill": 0.99, "min_parent_size": 16, "long_sample_share": 0.7},
                "lengths": {"body_median": 2500, "body_sigma": 1.1, "tail_prob": 0.002},
            },
        }
    )
    return next(islice(scenario.requests(), step, None))


def test_repack_parent_is_not_beaten_by_the_reference_at_256_gpus() -> None:
    req = packed_step(32, 4444, 1)
    problem = Problem.from_request(req)
    sizes, _ = _baseline_parents(problem, req)
    ref = reference_step_s(problem, sizes, repack=True)
    assert ref is not None
    got = plan(req.model_copy(update={"mode": "repack+parent"}), deadline_ms=60_000)
    validate_plan(req, got)
    assert got.metrics.step_time_ms / 1e3 <= ref * (1 + TOLERANCE)


@pytest.mark.parametrize(("nodes", "seed", "step"), [(32, 4444, 1), (16, 3333, 7)])
def test_node_seed_moves_keep_every_parent_within_memory(nodes: int, seed: int, step: int) -> None:
    """A receiving node may overflow (its parent then runs unrepacked), a parent never."""
    req = packed_step(nodes, seed, step)
    problem = Problem.from_request(req)
    sizes, _ = _baseline_parents(problem, req)
    seeded = node_seed(problem, sizes, Budget(60_000))
    assert seeded is not None
    members, layout = seeded
    unrepacked = 0
    for parent, group in zip(layout, members, strict=True):
        assert sum(problem.tokens[s] for s in group) <= problem.capacity(parent.size)
        for child in parent.children:
            assert sum(problem.tokens[s] for s in child.samples) <= problem.capacity(child.size)
        unrepacked += len(parent.children) == 1 and parent.children[0].size == parent.size
    assert sorted(s for group in members for s in group) == list(range(problem.num_samples))
    assert unrepacked >= 1  # the longest sample's parent at least
    assert evaluate(layout, problem.cost, problem.costs).step_s > 0


class ScanSeed(NodeSeed):
    """The LPT placement as first written: every open bin scanned for every sample (the
    oracle of the heap-based choice, which must pick the same bins)."""

    def place(self, fixed: Sequence[Sequence[int]] | None = None) -> bool:
        p = self.p
        self.fixed = fixed is not None
        owner = {s: j for j, group in enumerate(fixed or []) for s in group}
        for s in sorted(range(p.num_samples), key=lambda s: (-p.work_s[s], s)):
            fits = [
                b
                for j, bins in enumerate(self.bins)
                for b in (bins[:1] if self.whole[j] else bins)
                if self._room(b, s) and (not self.fixed or b.parent == owner[s])
            ]
            if fits and not self._needs_whole(s, owner):
                self._add(min(fits, key=lambda b: self._key(b, s)), s)
                continue
            holders = [
                j
                for j in range(len(self.sizes))
                if self._parent_tokens(j) + p.tokens[s] <= p.capacity(self.sizes[j])
                and (not self.fixed or j == owner[s])
            ]
            if not holders:
                return False
            j = min(holders, key=lambda j: (self._parent_load(j), j))
            self.whole[j] = True
            self._widest = None
            self._add(self.bins[j][0], s)
        return True


@pytest.mark.parametrize(
    ("nodes", "gpus", "size", "shares", "seed"),
    [
        (32, 8, 8, (0.0,), 1),  # memory-tight: most bins set aside for the last samples
        (8, 8, 16, (0.6,), 2),  # a whole parent for the longest sample
        (8, 4, 16, (0.35, 0.35), 3),  # two samples longer than a node
        (4, 8, 2, (0.0,), 4),  # parents narrower than a node: bins of 2 ranks
    ],
)
def test_lpt_by_heaps_places_every_sample_where_a_scan_of_every_bin_does(
    nodes: int, gpus: int, size: int, shares: tuple[float, ...], seed: int
) -> None:
    req = loader_request(nodes, gpus, size, shares, seed)
    problem = Problem.from_request(req)
    sizes = list(req.parent_sizes or [])
    # bins of unequal ranks: parents of g/2, g/4, ..., 1, 1 ranks on the first node, two of
    # g/2 on the second, one per node after
    halves = [gpus >> i for i in range(1, gpus.bit_length())]
    mixed = [*halves, 1, gpus // 2, gpus // 2] + [gpus] * (nodes - 2)
    assert sum(mixed) == nodes * gpus
    for parent_sizes, repack in itertools.product((sizes, mixed), (True, False)):
        heaps = NodeSeed(problem, parent_sizes, repack)
        scan = ScanSeed(problem, parent_sizes, repack)
        placed = heaps.place()
        assert placed == scan.place()
        assert heaps.whole == scan.whole
        assert [[b.samples for b in bins] for bins in heaps.bins] == [
            [b.samples for b in bins] for bins in scan.bins
        ]
        if placed:
            heaps.improve()  # the moves change parents through the same bookkeeping
        for j, bins in enumerate(heaps.bins):  # the per-parent sums LPT reads, kept exactly
            assert heaps._parent_tokens(j) == sum(b.tokens for b in bins)
            assert heaps._parent_full_s(j) == sum(b.full_s for b in bins)


@pytest.mark.parametrize(
    ("size", "shares", "seed"), [(8, (0.6,), 1), (8, (0.35, 0.35), 2), (16, (0.35, 0.35), 1)]
)
def test_packed_256_gpu_steps_are_not_beaten_by_the_reference(
    size: int, shares: tuple[float, ...], seed: int
) -> None:
    """~2,850 samples on 32 nodes. With parents of one node, the node stage used to be skipped
    above 60,000 sample x bin pairs (its placement scanned every bin per sample), and the
    greedy path alone ended 1.2% (one sample longer than a node) and 10.5% (two in one parent)
    slower than the reference. With 16-rank parents and two long samples in one, LPT by sparse
    work alone kept both in that parent (one per node): 0.65% slower than the reference
    (its unrepacked variant), 28% above the bound."""
    req = loader_request(32, 8, size, shares, seed)
    base = plan(req.model_copy(update={"mode": "baseline"}))
    ref = reference_for(req, "repack+parent", base)  # repacked or not, whichever is faster
    assert ref is not None
    got = plan(req.model_copy(update={"mode": "repack+parent"}), deadline_ms=60_000)
    validate_plan(req, got)
    assert got.metrics.step_time_ms / 1e3 <= ref * (1 + TOLERANCE)


@pytest.mark.parametrize("shares", [(0.6,), (0.35, 0.35)])
def test_packed_512_gpu_steps_are_not_beaten_by_the_unrepacked_reference(
    shares: tuple[float, ...],
) -> None:
    """~5,700 samples on 64 nodes of 8-rank parents (~370,000 sample x bin pairs): above the
    node stage's old limit of 100,000 pairs, where the greedy path alone ended 1.9% (one sample
    longer than a node) and 9.4% (two in one parent) slower than the reference's unrepacked
    variant (the repacked one, which takes ~15 s here, is not needed to show it)."""
    req = loader_request(64, 8, 8, shares, 1)
    problem = Problem.from_request(req)
    sizes = list(req.parent_sizes or [])
    ref = reference_step_s(problem, sizes, repack=False)
    assert ref is not None
    got = plan(req.model_copy(update={"mode": "repack+parent"}), deadline_ms=60_000)
    validate_plan(req, got)
    assert got.metrics.step_time_ms / 1e3 <= ref * (1 + TOLERANCE)


def test_a_packed_1024_gpu_step_ends_near_its_bound() -> None:
    """~11,300 samples on 128 nodes of 8-rank parents (~1.45 million sample x bin pairs, where
    the reference takes minutes): with the node stage skipped the plan ended 22% above its
    lower bound (5,316 ms, where mode ``sizing`` found 4,257 ms); with it, 0.2%."""
    req = loader_request(128, 8, 8, (0.6,), 1)
    got = plan(req.model_copy(update={"mode": "repack+parent"}), deadline_ms=60_000)
    validate_plan(req, got)
    assert got.metrics.gap is not None and got.metrics.gap <= 0.02


@pytest.mark.parametrize(("nodes", "gpus", "size"), [(8, 8, 16), (4, 8, 16), (8, 4, 8)])
def test_lpt_puts_two_long_samples_into_different_parents(nodes: int, gpus: int, size: int) -> None:
    """Each fills 35% of a parent and fits a node: on the first parent's empty second node the
    second one would double that parent's full attention, which LPT must count (Ulysses
    spreads a parent's full-attention layers over all its ranks)."""
    req = loader_request(nodes, gpus, size, (0.35, 0.35), 1)
    problem = Problem.from_request(req)
    seed = NodeSeed(problem, list(req.parent_sizes or []))
    assert seed.place()
    holder = {s: b.parent for bins in seed.bins for b in bins for s in b.samples}
    assert holder[0] != holder[1]  # samples 0 and 1 are the two long ones
    assert min(req.lengths[0], req.lengths[1]) > 2 * max(req.lengths[2:])


def test_an_unpacked_1024_gpu_bench_step_ends_near_its_bound() -> None:
    """``repack bench``'s 1,024-GPU trace (60% of memory, ~6,000 samples x 128 nodes, ~770,000
    sample x bin pairs): below ``TIGHT_FILL``, so until the pair limit was raised the stage was
    skipped, and `repack+parent` ended 11.3% above its bound on this step (0.0% with it)."""
    req = next(iter(BenchSize(1024, 6000).scenario(1, 0).requests()))
    got = plan(req.model_copy(update={"mode": "repack+parent"}), deadline_ms=60_000)
    validate_plan(req, got)
    assert got.metrics.gap is not None and got.metrics.gap <= 0.02
