"""The node stage's vectorised receiver floors (``receiver_floors``) against the exact ones
(``NodeSeed._floor_with``): a prefilter that rules out a receiver the exact floor would let
through changes plans, one that is lower than needed only costs time."""

from __future__ import annotations

from functools import partial
from itertools import islice

import pytest

from cli.bench import BenchSize
from solver import node_membership
from solver.node_membership import NodeSeed
from solver.planner import _baseline_parents
from solver.problem import Problem
from solver.receiver_floors import SLACK
from tests.solver.test_reference import loader_request


@pytest.mark.parametrize(
    ("nodes", "gpus", "size", "shares", "seed"),
    [
        (8, 8, 16, (0.6,), 2),  # a whole parent for the longest sample
        (8, 4, 16, (0.35, 0.35), 3),  # two samples longer than a node
        (4, 8, 2, (0.0,), 4),  # parents narrower than a node
        (16, 8, 8, (0.0,), 5),  # one bin per parent
    ],
)
def test_vectorised_floors_equal_the_exact_ones(
    nodes: int, gpus: int, size: int, shares: tuple[float, ...], seed: int
) -> None:
    req = loader_request(nodes, gpus, size, shares, seed)
    problem = Problem.from_request(req)
    seed_ = NodeSeed(problem, list(req.parent_sizes or []))
    assert seed_.place()
    for j in range(len(seed_.sizes)):  # some bins packed (fresh), some not: both paths
        if j % 2 == 0:
            seed_._time(j)
    receivers = seed_._open_bins()
    terms = seed_._receiver_terms(receivers)
    compared = 0
    for s in range(0, problem.num_samples, max(1, problem.num_samples // 200)):
        sample = (problem.full_s[s], problem.tokens[s], problem.sparse_s[s], problem.work_s[s])
        floors = terms.floors_with(problem.cost, *sample)
        for dst, floor in zip(receivers, floors.tolist(), strict=True):
            if s in dst.samples:
                continue
            exact = seed_._floor_with(dst, s)
            assert floor == pytest.approx(exact, rel=1e-12)
            compared += 1
    assert compared > 100


def test_a_receiver_is_ruled_out_only_above_the_target() -> None:
    req = loader_request(8, 8, 16, (0.6,), 2)
    problem = Problem.from_request(req)
    seed_ = NodeSeed(problem, list(req.parent_sizes or []))
    assert seed_.place()
    receivers = seed_._open_bins()
    terms = seed_._receiver_terms(receivers)
    s = problem.num_samples - 1
    sample = (problem.full_s[s], problem.tokens[s], problem.sparse_s[s], problem.work_s[s])
    floors = terms.floors_with(problem.cost, *sample).tolist()
    target = sorted(floors)[len(floors) // 2]
    out = terms.clearly_above(problem.cost, target, sample)
    assert out == [f > target * (1 + SLACK) for f in floors]
    assert any(out) and not all(out)


def test_a_receiver_ruled_out_by_its_edit_fails_the_trial_at_the_same_charge() -> None:
    """``ReceiverTerms.screen``'s second answer stands in for ``NodeSeed._trial``: every
    receiver it rules out must be one whose exact trial edit is no faster than the target,
    charged the work the trial would have been charged."""
    req = next(islice(BenchSize(256, 1500).scenario(2, 0).requests(), 1, None))
    problem = Problem.from_request(req)
    sizes, _ = _baseline_parents(problem, req)
    seed_ = NodeSeed(problem, sizes)
    assert seed_.place()
    for j in range(len(sizes)):
        seed_._time(j)  # every bin packed, as after a move phase's first evaluations
    c = max(range(len(seed_.times)), key=seed_.times.__getitem__)
    target = seed_.times[c] * (1 - 1e-9)
    receivers = [b for b in seed_._open_bins() if b.parent != c]
    with pytest.MonkeyPatch.context() as m:
        m.setattr(node_membership, "EDIT_SCREEN_RECEIVERS", 1)
        terms = seed_._receiver_terms(receivers)
    assert terms.edits is not None
    ruled_out = 0
    for s in sorted(seed_.bins[c][0].samples, key=problem.heavy_rank.__getitem__)[:20]:
        sample = (problem.full_s[s], problem.tokens[s], problem.sparse_s[s], problem.work_s[s])
        plain, edit = terms.screen(problem.cost, target, sample)
        for i, dst in enumerate(receivers):
            if plain[i]:
                assert seed_._floor_with(dst, s) >= target
            elif edit[i]:
                before = seed_.work
                t = seed_._trial(dst, s, 1, partial(seed_._seconds, dst.parent))
                assert t >= target
                assert seed_.work - before == terms.edits.charge[i]
                ruled_out += 1
    assert ruled_out > 100
