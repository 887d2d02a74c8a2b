"""The work budget depends on the request alone; the wall clock only moves the safety net."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from itertools import islice
from typing import Any

import pytest

from solver.budget import DEFAULT_DEADLINE_MS, MIN_WORK_SCALE, Budget, work_scale
from solver.plan_builder import canonical_json
from solver.planner import plan
from solver.schema import PlanRequest
from solver.trace import load_trace
from solver.validate import validate_plan
from tests.solver.default_profile_golden import scenario_path


def _layout(request: PlanRequest, **kwargs: float) -> dict[str, object]:
    data = json.loads(canonical_json(plan(request, **kwargs), drop_timing=True))
    data["metrics"].pop("stopped_by")
    return data


@pytest.fixture(scope="module")
def wide_step() -> PlanRequest:
    """A 64-GPU step with a parent wider than a node (CP-SAT polishes it)."""
    return next(islice(load_trace(scenario_path("gpu64-200steps.yaml")), 3, None))


@pytest.mark.parametrize(
    ("deadline_ms", "scale"),
    [(1, MIN_WORK_SCALE), (50, 0.05), (200, 0.2), (DEFAULT_DEADLINE_MS, 1.0), (60_000, 1.0)],
)
def test_work_scale(deadline_ms: int, scale: float) -> None:
    assert work_scale(deadline_ms) == pytest.approx(scale)


def test_budget_scales_deterministic_limits_only() -> None:
    b = Budget(1e6, scale=0.05)
    assert b.cpsat_seconds(0.02) == pytest.approx(0.001)
    assert (b.evals(2000), b.evals(3), b.evals(0)) == (100, 1, 0)
    assert Budget(1e6).evals(2000) == 2000
    assert not b.expired() and not b.fired
    gone = Budget(0.0)
    assert gone.expired() and gone.fired


def test_wall_clock_override_does_not_change_the_search(wide_step: PlanRequest) -> None:
    """What the caller passes as ``deadline_ms`` (the service: what queueing left) moves the
    safety net only; a request deadline above the default buys the default work."""
    # The default work budget, the safety net out of reach (a loaded machine could fire it
    # within the default 1 s, which would make this a test of the machine).
    default = _layout(wide_step, deadline_ms=600_000)
    assert _layout(wide_step, deadline_ms=60_000) == default
    longer = wide_step.model_copy(update={"deadline_ms": 60_000})
    assert _layout(longer, deadline_ms=600_000) == default


def test_short_request_deadline_is_a_smaller_deterministic_search(wide_step: PlanRequest) -> None:
    short = wide_step.model_copy(update={"deadline_ms": 50})
    first = plan(short, deadline_ms=60_000)
    assert first.metrics.stopped_by != "deadline"
    assert _layout(short, deadline_ms=60_000) == _layout(short, deadline_ms=30_000)


def test_a_fired_safety_net_is_reported(wide_step: PlanRequest) -> None:
    result = plan(wide_step, deadline_ms=1)
    assert result.metrics.stopped_by == "deadline"
    assert validate_plan(wide_step, result) == []


EXPENSIVE = (
    ("solver.child_packer", "ChildPacker", "solve"),
    ("solver.children", None, "membership_bounds"),
    ("solver.tilings", None, "fast_aggregate_bound"),
    ("solver.node_membership", "NodeSeed", "place"),
    ("solver.child_cpsat", "ChildModel", "solve"),
    ("solver.joint_model", "JointModel", "solve"),
)
"""Work that only chooses between candidates: once the safety net has fired, none of it can
change the answer (children stay unrepacked, no candidate is searched), so none of it runs."""


@pytest.fixture(scope="module")
def packed_step() -> PlanRequest:
    """A packed 64-GPU step with four 16-rank parents (every stage has work there)."""
    return next(islice(load_trace(scenario_path("gpu64-packed.yaml")), 69, None))


def _counted(
    original: Callable[..., Any], name: str, late: Callable[[], bool], log: list[str]
) -> Callable[..., Any]:
    def counted(*args: Any, **kwargs: Any) -> Any:
        if late():
            log.append(name)
        return original(*args, **kwargs)

    return counted


@pytest.mark.parametrize("checks", [1, 4, 12, 40])
@pytest.mark.parametrize("mode", ["sizing", "repack", "repack+parent", "repack+sizing"])
@pytest.mark.parametrize("step", ["wide_step", "packed_step"])
def test_no_search_runs_once_the_safety_net_has_fired(
    step: str, mode: str, checks: int, request: pytest.FixtureRequest
) -> None:
    """The safety net fires at the ``checks``-th look at the clock (the clock itself is out of
    reach, so where it fires is repeatable); from then on the solve only assembles what it has.
    At 2,048 GPUs a solve whose safety net fired went on for ~0.9 s: child bounds and greedy
    packs of a membership whose children were then left unrepacked, tiling floors, the
    node-level placement, and a re-evaluation by a polish that did nothing."""
    looks: list[int] = []
    late: list[str] = []

    def expired(self: Budget) -> bool:
        looks.append(1)
        if len(looks) >= checks:
            self.fired = True
        return self.fired

    with pytest.MonkeyPatch.context() as m:
        m.setattr(Budget, "expired", expired)
        for module, owner, name in EXPENSIVE:
            target = importlib.import_module(module)
            holder = getattr(target, owner) if owner else target
            spy = _counted(getattr(holder, name), name, lambda: len(looks) >= checks, late)
            m.setattr(holder, name, spy)
        req = request.getfixturevalue(step).model_copy(update={"mode": mode})
        result = plan(req, deadline_ms=600_000)
    assert validate_plan(req, result) == []
    if len(looks) >= checks:
        assert result.metrics.stopped_by == "deadline"
    assert late == []


def test_a_net_firing_in_the_child_search_keeps_the_node_level_layout(
    packed_step: PlanRequest,
) -> None:
    """``repack+parent`` builds the node-level membership before any child search, so a safety
    net that fires in the children of the upstream membership (which it then leaves
    unrepacked) returns the node-level layout, not the upstream one (1,024-GPU bench steps on a
    slow machine: -21.6% -> -22.4% vs baseline at the default deadline)."""
    from solver import planner
    from solver.problem import Problem

    request = packed_step.model_copy(update={"mode": "repack+parent"})
    problem = Problem.from_request(request)
    sizes = list(request.parent_sizes or [])
    seeded = planner._node_seeded(problem, sizes, Budget(600_000))
    assert seeded is not None
    solve = planner.solve_children

    searches: list[int] = []

    def fire_first(*args: Any, **kwargs: Any) -> Any:
        searches.append(1)
        args[3].fired = True  # the budget: out of time from the first child search on
        return solve(*args, **kwargs)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(planner, "solve_children", fire_first)
        # Without the node-level memory floor (``planner._Floor``), which on this step shows
        # the node-level layout beats every layout of the upstream membership and so skips
        # its child search: the search runs, and the net fires in it.
        m.setattr(planner, "fixed_membership_bound", lambda *_: 0.0)
        result = plan(request, deadline_ms=600_000)
    assert searches
    assert result.metrics.stopped_by == "deadline"
    assert validate_plan(request, result) == []
    assert result.metrics.step_time_ms <= seeded.evaluation.step_s * 1e3 * (1 + 1e-9)
    base = plan(request.model_copy(update={"mode": "baseline"}), deadline_ms=600_000)
    assert result.metrics.step_time_ms < base.metrics.step_time_ms * 0.9


def test_a_huge_packed_request_keeps_repack_parent_when_the_net_fires_in_sizing(
    packed_step: PlanRequest,
) -> None:
    """Where the LNS does not run (huge requests, here forced) on a memory-tight step,
    ``repack+sizing`` solves ``repack+parent`` before its sized stages, so a safety net that
    fires in them still leaves that layout: the mode stays never slower than ``repack+parent``
    (packed 1,024-GPU steps at the default deadline: 2 of 4 ended 0.01-0.2% slower when it
    came last)."""
    from solver import membership_lns, planner

    sized = planner._sized

    def fire_after(*args: Any, **kwargs: Any) -> Any:
        found = sized(*args, **kwargs)
        args[4].fired = True  # the budget: out of time from the first sizing search on
        return found

    with pytest.MonkeyPatch.context() as m:
        m.setattr(planner, "searches", lambda *_: False)
        m.setattr(membership_lns, "searches", lambda *_: False)
        parent = plan(packed_step.model_copy(update={"mode": "repack+parent"}), 600_000)
        m.setattr(planner, "_sized", fire_after)
        request = packed_step.model_copy(update={"mode": "repack+sizing"})
        result = plan(request, deadline_ms=600_000)
    assert result.metrics.stopped_by == "deadline"
    assert validate_plan(request, result) == []
    assert result.metrics.step_time_ms <= parent.metrics.step_time_ms * (1 + 1e-9)
