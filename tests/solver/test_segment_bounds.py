"""The lower bounds that let ``children_of_segment`` skip child sizes that cannot win."""

from __future__ import annotations

import random

import pytest

from solver.cost_model import ceil_div, child_layer_seconds
from solver.layout import Child
from solver.node_packing import _SegmentBounds, children_of_segment, packed_children
from solver.problem import Problem
from solver.schema import PlanRequest


def segment_request(seed: int) -> tuple[PlanRequest, int]:
    """One 8-rank segment's samples, loose or packed to within a few tokens of its memory."""
    rng = random.Random(seed)
    cap = 8 * 32768
    fill = rng.choice([0.3, 0.7, 0.97, 0.9999])
    lengths: list[int] = []
    if rng.random() < 0.5:
        lengths.append(rng.randint(20_000, 32768 * 2))
    while sum(lengths) < fill * cap:
        lengths.append(min(int(rng.lognormvariate(7.5, 1.1)) + 16, 30_000))
    while sum(lengths) > fill * cap:
        lengths.pop()
    request = PlanRequest.model_validate({"cluster": {"nodes": 2}, "lengths": lengths})
    return request, rng.choice([0, 0, sum(lengths) // 16])


def exhaustive(
    problem: Problem, members: list[int], floor: int
) -> tuple[list[Child], float, int] | None:
    """``children_of_segment`` without pruning: every size packed and scored."""
    cost = problem.cost
    full_tok = cost.full_layers * (cost.linear_seconds_per_token + cost.a2a_seconds_per_token(16))
    order = sorted(members, key=problem.heavy_rank.__getitem__)
    best = None
    for k in problem.child_sizes:
        if k > 8:
            break
        packed = packed_children(problem, order, 8 // k, k, ordered=True)
        if packed is None:
            continue
        groups, tokens, sparse = packed
        z = max(child_layer_seconds(cost, k, sp, t) for sp, t in zip(sparse, tokens, strict=True))
        m = ceil_div(max(tokens), k)
        score = cost.sparse_layers * z + max(m, floor) * full_tok
        bound = _SegmentBounds(problem, order).score(k, 8, full_tok, floor)
        assert bound <= score * (1 + 1e-12), (k, bound, score)
        if best is None or score < best[0]:
            best = (score, [Child(i * k, k, tuple(g)) for i, g in enumerate(groups)], z, m)
    return None if best is None else (best[1], best[2], best[3])


@pytest.mark.parametrize("seed", range(30))
def test_bounds_never_exceed_a_packing_and_pruning_keeps_the_choice(seed: int) -> None:
    request, floor = segment_request(seed)
    members = list(range(len(request.lengths)))
    want = exhaustive(Problem.from_request(request), members, floor)
    got = children_of_segment(Problem.from_request(request), 0, 8, members, 16, floor)
    assert got == want
