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
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from solver.calibration_fit import CalibrationFitError, MultiplierFit, bounded, robust_multipliers
from solver.cost_model import CostModel
from solver.profiles import BANDWIDTH_GBPS_RANGE, EFFICIENCY_RANGE, LATENCY_US_RANGE, Profile
from solver.schema import Plan, PlanRequest
from solver.step_terms import TERMS, step_terms

FIXED_POINT_ROUNDS = 6

CONSTANTS_OF_TERM = {
    "compute": ("efficiency_full_attention", "efficiency_sparse_attention", "efficiency_linear"),
    "intra": ("intra_node_gbps",),
    "inter": ("inter_node_gbps",),
    "overhead": ("layer_overhead_us",),
    "latency": ("collective_latency_us",),
    "peer_latency": ("collective_latency_us_per_peer",),
}
"""The profile constants each term's multiplier divides (time = work / rate) or, for the
fixed-time constants in ``TIME_CONSTANTS``, multiplies. One compute multiplier scales all three
efficiencies: step times cannot tell the parts apart reliably. Which terms a refit moves is
``FeedbackConfig.terms``: by default not the per-collective latency (``repack calibrate``
measures it), but whole-step calibration fits it (a collective inside a step costs several
times what back-to-back calls measure) and keeps the bandwidths its microbenchmarks measured.
The per-layer overhead is refitted only when the profile has one (a term absent from every
step keeps its value)."""
TIME_CONSTANTS = frozenset(
    {"layer_overhead_us", "collective_latency_us", "collective_latency_us_per_peer"}
)
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
    use_all_to_all: bool = True
    """Also regress the reported all-to-all times on the communication terms (they separate
    communication from compute; on an oversubscribed host they are mostly waits)."""
    terms: tuple[str, ...] = ("compute", "intra", "inter", "overhead")
    """The terms whose constants move (the others stay as they are)."""

    def __post_init__(self) -> None:
        if self.min_steps < 2:
            raise ValueError(f"Expected min_steps >= 2, got {self.min_steps}.")
        if self.refit_every < 1:
            raise ValueError(f"Expected refit_every >= 1, got {self.refit_every}.")
        if not self.max_change > 1.0:
            raise ValueError(f"Expected max_change > 1, got {self.max_change}.")
        if self.window < self.min_steps:
            raise ValueError(f"Expected window >= min_steps, got {self.window}.")
        object.__setattr__(self, "terms", tuple(self.terms))  # a stored config's list
        if not self.terms or not set(self.terms) <= set(CONSTANTS_OF_TERM):
            raise ValueError(f"Expected terms among {sorted(CONSTANTS_OF_TERM)}, got {self.terms}.")


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


