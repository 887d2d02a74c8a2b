"""The work budget depends on the request alone; the wall clock only moves the safety net."""

from __future__ import annotations

import json
from itertools import islice

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
