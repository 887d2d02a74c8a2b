"""The parent packer's bisection (``solver.parent_packer``)."""

from __future__ import annotations

import pytest

from solver.bounds import membership_free_bound
from solver.layout import baseline_layout, evaluate
from solver.membership import members_from_parent_of
from solver.parent_packer import BISECTION_STEPS, ParentPacker
from solver.problem import Problem
from solver.schema import PlanRequest, allowed_parent_sizes
from tests.solver.test_reference import loader_request


def _packer_and_range(request: PlanRequest, objective: str) -> tuple[ParentPacker, float, float]:
    problem = Problem.from_request(request)
    allowed = allowed_parent_sizes(request.cluster, request.model, uniform=False)
    assert request.parent_sizes is not None and request.parent_of is not None
    sizes = list(request.parent_sizes)
    members = members_from_parent_of(request.parent_of, len(sizes))
    high = evaluate(baseline_layout(sizes, members), problem.cost, problem.costs).step_s
    low = membership_free_bound(problem, allowed, repack=objective == "repack")
    return ParentPacker(problem, allowed, objective), low, high  # type: ignore[arg-type]


def _counting(packer: ParentPacker, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    targets: list[float] = []
    pack = packer.pack

    def counted(target: float):  # type: ignore[no-untyped-def]
        targets.append(target)
        return pack(target)

    monkeypatch.setattr(packer, "pack", counted)
    return targets


@pytest.mark.parametrize("objective", ["baseline", "repack"])
def test_a_packed_step_gives_up_once_the_loosest_target_does_not_pack(
    objective: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At a loader's fill no target packs: the first failure is followed by the loosest
    target only, not by the rest of the bisection."""
    packer, low, high = _packer_and_range(loader_request(4, 8, 8, 0.3, 2), objective)
    targets = _counting(packer, monkeypatch)
    assert packer.solve(low, high) is None
    assert targets == [(low + high) / 2, high]


def test_a_step_with_room_bisects_in_full_and_keeps_the_tightest_packing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    request = loader_request(4, 8, 8, 0.3, 2)
    # the same samples with half of them gone: memory to spare
    lengths = request.lengths[::2]
    roomy = PlanRequest.model_validate(
        {
            "cluster": request.cluster.model_dump(),
            "lengths": lengths,
            "parent_sizes": [8] * 4,
            "parent_of": [i % 4 for i in range(len(lengths))],
        }
    )
    packer, low, high = _packer_and_range(roomy, "baseline")
    targets = _counting(packer, monkeypatch)
    found = packer.solve(low, high)
    assert found is not None
    assert len(targets) >= BISECTION_STEPS  # every bisection step packed (the top at most once)
    assert found.estimate_s <= high
