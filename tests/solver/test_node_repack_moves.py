"""Node re-packing moves (``solver.node_repack_moves``): a sample of the critical parent's
slowest child moves to another of its nodes, packed again, where no child swap takes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import solver.planner as planner
from solver.budget import Budget
from solver.child_swaps import swap_children
from solver.layout import Layout, evaluate
from solver.node_repack_moves import repack_moves
from solver.problem import Problem
from solver.schema import PlanRequest
from tests.solver.test_child_swaps import layout_of

DATA = Path(__file__).parent / "data"


def test_a_node_packed_again_takes_what_no_swap_could(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hunted 32-GPU step (two 16-rank parents at 94%): the critical parent's child of 8
    keeps a 5,585-token sample beside the longest one, the children of 2 on its other node
    each ~2,300 tokens short of memory for it. Without the moves, swaps alone stop there."""
    request = PlanRequest.model_validate(
        json.loads((DATA / "hunt-4x8-two-parents-16-3010.json").read_text())
    )
    problem = Problem.from_request(request)
    monkeypatch.setattr(planner, "repack_moves", lambda problem, layout, budget, pool: layout)
    _, layout = layout_of(request, "repack")
    swapped = swap_children(problem, layout, Budget(60_000), within=True)
    before = evaluate(swapped, problem.cost, problem.costs).step_s
    moved: Layout = repack_moves(problem, swapped, Budget(60_000))
    after = evaluate(moved, problem.cost, problem.costs).step_s
    assert after < before * (1 - 1e-4)
    g = problem.cost.gpus_per_node
    for old, new in zip(swapped, moved, strict=True):
        assert (old.start, old.size) == (new.start, new.size)
        assert sorted(old.samples) == sorted(new.samples)  # membership kept
        assert sum(c.size for c in new.children) == new.size
        for child in new.children:
            assert child.start // g == (child.start + child.size - 1) // g  # node-local
            assert sum(problem.tokens[s] for s in child.samples) <= problem.capacity(child.size)


def test_no_move_leaves_the_layout_as_it_was() -> None:
    """An unrepacked layout (one child per parent) has no node to re-pack: same object."""
    request = PlanRequest.model_validate(
        json.loads((DATA / "hunt-4x8-two-parents-16-3010.json").read_text())
    )
    problem = Problem.from_request(request)
    _, layout = layout_of(request, "baseline")
    assert repack_moves(problem, layout, Budget(60_000)) is layout


def test_a_node_of_many_samples_is_charged_by_its_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """A re-pack costs about its node's sample count (an LPT). Charged one try each, 24 GPUs
    of three 8-rank parents with 1,284 samples (~430 a node; the 2026-12-07 evening fuzz)
    re-packed ~170,000 samples, 2.2 s of `repack+sizing`'s CPU; charged by size, the moves'
    re-packs stay within ``REPACK_TRIES`` nodes of ``REPACK_SAMPLES`` samples (plus the one
    that crosses the limit)."""
    import solver.node_repack_moves as moves

    request = PlanRequest.model_validate(
        json.loads((DATA / "fuzz-3x8-packed-1284.json").read_text())
    )
    problem = Problem.from_request(request)
    _, layout = layout_of(request, "repack+sizing")  # parents wider than a node
    packed: list[int] = []
    real = moves.children_of_segment

    def counted(problem: Problem, start: int, ranks: int, members: list[int], *rest: int) -> object:
        packed.append(len(members))
        return real(problem, start, ranks, members, *rest)

    monkeypatch.setattr(moves, "children_of_segment", counted)
    repack_moves(problem, layout, Budget(600_000))
    assert packed, "the critical parent's nodes were not re-packed"
    assert max(packed) > moves.REPACK_SAMPLES  # the case charged more than one try
    budget = moves.REPACK_TRIES * moves.REPACK_SAMPLES
    # a try may pack the home node without the sample too (``_busiest_move``): twice at most
    assert sum(packed) <= 2 * (budget + max(packed))
