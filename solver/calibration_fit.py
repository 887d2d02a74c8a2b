"""Least-squares fits behind calibration and the measured-feedback loop (numpy only).

Two kinds of fit, both linear in the unknowns:

* **offline calibration** (``fit_link``, ``fit_rate``): microbenchmark times against bytes or
  FLOPs; ``seconds = latency + x / rate``. The intercept (a fixed latency per collective) is kept
  only when the data asks for it: when it is positive and dropping it makes the fit clearly
  worse. The result carries its own error so ``repack calibrate`` can print it per term.
* **online correction** (``robust_multipliers``): measured step times against the cost model's
  per-term prediction of each step; one multiplier per term, fitted with Huber-weighted
  iteratively re-weighted least squares (a straggler step or a GC pause must not move the
  profile), pulled towards 1 by a small ridge so that a term the data cannot see stays put.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

INTERCEPT_GAIN = 0.8
"""Keep an intercept only when it cuts the relative RMS error to below 80% of the fit without."""

HUBER_K = 1.345
"""Huber's tuning constant: 95% efficiency under Gaussian noise."""

MAD_TO_SIGMA = 1.4826
"""Median absolute deviation of a normal sample times this is its standard deviation."""

IRLS_ITERATIONS = 30

LATENCY_ONLY_RATE = 1e14
"""Rate reported when time does not grow with size at all (pure latency): 100,000 GB/s, the top
of a profile's bandwidth range, so the size term vanishes without dividing by zero."""


class CalibrationFitError(ValueError):
    """The measurements cannot determine the requested constants."""


@dataclass(frozen=True, kw_only=True)
class RateFit:
    """``seconds = intercept_s + x / rate`` fitted to measurements."""

    rate: float
    """Units of ``x`` per second (bytes/s or FLOP/s)."""
    intercept_s: float
    """Fixed seconds per call; 0.0 when the data did not ask for one."""
    rel_rms_error: float
    """Root mean square of (predicted - measured) / measured over the points."""
    max_rel_error: float
    points: int
    per_item_s: float = 0.0
    """Fixed seconds per item (a sample of a packed call) on top of ``intercept_s``; 0.0 unless
    fitted by ``fit_rate_per_item``."""

    def predict(self, x: NDArray[np.float64], items: float = 1.0) -> NDArray[np.float64]:
        fixed = self.intercept_s + self.per_item_s * items
        return fixed + np.asarray(x, dtype=np.float64) / self.rate


def relative_errors(
    predicted: NDArray[np.float64], measured: NDArray[np.float64]
) -> NDArray[np.float64]:
    return (np.asarray(predicted) - np.asarray(measured)) / np.asarray(measured)


def _weighted_lstsq(
    X: NDArray[np.float64], y: NDArray[np.float64], w: NDArray[np.float64]
) -> NDArray[np.float64]:
    sw = np.sqrt(w)
    coef, *_ = np.linalg.lstsq(X * sw[:, None], y * sw, rcond=None)
    return np.asarray(coef, dtype=np.float64)


def fit_rate(
    x: Sequence[float] | NDArray[np.float64],
    seconds: Sequence[float] | NDArray[np.float64],
    *,
    intercept: bool | None = None,
) -> RateFit:
    """Fit ``seconds = b + x / rate`` minimising *relative* squared error (small and large
    points count alike). ``intercept=None`` keeps ``b`` only if the data asks for it."""
    x_a = np.asarray(x, dtype=np.float64)
    y_a = np.asarray(seconds, dtype=np.float64)
    if x_a.shape != y_a.shape or x_a.size < 2:
        raise CalibrationFitError(f"Expected >= 2 paired points, got {x_a.size} and {y_a.size}.")
    if np.any(y_a <= 0) or np.any(x_a <= 0):
        raise CalibrationFitError("Expected positive sizes and times.")
    w = 1.0 / y_a**2  # relative error
    through_zero = _fit_slope(x_a, y_a, w)
    if intercept is False:
        return through_zero
    X = np.column_stack([np.ones_like(x_a), x_a])
    b, slope = _weighted_lstsq(X, y_a, w)
    if slope <= 0:  # flat or falling with size: latency only
        latency = float(np.sum(w * y_a) / np.sum(w))
        return _rate_fit(x_a, y_a, LATENCY_ONLY_RATE, latency)
    if b <= 0:
        return through_zero
    with_b = _rate_fit(x_a, y_a, 1.0 / slope, float(b))
    if intercept or with_b.rel_rms_error < INTERCEPT_GAIN * through_zero.rel_rms_error:
        return with_b
    return through_zero