def _fit_under(
    obs: Sequence[Observation],
    constants: dict[str, float],
    bound: float = 1e6,
    moved: Sequence[str] = FeedbackConfig.terms,
    use_all_to_all: bool = True,
) -> tuple[MultiplierFit, int]:
    """The multipliers under ``constants`` (each within ``[1/bound, bound]``) and how many
    all-to-all times were left out as waits.

    A measured all-to-all time includes waiting for the last peer to arrive (a slower rank's
    compute, a descheduled process). One above ``bound`` x its prediction is read as such a wait,
    not as a slow link, and left out: kept, a set of them drove every refit's bandwidths to the
    bound (and, unbounded, to the 0.01 GB/s floor of the range) on a loaded host."""
    rows: list[dict[str, float]] = []  # one per step first, then the all-to-all rows
    measured: list[float] = []
    comm_rows: list[dict[str, float]] = []
    comm_measured: list[float] = []
    waits = 0
    for o in obs:
        priced = with_constants(o.request, constants)
        terms = step_terms(priced, o.plan, CostModel.from_request(priced))
        rows.append(terms.as_dict())
        measured.append(o.measured_s)
        comm_s = terms.intra + terms.inter
        fixed_s = terms.latency + terms.peer_latency
        if use_all_to_all and o.all_to_all_s is not None and o.all_to_all_s > 0 and comm_s > 0:
            if o.all_to_all_s > bound * (comm_s + fixed_s):
                waits += 1
                continue
            comm = {**terms.as_dict(), "compute": 0.0, "overhead": 0.0}
            comm_rows.append(comm)
            comm_measured.append(o.all_to_all_s)
    rows, measured = rows + comm_rows, measured + comm_measured
    absent = [t for t in TERMS if all(r[t] == 0.0 for r in rows)]
    fixed = [*absent, *(t for t in TERMS if t not in moved)]
    fit = robust_multipliers(rows, measured, fixed=fixed, bounds=(1 / bound, bound))
    return fit, waits


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
    terms = {t: n for t, n in CONSTANTS_OF_TERM.items() if t in config.terms}
    missing = [n for names in terms.values() for n in names if n not in constants]
    if missing:
        raise CalibrationFitError(f"Expected a starting value for {', '.join(missing)}.")
    estimate = dict(constants)
    first: MultiplierFit | None = None
    for _ in range(FIXED_POINT_ROUNDS):
        # Each round's multipliers are bounded by what the refit may move in all (relative to
        # the current estimate): no term can go to zero, negative or to a range's end.
        fit, waits = _fit_under(
            obs, estimate, config.max_change**2, config.terms, config.use_all_to_all
        )
        first = first or fit
        for term, names in terms.items():
            m = fit.multipliers.get(term, 1.0)
            if m <= 0:
                raise CalibrationFitError(f"the {term} term got a non-positive multiplier {m:.3g}")
            for name in names:
                estimate[name] = _in_range(name, _apply(name, estimate[name], m))
        if all(abs(m - 1.0) < 1e-4 for m in fit.multipliers.values()):
            break
    assert first is not None
    factors = {
        term: _factor(names[0], estimate, constants, config.max_change)
        for term, names in terms.items()
    }
    new = _scaled(constants, terms, factors)
    notes = []
    if waits:
        notes.append(f"{waits} all-to-all times left out as waits for a slow peer")
    if any(new[n] >= EFFICIENCY_RANGE[1] for n in CONSTANTS_OF_TERM["compute"]):
        notes.append("an efficiency reached 1.0: raise peak_tflops in the profile")
    after, _ = _fit_under(obs, new, moved=config.terms, use_all_to_all=config.use_all_to_all)
    before_error = _median_abs(first.rel_errors_before[: len(obs)])
    after_error = _median_abs(after.rel_errors_before[: len(obs)])
    if after_error > before_error:
        # Noise the terms cannot explain (a loaded host) can make the bounded, robust per-term
        # fit worse on the very steps it saw: then one common scale (the median of measured /
        # predicted, bounded), else the constants as they were.
        ratios = [1.0 / (1.0 + e) for e in first.rel_errors_before[: len(obs)]]
        scale = bounded(statistics.median(ratios), config.max_change)
        factors = {t: scale if n[0] in TIME_CONSTANTS else 1.0 / scale for t, n in terms.items()}
        new = _scaled(constants, terms, factors)
        after_error = _median_abs(
            _fit_under(obs, new, moved=config.terms, use_all_to_all=config.use_all_to_all)[
                0
            ].rel_errors_before[: len(obs)]
        )
        if after_error < before_error:
            notes.append(f"per-term fit did not help: every term scaled by {scale:.3g}")
        else:
            notes.append("the refit did not predict its own steps better: constants kept")
            new = dict(constants)
            factors = dict.fromkeys(terms, 1.0)
            after_error = before_error
    return Refit(
        constants=new,
        multipliers=factors,
        median_abs_error_before=before_error,
        median_abs_error_after=after_error,
        steps=len(obs),
        outliers=first.outliers,
        notes=notes,
    )


def _scaled(
    constants: dict[str, float], terms: dict[str, tuple[str, ...]], factors: dict[str, float]
) -> dict[str, float]:
    """``constants`` with each fitted term's constants moved by its factor (kept in range)."""
    new = dict(constants)
    for term, names in terms.items():
        for name in names:
            new[name] = _in_range(name, constants[name] * factors[term])
    return new


def _apply(name: str, value: float, multiplier: float) -> float:
    """A constant after its term's time is scaled by ``multiplier``."""
    return value * multiplier if name in TIME_CONSTANTS else value / multiplier


def _factor(name: str, estimate: dict[str, float], start: dict[str, float], limit: float) -> float:
    """How far a constant moved (new / old), bounded to ``[1/limit, limit]``; 1 for a
    constant that is 0 (an absent term)."""
    if start[name] == 0:
        return 1.0
    return bounded(estimate[name] / start[name], limit)


def _in_range(name: str, value: float) -> float:
    """Clip a constant into the profile's valid range (an efficiency above 1 means the stated
    peak is too low; the refit reports it instead of writing an invalid profile)."""
    if name in TIME_CONSTANTS:
        return min(max(value, LATENCY_US_RANGE[0]), LATENCY_US_RANGE[1])
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
