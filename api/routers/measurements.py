"""Measured steps (``POST /v1/jobs/{job}/steps/{step}/measurements``) and the closed loop.

A measurement is stored beside the step's plan, once per ``(job_id, step)``: the same body again
is a 200 replay, a different body a 409. ``GET /v1/jobs/{job}/measurements`` lists measured
against predicted step times with the dominating cost-model term; ``PUT /v1/jobs/{job}/feedback``
opts a job into profile refits from its measurements.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt

from api.auth import Caller
from api.deps import StoreDep
from api.feedback import feedback_view, maybe_refit
from api.measurement_view import compare_steps
from api.problems import ProblemError, problem_responses
from api.profile_store import ProfileStore
from api.routers import plans
from api.routers.params import DecimalInt, JobIdPath, MeasurementsAfter, StepPath
from solver.input_limits import FewUnknownKeys
from solver.measurement_schema import StepMeasurement
from solver.profile_feedback import FeedbackConfig

# Authenticated like plans: whatever dependencies guard the plans router guard these routes.
router = APIRouter(
    prefix="/v1/jobs", tags=["measurements"], dependencies=list(plans.router.dependencies)
)

MAX_LIST = 10_000


def profile_store(request: Request) -> ProfileStore:
    store: ProfileStore = request.app.state.profiles
    return store


class MeasurementAnswer(BaseModel):
    job_id: str
    step: int
    measurement: StepMeasurement
    predicted_ms: float | None = Field(None, description="The stored plan's predicted step time.")
    profile_version: int | None = Field(None, description="A profile version this post created.")


class FeedbackSettings(FewUnknownKeys):
    """Opt a job in or out of profile refits from its measured steps."""

    model_config = ConfigDict(extra="forbid")

    # Strict like the plan schema: "enabled": "off" must not be read as a choice.
    enabled: StrictBool
    min_steps: StrictInt = Field(FeedbackConfig.min_steps, ge=2, le=100_000)
    refit_every: StrictInt = Field(FeedbackConfig.refit_every, ge=1, le=100_000)
    max_change: StrictFloat = Field(FeedbackConfig.max_change, gt=1.0, le=10.0, allow_inf_nan=False)
    window: StrictInt = Field(FeedbackConfig.window, ge=2, le=MAX_LIST)


@router.post(
    "/{job_id}/steps/{step}/measurements",
    response_model=MeasurementAnswer,
    status_code=201,
    summary="Report what a step really took",
    responses={
        200: {"model": MeasurementAnswer, "description": "Already stored: a replay."},
        **problem_responses(400, 401, 403, 409, 413, 422, 429, 503),
    },
)
async def post_measurement(
    job_id: JobIdPath,
    step: StepPath,
    body: StepMeasurement,
    request: Request,
    plans_store: StoreDep,
    caller: Caller,
) -> Response:
    """Store the measurement (idempotent); refit the job's profile when it opted in and a
    refit is due."""
    caller.require(job_id)
    profiles = profile_store(request)
    data = body.model_dump(exclude_none=True)
    stored, created = await plans_store.call(profiles.put_measurement, job_id, step, data)
    if json.loads(stored.body) != data:
        raise ProblemError(
            409,
            "measurement-conflict",
            f"step {step} of job {job_id!r} already has a different measurement",
        )
    version = None
    if created:
        fitted = await plans_store.call(maybe_refit, profiles, plans_store.store, job_id)
        version = None if fitted is None else fitted.version
    row = await plans_store.get_row(f"{job_id}-{step}")  # the step's plan
    predicted = None if row is None else row.step_time_ms
    answer = MeasurementAnswer(
        job_id=job_id, step=step, measurement=body, predicted_ms=predicted, profile_version=version
    )
    return Response(
        answer.model_dump_json(), status_code=201 if created else 200, media_type="application/json"
    )


@router.get(
    "/{job_id}/measurements",
    summary="Measured vs predicted step times of a job",
    responses=problem_responses(401, 403, 404, 422, 429, 503),
)
async def list_measurements(
    job_id: JobIdPath,
    request: Request,
    plans_store: StoreDep,
    caller: Caller,
    after: MeasurementsAfter = None,
    limit: Annotated[DecimalInt, Query(ge=1, le=MAX_LIST)] = 1000,
) -> dict[str, Any]:
    caller.require(job_id)
    profiles = profile_store(request)
    steps = await plans_store.call(compare_steps, profiles, plans_store.store, job_id, limit, after)
    if not steps and after is None:
        raise ProblemError(404, "job-not-found", f"no measurements for job {job_id!r}")
    return {"job_id": job_id, "steps": steps}


@router.put(
    "/{job_id}/feedback",
    summary="Opt a job in or out of profile refits",
    responses=problem_responses(400, 401, 403, 413, 422, 429, 503),
)
async def put_feedback(
    job_id: JobIdPath, body: FeedbackSettings, request: Request, db: StoreDep, caller: Caller
) -> dict[str, Any]:
    settings = body.model_dump(exclude={"enabled"})
    try:
        FeedbackConfig(**settings)
    except ValueError as exc:
        raise RequestValidationError(
            [{"loc": ("body", "window"), "msg": str(exc), "type": "value_error"}]
        ) from None
    caller.require(job_id)
    profiles = profile_store(request)
    await db.call(profiles.put_feedback, job_id, body.enabled, settings, None)
    return await db.call(feedback_view, profiles, job_id)


@router.get(
    "/{job_id}/feedback",
    summary="A job's refit settings and fitted profile versions",
    responses=problem_responses(401, 403, 422, 429, 503),
)
async def get_feedback(
    job_id: JobIdPath, request: Request, db: StoreDep, caller: Caller
) -> dict[str, Any]:
    caller.require(job_id)
    return await db.call(feedback_view, profile_store(request), job_id)
