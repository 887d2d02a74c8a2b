"""Path and query parameters shared by the routers.

Job and plan ids are bounded and free of control characters (a NUL cannot reach PostgreSQL) and
of ``/``, exactly like ``job_id`` in a request body; every route that takes a job id uses
``JobIdPath``. Step numbers fit the database's signed 64-bit integer (``MAX_STEP``), so a bigger
one is a 422 naming the parameter, not a driver error.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import Path, Query
from pydantic import BeforeValidator

from api.storage import MAX_STEP
from solver.schema import JOB_ID_PATTERN

_DECIMAL = re.compile(r"-?[0-9]{1,20}")


def _decimal(value: Any) -> Any:
    """A path or query integer as decimal digits only: Python's ``int()`` also reads ``1_0``
    (10), ``+1`` and `` 1``, so one step had many URLs (the 2026-12-07 fuzz)."""
    if isinstance(value, str) and not _DECIMAL.fullmatch(value):
        raise ValueError("must be a decimal integer (digits only)")
    return value


DecimalInt = Annotated[int, BeforeValidator(_decimal)]
"""An integer path or query parameter, written in decimal digits."""

JobIdPath = Annotated[str, Path(min_length=1, max_length=200, pattern=JOB_ID_PATTERN)]
PlanIdPath = Annotated[str, Path(min_length=1, max_length=300, pattern=JOB_ID_PATTERN)]
StepPath = Annotated[DecimalInt, Path(ge=0, le=MAX_STEP, description="Step number.")]
StepsAfter = Annotated[DecimalInt | None, Query(ge=-1, le=MAX_STEP, description="Last step seen.")]
"""``GET /v1/jobs/{job_id}/steps``: the last step seen (-1 reads from step 0)."""
MeasurementsAfter = Annotated[
    DecimalInt | None, Query(ge=0, le=MAX_STEP, description="Last step seen.")
]
"""``GET /v1/jobs/{job_id}/measurements``: the last measured step seen."""
