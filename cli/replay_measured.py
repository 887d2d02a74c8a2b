"""``repack replay --measurements FILE``: fit the profile the measurements imply, replay with it.

The file holds one measured step per line (``MeasuredStep`` JSON, what the runtime client posts
and ``runtime_client.measurements.write_jsonl`` writes). Each measurement is matched to the
trace's step with the same ``step`` (or index), that step is planned as it ran (``--measured-mode``)
with the starting profile, and the constants that best explain the measured times are fitted
(the service's refit, without the per-refit bound). The trace is then re-scored with them.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from cli.errors import InputError, reading
from cli.options import MODES
from solver.calibration_fit import CalibrationFitError
from solver.io import parse_document
from solver.measurement_schema import MeasuredStep
from solver.planner import plan
from solver.profile_feedback import (
    FeedbackConfig,
    Observation,
    Refit,
    constants_of,
    refit,
    with_constants,
)
from solver.schema import PlanRequest

UNBOUNDED = 1e6
"""Offline there is no running job to protect: one refit may move a constant any distance."""


def add_measurements(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--measurements",
        default=None,
        metavar="FILE",
        help="measured steps (JSON lines): fit the profile they imply and replay with it",
    )
    parser.add_argument(
        "--measured-mode",
        choices=MODES,
        default=None,
        metavar="M",
        help="mode the measured steps ran in (default: each request's own)",
    )


def read_measurements(path: str | Path) -> list[MeasuredStep]:
    """Every line of ``path`` as a ``MeasuredStep``; errors name the file and line."""
    out = []
    with reading(path):
        for n, line in enumerate(Path(path).read_bytes().splitlines(), 1):
            if not line.strip():
                continue
            try:
                out.append(MeasuredStep.model_validate(parse_document(line)))
            except (ValueError, TypeError) as exc:
                exc.add_note(f"in {path}, line {n}")
                raise
    if not out:
        raise InputError(f"{path}: no measured steps")
    return out


def observations(
    requests: Sequence[PlanRequest],
    measured: Sequence[MeasuredStep],
    mode: str | None,
    deadline_ms: int | None,
) -> list[Observation]:
    by_step = {(r.step if r.step is not None else i): r for i, r in enumerate(requests)}
    out = []
    for m in measured:
        request = by_step.get(m.step)
        if request is None:
            raise InputError(f"measured step {m.step} is not in the trace")
        if mode is not None:
            request = request.model_copy(update={"mode": mode})
        a2a = None if m.all_to_all_ms is None else m.all_to_all_ms / 1e3
        out.append(Observation(request, plan(request, deadline_ms), m.step_time_ms / 1e3, a2a))
    return out


def measured_profile(
    requests: Sequence[PlanRequest],
    path: str,
    mode: str | None,
    deadline_ms: int | None,
) -> tuple[list[PlanRequest], Refit]:
    """The trace's requests re-priced with the profile the measurements imply, and the fit."""
    obs = observations(requests, read_measurements(path), mode, deadline_ms)
    config = FeedbackConfig(min_steps=2, max_change=UNBOUNDED, window=max(2, len(obs)))
    try:
        fit = refit(obs, constants_of(requests[0]), config)
    except CalibrationFitError as exc:
        raise InputError(f"{path}: the measurements cannot be fitted: {exc}") from None
    return [with_constants(r, fit.constants) for r in requests], fit


def describe_fit(fit: Refit) -> str:
    constants = ", ".join(f"{k} {v:.4g}" for k, v in sorted(fit.constants.items()))
    return (
        f"measured profile from {fit.steps} steps: {constants}; median |error| of the "
        f"prediction {fit.median_abs_error_before:.1%} -> {fit.median_abs_error_after:.1%}"
    )
