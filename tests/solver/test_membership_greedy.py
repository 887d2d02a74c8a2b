"""The membership greedy (``membership.balance`` without local search) keeps its LPT contract on
packed steps: every sample, longest first, goes to the least loaded parent that still has room
(parents of one size, by their cost before the sample: the greedy's heap order)."""

from __future__ import annotations

import pytest

from solver.errors import InfeasibleRequestError
from solver.membership import _Balancer, _lpt_by_tokens, balance, heavy_order
from solver.problem import Problem
from tests.solver.test_reference import loader_request

PACKED = [(2, 8, 8, 0.0, 1), (2, 8, 8, 0.3, 5), (4, 8, 16, 0.0, 3), (2, 4, 4, (0.35, 0.35), 9)]


def lpt_violations(problem: Problem, sizes: list[int], members: list[list[int]]) -> list[int]:
    """Samples that the greedy put in a parent costlier than another with room for them."""
    where = {s: j for j, group in enumerate(members) for s in group}
    replay = _Balancer(problem, sizes, "baseline")
    wrong = []
    for s in heavy_order(problem):
        best = min(replay.cost(j) for j in range(len(sizes)) if replay.fits(j, s))
        if replay.cost(where[s]) > best * (1 + 1e-12):
            wrong.append(s)
        replay.place(where[s], s)
    return wrong


@pytest.mark.parametrize("case", PACKED)
@pytest.mark.parametrize("size", [1, 2, 8])
def test_the_greedy_puts_each_sample_in_the_least_costly_parent_with_room(
    case: tuple[int, int, int, float, int], size: int
) -> None:
    problem = Problem.from_request(loader_request(*case))
    sizes = [size] * (problem.cost.world_size // size)
    try:
        members = balance(problem, sizes, "baseline", evals=0, fill=False)
    except InfeasibleRequestError:
        pytest.skip("LPT itself runs out of packed memory here")
    assert sorted(s for group in members for s in group) == list(range(problem.num_samples))
    assert lpt_violations(problem, sizes, members) == []


class _Recomputing(_Balancer):
    """The local search as it was before costs were kept between rounds: every parent priced
    again every round."""

    def improve(self, budget: int, clock: object = None) -> None:
        while self.evals < budget:
            costs = [self.cost(j) for j in range(len(self.loads))]
            c = max(range(len(costs)), key=lambda j: (costs[j], -j))
            if self._improve_critical(c, costs, budget) is None:
                return


@pytest.mark.parametrize("case", PACKED)
@pytest.mark.parametrize(("size", "objective"), [(1, "baseline"), (2, "repack"), (8, "repack")])
def test_the_local_search_keeping_costs_between_rounds_is_the_full_recompute(
    case: tuple[int, int, int, float, int], size: int, objective: str
) -> None:
    """Same members and the same evaluations charged as pricing every parent each round."""
    problem = Problem.from_request(loader_request(*case))
    sizes = [size] * (problem.cost.world_size // size)
    runs = []
    for cls in (_Balancer, _Recomputing):
        bal = cls(problem, sizes, objective)  # type: ignore[arg-type]
        try:
            bal.greedy(heavy_order(problem))
        except InfeasibleRequestError:
            pytest.skip("LPT itself runs out of packed memory here")
        bal.improve(3_000)
        runs.append(([sorted(ld.members) for ld in bal.loads], bal.evals))
    assert runs[0] == runs[1]
    assert runs[0][1] > len(sizes)  # the search ran more than one round


@pytest.mark.parametrize("case", [*PACKED, (4, 8, 16, 0.6, 7), (8, 8, 32, 0.45, 2)])
@pytest.mark.parametrize("size", [1, 2, 8, 16])
def test_the_tokens_greedy_on_integer_keys_is_the_general_greedy(
    case: tuple[int, int, int, float, int], size: int
) -> None:
    """``balance(..., "tokens", evals=0)`` on one size takes ``_lpt_by_tokens``: the same
    members as ``_Balancer.greedy``, and no answer where that greedy runs out of memory."""
    problem = Problem.from_request(loader_request(*case))
    sizes = [size] * (problem.cost.world_size // size)
    fast = _lpt_by_tokens(problem, size, len(sizes))
    bal = _Balancer(problem, sizes, "tokens")
    try:
        bal.greedy(heavy_order(problem))
    except InfeasibleRequestError:
        assert fast is None
        return
    assert fast == [ld.members for ld in bal.loads]


def test_heavy_order_is_longest_first_index_breaking_ties() -> None:
    problem = Problem.from_request(loader_request(2, 8, 8, 0.3, 5))
    want = sorted(range(problem.num_samples), key=lambda s: (-problem.tokens[s], s))
    assert heavy_order(problem) == want
    assert len(set(problem.tokens)) < problem.num_samples  # ties are exercised
