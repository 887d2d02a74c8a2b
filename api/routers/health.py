"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import time

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel

from api.deps import DatabaseDep, MetricsDep, PoolDep, SettingsDep
from api.errors import DatabaseUnavailable
from api.problems import ProblemError, problem_responses

router = APIRouter(tags=["health"])


class Health(BaseModel):
    status: str


class Readiness(BaseModel):
    status: str
    database: str
    solver: str


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """The process is alive and its event loop answers."""
    return Health(status="ok")


@router.get("/readyz", response_model=Readiness, responses=problem_responses(503))
async def readyz(db: DatabaseDep, pool: PoolDep, settings: SettingsDep) -> Readiness:
    """The database answers and the solver workers are up; answered within
    ``REPACK_READY_TIMEOUT_MS`` even when the database hangs, and without its address.

    A pool that a worker dying idle broke is replaced and warmed up here: an instance taken
    out of rotation by this probe gets no request that would replace it.
    """
    timeout_s = settings.ready_timeout_ms / 1e3
    answer_by = time.monotonic() + timeout_s
    try:
        await db.ping(timeout_s)
    except DatabaseUnavailable as exc:
        retry = {"Retry-After": str(exc.retry_after_s or 1)}
        raise ProblemError(503, "not-ready", "database unavailable", headers=retry) from None
    if not await pool.recover(max(0.0, answer_by - time.monotonic())):
        retry = {"Retry-After": str(pool.retry_after_s)}
        raise ProblemError(503, "not-ready", "solver workers are not running", headers=retry)
    return Readiness(status="ready", database="ok", solver="ok")


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text"}},
)
async def metrics(m: MetricsDep) -> Response:
    """Prometheus exposition of this instance's metrics."""
    return Response(m.exposition(), media_type=CONTENT_TYPE_LATEST)
