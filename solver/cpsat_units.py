"""Integer time units of the CP-SAT models, chosen so that no coefficient can overflow.

CP-SAT works on 64-bit integers and rejects a model whose linear expressions could overflow.
Every model turns seconds into integer units; a fixed 1 ns unit is exact enough for every
realistic request, but an accepted request at the edge of the plausible ranges (a slow GPU, a
huge model, a sample of 2^30 tokens) has step times of 10^15 s and more. A model therefore
takes ``time_unit_s(horizon_s)`` for the largest sum of seconds it writes as one expression:
1 ns while that stays below ``MAX_HORIZON_UNITS`` (every request of the scenarios and benches),
coarser beyond, which only costs the extreme requests resolution.
"""

from __future__ import annotations

import math

BASE_TIME_UNIT_S = 1e-9
"""1 ns keeps rounding far below any decision's effect."""

MAX_HORIZON_UNITS = float(1 << 42)
"""Largest value of one expression in units: 2^42 leaves 2^21 of headroom below 2^63 for the
integer coefficients a model multiplies it by (layers, ranks, child sizes)."""


def time_unit_s(horizon_s: float) -> float:
    """Seconds per integer unit for a model whose expressions sum to at most ``horizon_s``."""
    if not math.isfinite(horizon_s) or horizon_s <= 0:
        return BASE_TIME_UNIT_S
    return max(BASE_TIME_UNIT_S, horizon_s / MAX_HORIZON_UNITS)
