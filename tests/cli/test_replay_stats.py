"""The replay's aggregation (a pure function) on hand-made results."""

from __future__ import annotations

import pytest

from cli.replay_stats import StepResult, summarize, wide_steps


def _result(
    step: int,
    mode: str,
    time: float,
    *,
    wide: bool = False,
    gap: float = 0.0,
    solve: float = 1.0,
    base: float = 100.0,
    mfu: float = 0.5,
) -> StepResult:
    return StepResult(
        step=step,
        mode=mode,
        wide=wide,
        step_time_ms=time,
        baseline_step_time_ms=base,
        mfu=mfu,
        gap=gap,
        solve_ms=solve,
    )


RESULTS = [
    # step 0's baseline has a wide parent; step 1's only in mode repack (which then chose one):
    # the baseline decides, so only step 0 is a wide-parent step
    _result(0, "baseline", 200.0, base=200.0, wide=True, gap=0.2, solve=10.0, mfu=0.3),
    _result(0, "repack", 150.0, base=200.0, wide=True, gap=0.1, solve=30.0, mfu=0.4),
    _result(1, "baseline", 100.0, gap=0.0, solve=2.0, mfu=0.5),
    _result(1, "repack", 90.0, wide=True, gap=0.05, solve=4.0, mfu=0.6),
    _result(2, "baseline", 100.0, gap=0.0, solve=3.0, mfu=0.5),
    _result(2, "repack", 100.0, gap=0.0, solve=5.0, mfu=0.5),
]


def test_wide_steps_are_decided_by_the_baseline() -> None:
    assert wide_steps(RESULTS) == {0}
    assert wide_steps([r for r in RESULTS if r.mode != "baseline"]) == set()


def test_summary_all_steps() -> None:
    rows = {r.mode: r for r in summarize(RESULTS, ["baseline", "repack"])["all"]}
    base, repack = rows["baseline"], rows["repack"]
    assert base.steps == repack.steps == 3
    assert base.step_time_ms == pytest.approx(400 / 3)
    assert base.change_pct == pytest.approx(0.0)
    assert repack.step_time_ms == pytest.approx(340 / 3)
    assert repack.change_pct == pytest.approx((340 / 400 - 1) * 100)  # ratio of means
    assert repack.mfu == pytest.approx(0.5)
    assert repack.median_gap == pytest.approx(0.05)
    assert repack.p99_solve_ms == pytest.approx(5.0 + 0.98 * 25.0)  # linear interpolation


def test_summary_wide_group_and_mode_order() -> None:
    table = summarize(RESULTS, ["repack", "baseline"])
    assert [r.mode for r in table["wide"]] == ["repack", "baseline"]
    repack = table["wide"][0]
    assert repack.steps == 1
    assert repack.change_pct == pytest.approx(-25.0)
    assert repack.median_gap == pytest.approx(0.1)
    assert repack.p99_solve_ms == pytest.approx(30.0)


def test_empty_group_and_missing_mode_give_none() -> None:
    narrow = [r for r in RESULTS if r.step != 0]
    table = summarize(narrow, ["baseline", "repack+parent"])
    for row in table["wide"]:
        assert row.steps == 0 and row.step_time_ms is None and row.change_pct is None
    missing = table["all"][1]
    assert missing.mode == "repack+parent" and missing.steps == 0 and missing.mfu is None


def test_missing_gap_and_solve_time_are_skipped() -> None:
    rows = [
        _result(0, "repack", 90.0, gap=0.3, solve=7.0),
        StepResult(
            step=1,
            mode="repack",
            wide=False,
            step_time_ms=80.0,
            baseline_step_time_ms=100.0,
            mfu=0.5,
            gap=None,
            solve_ms=None,
        ),
    ]
    (row,) = summarize(rows, ["repack"])["all"]
    assert row.median_gap == pytest.approx(0.3)
    assert row.p99_solve_ms == pytest.approx(7.0)
    assert row.change_pct == pytest.approx(-15.0)
