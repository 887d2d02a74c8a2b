"""CP-SAT's child model and an independent PuLP/CBC MILP agree on the optimum."""

from __future__ import annotations

import math
import random

import pytest

from solver.child_cpsat import ChildModel
from solver.layout import parent_time
from solver.problem import Problem
from solver.schema import PlanRequest
from tests.solver.milp_reference import milp_child_objective, partitions

INSTANCES = 24
REL_ROUNDING = 1e-5


TILINGS = {2: [2, 2, 4], 4: [4, 2, 2], 8: [8], 16: [16]}
"""Heterogeneous parent sizes; the parent under test is the first (ranks from 0)."""
SIZE_OF_SEED = (8, 2, 4, 16, 8, 4)
SAMPLES = {2: (2, 4), 4: (3, 5), 8: (3, 6), 16: (3, 4)}  # CBC needs minutes beyond these


def instance(seed: int) -> tuple[Problem, int, list[int]]:
    rng = random.Random(seed)
    size = SIZE_OF_SEED[seed % len(SIZE_OF_SEED)]
    n = rng.randint(*SAMPLES[size])
    lengths = [max(1, int(rng.lognormvariate(9.5, 1.0))) for _ in range(n)]
    room = 0.8 * size * 32768  # stay inside the parent's memory
    lengths = [max(1, int(x * min(1.0, room / sum(lengths)))) for x in lengths]
    nodes = max(1, size // 8)
    req = PlanRequest(
        cluster={"nodes": nodes}, lengths=lengths, parent_sizes=TILINGS[size], parent_of=[0] * n
    )
    return Problem.from_request(req), size, list(range(n))


def test_partitions_of_a_node() -> None:
    full = [p for p in partitions(8, [1, 2, 4, 8]) if sum(p) == 8]
    assert len(full) == 10  # 8, 4+4, 4+2+2, 4+2+1+1, 4+1*4, 2*4, 2*3+1*2, 2*2+1*4, 2+1*6, 1*8


@pytest.mark.parametrize("seed", range(INSTANCES))
def test_cpsat_and_milp_agree(seed: int) -> None:
    problem, size, members = instance(seed)
    model = ChildModel(problem, 0, size, members, incumbent_s=math.inf)
    result = model.solve(deadline_s=120, work_limit_s=60)
    assert result.optimal and result.objective_s is not None and result.parent is not None
    reference = milp_child_objective(problem, size, members)
    # CP-SAT rounds coefficients down to whole nanoseconds (the busiest-rank coefficient loses
    # < 1 ns per token), so it may sit a hair below CBC, never above.
    slack = REL_ROUNDING * reference
    assert reference - slack <= result.objective_s <= reference + 1e-9 * reference
    # the layout it returns really costs what the model says, up to ceil(T/k) rounding
    real = parent_time(result.parent, problem.cost, problem.costs)
    assert result.objective_s - slack <= real <= reference * (1 + 1e-3)
