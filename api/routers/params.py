"""Path parameters shared by the routers: bounded, and free of control characters (a NUL
cannot reach PostgreSQL) and of ``/``, exactly like ``job_id`` in a request body."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path

from solver.schema import JOB_ID_PATTERN

JobIdPath = Annotated[str, Path(min_length=1, max_length=200, pattern=JOB_ID_PATTERN)]
PlanIdPath = Annotated[str, Path(min_length=1, max_length=300, pattern=JOB_ID_PATTERN)]
