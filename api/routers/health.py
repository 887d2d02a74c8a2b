"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

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
    ``REPACK_READY_TIMEOUT_MS`` even when the database hangs, and without its address."""
    try:
        await db.ping(settings.ready_timeout_ms / 1e3)
    except DatabaseUnavailable as exc:
        retry = {"Retry-After": str(exc.retry_after_s or 1)}
        raise ProblemError(503, "not-ready", "database unavailable", headers=retry) from None
    if not pool.healthy:
        raise ProblemError(503, "not-ready", "solver workers are not running")
    return Readiness(status="ready", database="ok", solver="ok")


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text"}},
)
async def metrics(m: MetricsDep) -> Response:
    """Prometheus exposition of this instance's metrics."""
    return Response(m.exposition(), media_type=CONTENT_TYPE_LATEST)
