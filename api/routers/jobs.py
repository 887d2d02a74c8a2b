"""``/v1/jobs``: plan history per job, keyset-paginated, with each plan's metrics."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel

from api.auth import Caller
from api.deps import DatabaseDep, ServiceDep, SettingsDep
from api.errors import JobNotFound
from api.problems import problem_responses
from api.routers.params import DecimalInt, JobIdPath, StepsAfter
from api.storage import JobSummary, PlanRow, as_utc
from solver.schema import JOB_ID_PATTERN

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

MAX_PAGE = 1000


class JobPage(BaseModel):
    items: list[JobSummary]  # the storage row type, served as is
    next_after: str | None = None
    """Pass as ``after`` for the next page; null on the last page."""


class StepMetrics(BaseModel):
    step_time_ms: float
    baseline_step_time_ms: float
    speedup: float
    mfu: float
    baseline_mfu: float
    gap: float | None
    lower_bound_ms: float | None
    solve_ms: float | None
    stopped_by: str | None


class Step(BaseModel):
    step: int
    plan_id: str
    mode: str
    status: str
    nodes: int
    gpus_per_node: int
    num_samples: int
    created_at: datetime
    metrics: StepMetrics

    @classmethod
    def from_row(cls, row: PlanRow) -> Step:
        assert row.step is not None
        metrics = StepMetrics(
            step_time_ms=row.step_time_ms,
            baseline_step_time_ms=row.baseline_step_time_ms,
            speedup=row.speedup,
            mfu=row.mfu,
            baseline_mfu=row.baseline_mfu,
            gap=row.gap,
            lower_bound_ms=row.lower_bound_ms,
            solve_ms=row.solve_ms,
            stopped_by=row.stopped_by,
        )
        return cls(
            step=row.step,
            plan_id=row.plan_id,
            mode=row.mode,
            status=row.status,
            nodes=row.nodes,
            gpus_per_node=row.gpus_per_node,
            num_samples=row.num_samples,
            created_at=as_utc(row.created_at),
            metrics=metrics,
        )


class StepPage(BaseModel):
    job_id: str
    items: list[Step]
    next_after: int | None = None
    """Pass as ``after`` for the next page; null on the last page."""


Limit = Annotated[DecimalInt | None, Query(ge=1, le=MAX_PAGE, description="Page size.")]


@router.get("", response_model=JobPage, responses=problem_responses(401, 403, 422, 429, 503))
async def list_jobs(
    db: DatabaseDep,
    settings: SettingsDep,
    caller: Caller,
    after: Annotated[
        str | None, Query(max_length=200, pattern=JOB_ID_PATTERN, description="Last job id seen.")
    ] = None,
    limit: Limit = None,
) -> JobPage:
    """Jobs with at least one stored plan, ordered by id (needs a token scoped for all jobs)."""
    caller.require_all()
    size = limit or settings.page_limit
    jobs = await db.list_jobs(after, size)
    items = list(jobs)
    return JobPage(items=items, next_after=items[-1].job_id if len(items) == size else None)


@router.get(
    "/{job_id}/steps",
    response_model=StepPage,
    responses=problem_responses(401, 403, 404, 422, 429, 503),
)
async def list_steps(
    job_id: JobIdPath,
    db: DatabaseDep,
    settings: SettingsDep,
    caller: Caller,
    after: StepsAfter = None,
    limit: Limit = None,
) -> StepPage:
    """A job's plans in step order with their metrics (empty for a job whose plans carry no
    step; 404 only for a job with no plans at all)."""
    caller.require(job_id)
    size = limit or settings.page_limit
    rows = await db.list_steps(job_id, after, size)
    if not rows and after is None and not await db.has_job(job_id):
        raise JobNotFound(f"no plans for job {job_id!r}")
    items = [Step.from_row(r) for r in rows]
    return StepPage(
        job_id=job_id, items=items, next_after=items[-1].step if len(items) == size else None
    )


@router.delete(
    "/{job_id}", status_code=204, responses=problem_responses(401, 403, 404, 422, 429, 503)
)
async def delete_job(job_id: JobIdPath, service: ServiceDep, caller: Caller) -> Response:
    """Delete every stored plan of a job (named and anonymous plans that carry its id).

    Other replicas may still replay a deleted plan from memory until it leaves their cache.
    """
    caller.require(job_id)
    deleted = await service.db.delete_job(job_id)
    service.forget_job(job_id)
    if deleted == 0:
        raise JobNotFound(f"no plans for job {job_id!r}")
    return Response(status_code=204)
