"""Aggregation of a replay: per mode and step group, the paper-style summary (pure functions)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from solver.schema import Plan

GROUPS = ("wide", "all")
"""Step groups of the table: steps with a parent wider than a node, and every step."""

CLASSIFYING_MODE = "baseline"
"""The mode whose plan decides whether a step is a wide-parent step: the upstream layout, the
same whichever modes a replay runs (modes that size parents may choose others)."""

SOLVE_PERCENTILE = 99


@dataclass(frozen=True, kw_only=True)
class StepResult:
    """What a replay keeps of one (step, mode) plan."""

    step: int
    mode: str
    wide: bool
    """The plan has a parent wider than a node."""
    step_time_ms: float
    baseline_step_time_ms: float
    mfu: float
    gap: float | None
    solve_ms: float | None

    @classmethod
    def from_plan(cls, step: int, plan: Plan, gpus_per_node: int) -> StepResult:
        m = plan.metrics
        return cls(
            step=step,
            mode=plan.mode,
            wide=any(p.ranks[1] - p.ranks[0] > gpus_per_node for p in plan.parents),
            step_time_ms=m.step_time_ms,
            baseline_step_time_ms=m.baseline_step_time_ms,
            mfu=m.mfu,
            gap=m.gap,
            solve_ms=m.solve_ms,
        )


@dataclass(frozen=True, kw_only=True)
class ModeSummary:
    """One row of the table; the statistics are None over an empty group."""

    mode: str
    steps: int
    step_time_ms: float | None
    """Mean predicted step time."""
    change_pct: float | None
    """Mean step time over the mean baseline step time of the same steps, minus 1, in %."""
    mfu: float | None
    """Mean predicted MFU."""
    median_gap: float | None
    p99_solve_ms: float | None


def wide_steps(results: Iterable[StepResult]) -> set[int]:
    """Steps whose baseline plan has a parent wider than a node (none without baseline rows)."""
    return {r.step for r in results if r.mode == CLASSIFYING_MODE and r.wide}


def _mean(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if values else None


def _summarize_mode(mode: str, rows: Sequence[StepResult]) -> ModeSummary:
    gaps = [r.gap for r in rows if r.gap is not None]
    solve = [r.solve_ms for r in rows if r.solve_ms is not None]
    time, base = (
        _mean([r.step_time_ms for r in rows]),
        _mean([r.baseline_step_time_ms for r in rows]),
    )
    return ModeSummary(
        mode=mode,
        steps=len(rows),
        step_time_ms=time,
        change_pct=None if time is None or not base else (time / base - 1) * 100,
        mfu=_mean([r.mfu for r in rows]),
        median_gap=float(np.median(gaps)) if gaps else None,
        p99_solve_ms=float(np.percentile(solve, SOLVE_PERCENTILE)) if solve else None,
    )


def summarize(results: Sequence[StepResult], modes: Sequence[str]) -> dict[str, list[ModeSummary]]:
    """Per group (``wide``, ``all``) one summary per mode, in the order of ``modes``.

    The change vs baseline uses each plan's own ``baseline_step_time_ms`` (every mode reports
    the same upstream baseline), so it is defined even when mode ``baseline`` was not run.
    """
    wide = wide_steps(results)
    out: dict[str, list[ModeSummary]] = {}
    for group in GROUPS:
        rows = [r for r in results if group == "all" or r.step in wide]
        out[group] = [_summarize_mode(m, [r for r in rows if r.mode == m]) for m in modes]
    return out
