"""A request shared by the determinism test and the fresh processes it starts."""

from __future__ import annotations

import random

from solver.schema import PlanRequest
from tests.helpers import long_tailed_lengths


def determinism_request() -> PlanRequest:
    rng = random.Random(2026)
    lengths = long_tailed_lengths(rng, 250, longest=60_000, median=2500)
    lengths[5] = 200_000
    return PlanRequest(lengths=lengths, job_id="det", step=1, deadline_ms=60_000)