def fit_rate_per_item(
    x: Sequence[float] | NDArray[np.float64],
    items: Sequence[float] | NDArray[np.float64],
    seconds: Sequence[float] | NDArray[np.float64],
    *,
    min_rate: float = 0.0,
) -> RateFit:
    """Fit ``seconds = b + c * items + x / rate`` (relative error) with ``b, c >= 0`` and
    ``rate >= min_rate``: every subset of the fixed terms is fitted (with the rate free, and held
    at ``min_rate``) and the best valid one kept, so a term the data does not support is 0,
    never negative, and fixed costs that swamp the FLOPs cannot push the rate below a profile's
    range (a bounded fit, not a clipped one)."""
    x_a, n_a, y_a = (np.asarray(v, dtype=np.float64) for v in (x, items, seconds))
    if not x_a.shape == n_a.shape == y_a.shape or x_a.size < 3:
        raise CalibrationFitError(f"Expected >= 3 paired points, got {x_a.size}.")
    if np.any(y_a <= 0) or np.any(x_a <= 0) or np.any(n_a < 1):
        raise CalibrationFitError("Expected positive sizes, items and times.")
    w = 1.0 / y_a**2
    best: RateFit | None = None
    for use_b, use_c in ((True, True), (True, False), (False, True), (False, False)):
        fixed_cols = [np.ones_like(x_a)] * use_b + [n_a] * use_c
        candidates = []
        coef = _weighted_lstsq(np.column_stack([*fixed_cols, x_a]), y_a, w)
        candidates.append((list(coef[:-1]), float(coef[-1])))
        if min_rate > 0:  # the same with the rate held at its bound
            held = 1.0 / min_rate
            if fixed_cols:
                rest = _weighted_lstsq(np.column_stack(fixed_cols), y_a - x_a * held, w)
                candidates.append((list(rest), held))
            else:
                candidates.append(([], held))
        for fixed, slope in candidates:
            b = float(fixed[0]) if use_b else 0.0
            c = float(fixed[int(use_b)]) if use_c else 0.0
            if b < 0 or c < 0 or slope <= 0 or 1.0 / slope < min_rate * (1 - 1e-9):
                continue
            rel = relative_errors(b + c * n_a + x_a * slope, y_a)
            fit = RateFit(
                rate=1.0 / slope,
                intercept_s=b,
                per_item_s=c,
                rel_rms_error=float(np.sqrt(np.mean(rel**2))),
                max_rel_error=float(np.max(np.abs(rel))),
                points=int(x_a.size),
            )
            if best is None or fit.rel_rms_error < best.rel_rms_error:
                best = fit
    if best is None:  # time falls with size everywhere: a fixed cost per call only
        return _rate_fit(x_a, y_a, LATENCY_ONLY_RATE, float(np.sum(w * y_a) / np.sum(w)))
    return best


def fit_intercept_at_rate(
    x: Sequence[float] | NDArray[np.float64],
    seconds: Sequence[float] | NDArray[np.float64],
    rate: float,
) -> RateFit:
    """``seconds = b + x / rate`` with the rate given (a bound of the profile's range) and
    ``b >= 0`` fitted on relative errors: the time a too-slow fit cannot put on the rate is a
    fixed cost per call instead."""
    x_a, y_a = np.asarray(x, dtype=np.float64), np.asarray(seconds, dtype=np.float64)
    w = 1.0 / y_a**2
    b = max(0.0, float(np.sum(w * (y_a - x_a / rate)) / np.sum(w)))
    return _rate_fit(x_a, y_a, rate, b)


def _fit_slope(x: NDArray[np.float64], y: NDArray[np.float64], w: NDArray[np.float64]) -> RateFit:
    slope = float(np.sum(w * x * y) / np.sum(w * x * x))
    return _rate_fit(x, y, 1.0 / slope, 0.0)


def _rate_fit(x: NDArray[np.float64], y: NDArray[np.float64], rate: float, b: float) -> RateFit:
    rel = relative_errors(b + x / rate, y)
    return RateFit(
        rate=rate,
        intercept_s=b,
        rel_rms_error=float(np.sqrt(np.mean(rel**2))),
        max_rel_error=float(np.max(np.abs(rel))),
        points=int(x.size),
    )


@dataclass(frozen=True, kw_only=True)
class MultiplierFit:
    """Per-term multipliers of the current profile's prediction that best explain measurements."""

    multipliers: dict[str, float]
    rel_errors_before: tuple[float, ...]
    """(predicted - measured) / measured per step with every multiplier at 1."""
    rel_errors_after: tuple[float, ...]
    """The same with the fitted multipliers."""
    outliers: int
    """Steps the robust weights down-weighted to less than half."""


def huber_weights(residuals: NDArray[np.float64]) -> NDArray[np.float64]:
    """Huber IRLS weights with a MAD scale estimate (1 inside ``HUBER_K`` sigmas)."""
    scale = MAD_TO_SIGMA * float(np.median(np.abs(residuals - np.median(residuals))))
    if scale <= 1e-12:
        return np.ones_like(residuals)
    u = np.abs(residuals) / (HUBER_K * scale)
    return np.where(u <= 1.0, 1.0, 1.0 / np.maximum(u, 1e-12))


