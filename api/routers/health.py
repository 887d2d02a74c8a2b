"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from api.deps import MetricsDep, PoolDep, StoreDep
from api.problems import ProblemError, problem_responses

router = APIRouter(tags=["health"])

READY_TIMEOUT_S = 2.0


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
async def readyz(store: StoreDep, pool: PoolDep) -> Readiness:
    """The database answers and the solver workers are up."""
    try:
        await asyncio.wait_for(run_in_threadpool(store.ping), READY_TIMEOUT_S)
    except Exception as exc:
        raise ProblemError(503, "not-ready", f"database unreachable: {exc!r}") from exc
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
