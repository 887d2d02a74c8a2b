"""``/v1/plans``: plan a step (idempotent per key) and read a stored plan."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request, Response
from fastapi.exceptions import RequestValidationError
from starlette.background import BackgroundTask

from api.auth import Caller
from api.deps import MetricsDep, ServiceDep, StoreDep
from api.errors import PlanNotFound
from api.feedback import record_planned, resolve_request
from api.plan_log import log_plan, plan_fields
from api.problems import problem_responses
from api.routers.params import PlanIdPath
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
    responses=problem_responses(400, 401, 403, 409, 413, 422, 429, 500, 503),
)
async def create_plan(
    body: PlanRequest,
    service: ServiceDep,
    db: StoreDep,
    caller: Caller,
    metrics: MetricsDep,
    http: Request,
) -> Response:
    """Solve (or replay) the plan for ``(job_id, step)``.

    Every request with the same key and body gets byte-identical JSON; the same key with a
    different body is a 409. The solve is bounded by ``deadline_ms`` (or the service default).
    """
    if body.step is not None and body.step > MAX_STEP:
        raise RequestValidationError(
            [{"loc": ("body", "step"), "msg": f"must be <= {MAX_STEP}", "type": "less_than_equal"}]
        )
    _refuse_claimed_profile(body)
    caller.require(body.job_id)
    started = time.perf_counter()
    profiles = http.app.state.profiles
    body, profile_version = await resolve_request(
        profiles, db, body
    )  # opted-in job: refitted profile
    answer = await service.plan(body)
    log_plan(metrics, body, answer.body, answer.source, time.perf_counter() - started)
    return Response(
        answer.body,
        media_type="application/json",
        headers=_headers(answer.source, profile_version),
        # After the answer is sent: what a refit re-prices (off the plan's latency path).
        background=BackgroundTask(
            record_planned, profiles, db, body, answer.source, profile_version
        ),
    )


def _refuse_claimed_profile(body: PlanRequest) -> None:
    """A plan's ``profile`` block names the stored version that priced it, so only the
    service sets it: an inline profile carrying ``version`` / ``job_version``, or riding along
    with ``profile_name`` (whose stored constants it would replace unseen), is refused. The
    solver alone accepts both: a stored, resolved request replays as it was planned."""
    inline = body.profile
    if inline is None:
        return
    errors = [
        {
            "loc": ("body", "profile", field),
            "msg": "is set by the service from its profile store; leave it out of an inline "
            "profile (or send profile_name to use a stored one)",
            "type": "value_error",
        }
        for field in ("version", "job_version")
        if getattr(inline, field) is not None
    ]
    if body.profile_name is not None:
        errors.append(
            {
                "loc": ("body", "profile_name"),
                "msg": "names a stored profile, but the request also carries an inline profile "
                "that would replace it; give one of them",
                "type": "value_error",
            }
        )
    if errors:
        raise RequestValidationError(errors)


def _headers(source: str, profile_version: int | None) -> dict[str, str]:
    headers = {SOURCE_HEADER: source}
    if profile_version is not None:  # the job's refitted profile priced this plan
        headers[JOB_PROFILE_HEADER] = str(profile_version)
    return headers


@router.get(
    "/{plan_id}",
    response_model=Plan,
    summary="A stored plan",
    responses=problem_responses(401, 404, 422, 503),
)
async def get_plan(plan_id: PlanIdPath, service: ServiceDep, caller: Caller) -> Response:
    """The stored plan with this id, exactly as it was first returned. A named plan
    (``{job_id}-{step}``) wins over an anonymous one that happens to have the same id."""
    body = await service.get(plan_id)
    if body is not None and not caller.all_jobs and not caller.may(plan_fields(body).get("job_id")):
        body = None  # another job's plan: answered as absent, not as forbidden
    if body is None:
        raise PlanNotFound(f"no plan with id {plan_id!r}")
    return Response(body, media_type="application/json")
