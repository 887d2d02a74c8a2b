"""Correct a profile's constants from measured step times (the closed loop of calibration).

Each measured step comes with the request and plan it ran. Under a candidate profile the plan's
predicted time splits into compute, intra-node and inter-node seconds (``solver.step_terms``);
a robust regression of the measured times on those terms gives one multiplier per term, i.e. a
new compute efficiency and new bandwidths. Which link prices a group, and which parent is the
slowest, depend on the constants, so the fit repeats under the corrected profile until it
settles. The change applied at one refit is bounded (``FeedbackConfig.max_change``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from solver.calibration_fit import CalibrationFitError, MultiplierFit, bounded, robust_multipliers
from solver.cost_model import CostModel
from solver.profiles import BANDWIDTH_GBPS_RANGE, EFFICIENCY_RANGE, Profile
from solver.schema import Plan, PlanRequest
from solver.step_terms import TERMS, step_terms

FIXED_POINT_ROUNDS = 6

CONSTANTS_OF_TERM = {
    "compute": ("efficiency_full_attention", "efficiency_sparse_attention", "efficiency_linear"),
    "intra": ("intra_node_gbps",),
    "inter": ("inter_node_gbps",),
}
"""The profile constants each term's multiplier divides (time = work / rate). One compute
multiplier scales all three efficiencies: step times cannot tell the parts apart reliably. The
per-collective latency stays as calibrated (``repack calibrate`` measures it directly)."""
FITTED = tuple(name for names in CONSTANTS_OF_TERM.values() for name in names)


@dataclass(frozen=True, kw_only=True)
class FeedbackConfig:
    """When and how far a job's profile may move."""

    min_steps: int = 8
    """Measured steps needed before the first refit."""
    refit_every: int = 4
    """New measured steps between refits."""
    max_change: float = 1.5
    """Largest factor one refit may move any constant by."""
    window: int = 200
    """Latest measured steps a refit uses."""

    def __post_init__(self) -> None:
        if self.min_steps < 2:
            raise ValueError(f"Expected min_steps >= 2, got {self.min_steps}.")
        if self.refit_every < 1:
            raise ValueError(f"Expected refit_every >= 1, got {self.refit_every}.")
        if not self.max_change > 1.0:
            raise ValueError(f"Expected max_change > 1, got {self.max_change}.")
        if self.window < self.min_steps:
            raise ValueError(f"Expected window >= min_steps, got {self.window}.")


@dataclass(frozen=True)
class Observation:
    """One measured step: what was planned and how long it really took."""

    request: PlanRequest
    plan: Plan
    measured_s: float
    all_to_all_s: float | None = None
    """Time the step spent in all-to-alls, when the runtime reported it: it separates the
    communication terms from compute, which across steps of one job often grow together."""


@dataclass(frozen=True, kw_only=True)
class Refit:
    """Constants after one refit and how well they explain the measurements."""

    constants: dict[str, float]
    multipliers: dict[str, float]
    """New constant / old constant's rate factor per term (after bounding)."""
    median_abs_error_before: float
    median_abs_error_after: float
    steps: int
    outliers: int
    notes: list[str] = field(default_factory=list)


def constants_of(request: PlanRequest) -> dict[str, float]:
    """The constants a refit moves, from the profile the request is planned with."""
    profile = request.cost_profile
    return {name: float(getattr(profile, name)) for name in FITTED}


def with_constants(request: PlanRequest, constants: dict[str, Any]) -> PlanRequest:
    """The request planned with its profile's constants replaced by ``constants`` (any
    ``Profile`` fields; the name and everything else are kept)."""
    profile = Profile.model_validate({**request.cost_profile.model_dump(), **constants})
    return request.model_copy(update={"profile": profile})  # the name (if any) is kept


def _fit_under(obs: Sequence[Observation], constants: dict[str, float]) -> MultiplierFit:
    rows: list[dict[str, float]] = []
    measured: list[float] = []
    for o in obs:
        priced = with_constants(o.request, constants)
        terms = step_terms(priced, o.plan, CostModel.from_request(priced))
        rows.append(terms.as_dict())
        measured.append(o.measured_s)
        if o.all_to_all_s is not None and o.all_to_all_s > 0 and terms.intra + terms.inter > 0:
            comm = {"compute": 0.0, "intra": terms.intra, "inter": terms.inter}
            rows.append({**comm, "latency": terms.latency})
            measured.append(o.all_to_all_s)
    absent = [t for t in TERMS if all(r[t] == 0.0 for r in rows)]
    return robust_multipliers(rows, measured, fixed=[*absent, "latency"])


def refit(
    observations: Sequence[Observation],
    constants: dict[str, float],
    config: FeedbackConfig | None = None,
) -> Refit:
    """One bounded refit of ``constants`` from ``observations`` (the latest ``window``)."""
    config = config or FeedbackConfig()
    obs = list(observations)[-config.window :]
    if len(obs) < config.min_steps:
        raise CalibrationFitError(f"Expected >= {config.min_steps} measured steps, got {len(obs)}.")
    estimate = dict(constants)
    first: MultiplierFit | None = None
    for _ in range(FIXED_POINT_ROUNDS):
        fit = _fit_under(obs, estimate)
        first = first or fit
        for term, names in CONSTANTS_OF_TERM.items():
            m = fit.multipliers.get(term, 1.0)
            if m <= 0:
                raise CalibrationFitError(f"the {term} term got a non-positive multiplier {m:.3g}")
            for name in names:
                estimate[name] = _in_range(name, estimate[name] / m)
        if all(abs(m - 1.0) < 1e-4 for m in fit.multipliers.values()):
            break
    assert first is not None
    factors = {
        term: bounded(estimate[names[0]] / constants[names[0]], config.max_change)
        for term, names in CONSTANTS_OF_TERM.items()
    }
    new = {
        name: _in_range(name, constants[name] * factors[term])
        for term, names in CONSTANTS_OF_TERM.items()
        for name in names
    }
    notes = []
    if any(new[n] >= EFFICIENCY_RANGE[1] for n in CONSTANTS_OF_TERM["compute"]):
        notes.append("an efficiency reached 1.0: raise peak_tflops in the profile")
    after = _fit_under(obs, new)
    return Refit(
        constants=new,
        multipliers=factors,
        median_abs_error_before=_median_abs(first.rel_errors_before[: len(obs)]),
        median_abs_error_after=_median_abs(after.rel_errors_before[: len(obs)]),
        steps=len(obs),
        outliers=first.outliers,
        notes=notes,
    )


def _in_range(name: str, value: float) -> float:
    """Clip a constant into the profile's valid range (an efficiency above 1 means the stated
    peak is too low; the refit reports it instead of writing an invalid profile)."""
    low, high = EFFICIENCY_RANGE if name.startswith("efficiency") else BANDWIDTH_GBPS_RANGE
    return min(max(value, low * 1.000001), high)


def _median_abs(values: Sequence[float]) -> float:
    s = sorted(abs(v) for v in values)
    if not s:
        return math.nan
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def refit_due(measured_steps: int, last_refit_steps: int, config: FeedbackConfig) -> bool:
    """Whether a job with ``measured_steps`` measurements should refit now."""
    if measured_steps < config.min_steps:
        return False
    return last_refit_steps == 0 or measured_steps - last_refit_steps >= config.refit_every
