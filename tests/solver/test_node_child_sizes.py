"""Child sizes re-chosen per node for the parent's time (``solver.node_child_sizes``)."""

from __future__ import annotations

import json
from pathlib import Path

from solver.layout import Child, Layout, Parent, evaluate, parent_time
from solver.node_child_sizes import resized
from solver.problem import Problem
from solver.schema import PlanRequest
from tests.solver.test_child_swaps import layout_of
from tests.solver.test_reference import loader_request

DATA = Path(__file__).resolve().parent / "data"


def node_members(problem: Problem, layout: Layout) -> list[list[int]]:
    """Per (parent, node): its samples, sorted."""
    g = problem.cost.gpus_per_node
    out: dict[tuple[int, int], list[int]] = {}
    for p in layout:
        for c in p.children:
            out.setdefault((p.start, c.start // g), []).extend(c.samples)
    return [sorted(v) for _, v in sorted(out.items())]


def test_a_node_that_does_not_set_the_busiest_rank_takes_the_narrower_children() -> None:
    """One 8-rank parent on two 4-GPU nodes at 99% of memory: one node held a child of 4 for
    its lower busiest rank while the other node's children of 2 set the parent's; children of
    2 on both nodes are faster, each sample on the node it was on, within memory."""
    req = PlanRequest.model_validate(
        json.loads((DATA / "hunt-2x4-child-sizes-per-node.json").read_text())
    )
    problem = Problem.from_request(req)
    first, second_a, second_b = _one_child_of_four(problem)
    parent = Parent(0, 8, (Child(0, 4, first), Child(4, 2, second_a), Child(6, 2, second_b)))
    layout = (parent,)
    out = resized(problem, layout)
    assert out is not layout
    (new,) = out
    assert parent_time(new, problem.cost, problem.costs) < parent_time(
        parent, problem.cost, problem.costs
    )
    assert {c.size for c in new.children if c.start < 4} == {2}
    assert node_members(problem, out) == node_members(problem, layout)
    for c in new.children:
        assert sum(problem.tokens[s] for s in c.samples) <= problem.capacity(c.size)


def _one_child_of_four(
    problem: Problem,
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """The hunted layout's shape: the first node's samples in one child of 4, the second's in
    two children of 2 (by the reference heuristic's node split)."""
    from tests.solver.reference_heuristic import Reference

    ref = Reference(problem, [8], repack=True)
    ref.place(range(problem.num_samples))
    ref.improve(same_parent=True)
    first = ref.bins[0][0].samples
    layout = ref.layout()
    assert layout is not None
    kids = layout[0].children
    halves = [c.samples for c in kids if c.start >= 4]
    assert len(halves) == 2, "the reference packs the second node into two children"
    return tuple(first), halves[0], halves[1]


def test_plans_already_at_their_best_sizes_come_back_unchanged() -> None:
    """Packed 16-rank parents after the planner: the same object back or a faster layout,
    never a slower one, and every sample stays on its node."""
    for case in [(4, 8, 16, 0.0, 3), (2, 8, 16, 0.3, 5), (4, 8, 8, 0.6, 1)]:
        request = loader_request(*case)
        problem = Problem.from_request(request)
        _, layout = layout_of(request, "repack+parent")
        out = resized(problem, layout)
        before = evaluate(layout, problem.cost, problem.costs).step_s
        assert evaluate(out, problem.cost, problem.costs).step_s <= before
        assert node_members(problem, out) == node_members(problem, layout)
        # a second pass finds nothing more: the descent ends where no node choice helps
        assert resized(problem, out) is out