def robust_multipliers(
    terms: Sequence[dict[str, float]],
    measured_s: Sequence[float],
    *,
    ridge: float = 1e-3,
    fixed: Sequence[str] = (),
    bounds: tuple[float, float] = (1e-6, 1e6),
) -> MultiplierFit:
    """Fit ``measured ~ sum_j m_j * terms[j]`` on relative residuals with Huber IRLS.

    ``terms`` gives each step's predicted seconds per term (they sum to the prediction). The
    ridge pulls every ``m_j`` towards 1 with a weight relative to the term's share of the data,
    so a term that is (nearly) absent from the measured steps keeps its current value instead of
    absorbing noise. Terms in ``fixed`` stay at 1. Every multiplier stays inside ``bounds``
    (a box-constrained fit: a multiplier that would leave it is held at the bound and the others
    are refitted), so fixed terms larger than a measured time cannot send another term's
    multiplier to zero or below.
    """
    if len(terms) != len(measured_s) or not terms:
        raise CalibrationFitError(
            f"Expected as many term rows as times, got {len(terms)} and {len(measured_s)}."
        )
    names = sorted({k for row in terms for k in row})
    free = [n for n in names if n not in set(fixed)]
    y = np.asarray(measured_s, dtype=np.float64)
    if np.any(y <= 0):
        raise CalibrationFitError("Expected positive measured times.")
    T = np.array([[row.get(n, 0.0) for n in names] for row in terms], dtype=np.float64)
    base = T.sum(axis=1)
    if np.any(base <= 0):
        raise CalibrationFitError("Expected positive predicted times.")
    # Relative residuals: divide every row by the measurement.
    A = T / y[:, None]
    free_idx = [names.index(n) for n in free]
    fixed_part = A[:, [i for i in range(len(names)) if names[i] not in free]].sum(axis=1)
    Af, target = A[:, free_idx], 1.0 - fixed_part
    m = np.ones(len(free))
    w = np.ones(len(y))
    for _ in range(IRLS_ITERATIONS):
        m_new = _box_solve(Af, target, w, ridge, bounds)
        resid = target - Af @ m_new
        w = huber_weights(resid)
        if np.allclose(m_new, m, rtol=1e-9, atol=1e-12):
            m = m_new
            break
        m = m_new
    full = {n: 1.0 for n in names}
    full.update({n: float(v) for n, v in zip(free, m, strict=True)})
    after = T @ np.array([full[n] for n in names])
    return MultiplierFit(
        multipliers=full,
        rel_errors_before=tuple(relative_errors(base, y).tolist()),
        rel_errors_after=tuple(relative_errors(after, y).tolist()),
        outliers=int(np.sum(w < 0.5)),
    )


def _box_solve(
    A: NDArray[np.float64],
    target: NDArray[np.float64],
    w: NDArray[np.float64],
    ridge: float,
    bounds: tuple[float, float],
) -> NDArray[np.float64]:
    """``_ridge_solve`` with every coefficient in ``bounds``: coefficients outside are pinned to
    the nearer bound one at a time (the worst first) and the rest re-solved, at most once each."""
    lo, hi = bounds
    pinned: dict[int, float] = {}
    m = np.ones(A.shape[1])
    for _ in range(A.shape[1] + 1):
        free = [j for j in range(A.shape[1]) if j not in pinned]
        rest = target - A[:, list(pinned)] @ np.array(list(pinned.values())) if pinned else target
        sub = _ridge_solve(A[:, free], rest, w, ridge)
        m = np.ones(A.shape[1])
        for j, v in pinned.items():
            m[j] = v
        m[free] = sub
        out = {j: float(m[j]) for j in free if not lo <= m[j] <= hi}
        if not out:
            return m
        worst = max(out, key=lambda j: max(lo / max(out[j], 1e-300), out[j] / hi))
        pinned[worst] = lo if out[worst] < lo else hi
    return np.clip(m, lo, hi)


def _ridge_solve(
    A: NDArray[np.float64], target: NDArray[np.float64], w: NDArray[np.float64], ridge: float
) -> NDArray[np.float64]:
    """argmin_m sum w (target - A m)^2 + ridge * sum_j s_j (m_j - 1)^2, s_j = column energy."""
    if A.shape[1] == 0:
        return np.zeros(0)
    AtW = A.T * w
    energy = np.sum(w[:, None] * A**2, axis=0)
    reg = ridge * np.maximum(energy, 1e-12 * max(float(energy.max()), 1e-300))
    lhs = AtW @ A + np.diag(reg)
    rhs = AtW @ target + reg
    return np.asarray(np.linalg.solve(lhs, rhs), dtype=np.float64)


def bounded(multiplier: float, max_change: float) -> float:
    """Clip a correction to ``[1/max_change, max_change]``: one refit moves a constant at most
    that factor, so one bad batch of measurements cannot wreck a job's plans."""
    return float(min(max(multiplier, 1.0 / max_change), max_change))
