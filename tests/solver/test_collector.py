"""The garbage collector held back during a solve (``solver.collector``)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from solver import planner
from solver.collector import SOLVE_THRESHOLD, collector_held_back
from solver.schema import Plan
from tests.solver.test_reference import loader_request


@pytest.fixture(autouse=True)
def default_threshold() -> Iterator[None]:
    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*saved)


def test_the_threshold_is_raised_inside_and_restored_after_nested_holds() -> None:
    with collector_held_back():
        assert gc.get_threshold() == (SOLVE_THRESHOLD, 10, 10)
        with collector_held_back():
            assert gc.get_threshold()[0] == SOLVE_THRESHOLD
        assert gc.get_threshold()[0] == SOLVE_THRESHOLD  # the outer hold is still on
    assert gc.get_threshold() == (700, 10, 10)


def test_a_failing_solve_restores_it_and_a_higher_or_switched_off_setting_is_kept() -> None:
    with pytest.raises(RuntimeError), collector_held_back():
        raise RuntimeError("solve failed")
    assert gc.get_threshold() == (700, 10, 10)
    gc.set_threshold(0, 10, 10)  # the caller switched collection off
    with collector_held_back():
        assert gc.get_threshold()[0] == 0
    gc.set_threshold(10 * SOLVE_THRESHOLD, 10, 10)
    with collector_held_back():
        assert gc.get_threshold()[0] == 10 * SOLVE_THRESHOLD
    assert gc.get_threshold()[0] == 10 * SOLVE_THRESHOLD


def test_concurrent_solves_share_one_hold() -> None:
    """Two threads' holds overlap: the setting is restored only when the last one leaves."""
    inside, release = threading.Event(), threading.Event()

    def hold() -> None:
        with collector_held_back():
            inside.set()
            release.wait(10)

    other = threading.Thread(target=hold)
    other.start()
    assert inside.wait(10)
    with collector_held_back():
        pass
    assert gc.get_threshold()[0] == SOLVE_THRESHOLD  # the other thread still holds it
    release.set()
    other.join(10)
    assert gc.get_threshold() == (700, 10, 10)


def test_plan_holds_it_during_the_solve_only(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    solve = planner._plan

    def watched(*args: object) -> Plan:
        seen.append(gc.get_threshold()[0])
        return solve(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(planner, "_plan", watched)
    result = planner.plan(loader_request(4, 8, 16, 0.0, 3))
    assert result.metrics.step_time_ms > 0
    assert seen == [SOLVE_THRESHOLD]
    assert gc.get_threshold() == (700, 10, 10)
