"""``/v1/plans``: plan a step (idempotent per job and step) and read a stored plan."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request, Response
from fastapi.exceptions import RequestValidationError
from starlette.background import BackgroundTask

from api.deps import ServiceDep
from api.feedback import record_planned, resolve_request
from api.problems import ProblemError, problem_responses
from api.storage import MAX_STEP
from solver.schema import Plan, PlanRequest

router = APIRouter(prefix="/v1/plans", tags=["plans"])

SOURCE_HEADER = "X-Repack-Plan-Source"
"""Where the answer came from: solved, inflight (joined a running solve), memory, database."""
JOB_PROFILE_HEADER = "X-Repack-Job-Profile-Version"
"""The version of the job's refitted profile the plan was priced with (opted-in jobs only)."""


@router.post(
    "",
    response_model=Plan,
    summary="Plan one step",
    responses=problem_responses(400, 409, 413, 422, 429, 500, 503),
)
async def create_plan(body: PlanRequest, service: ServiceDep, http: Request) -> Response:
    """Solve (or replay) the plan for ``(job_id, step)``.

    Every request with the same key and body gets byte-identical JSON; the same key with a
    different body is a 409. The solve is bounded by ``deadline_ms`` (or the service default).
    """
    if body.step is not None and body.step > MAX_STEP:
        raise RequestValidationError(
            [{"loc": ("body", "step"), "msg": f"must be <= {MAX_STEP}", "type": "less_than_equal"}]
        )
    profiles = http.app.state.profiles
    body, profile_version = await resolve_request(profiles, body)  # opted-in job: refitted profile
    answer = await service.plan(body)
    return Response(
        answer.body,
        media_type="application/json",
        headers=_headers(answer.source, profile_version),
        # After the answer is sent: what a refit re-prices (off the plan's latency path).
        background=BackgroundTask(record_planned, profiles, body, answer.source, profile_version),
    )


def _headers(source: str, profile_version: int | None) -> dict[str, str]:
    headers = {SOURCE_HEADER: source}
    if profile_version is not None:  # the job's refitted profile priced this plan
        headers[JOB_PROFILE_HEADER] = str(profile_version)
    return headers


@router.get(
    "/{plan_id}",
    response_model=Plan,
    summary="A stored plan",
    responses=problem_responses(404, 422),
)
async def get_plan(
    plan_id: Annotated[str, Path(min_length=1, max_length=300)], service: ServiceDep
) -> Response:
    """The stored plan with this id, exactly as it was first returned."""
    body = await service.get(plan_id)
    if body is None:
        raise ProblemError(404, "plan-not-found", f"no plan with id {plan_id!r}")
    return Response(body, media_type="application/json")
