"""The closed loop in the service: measured steps -> refitted job profile -> next plans.

Opt-in per job (``PUT /v1/jobs/{job}/feedback``). After each new measurement of an opted-in job,
once ``min_steps`` are measured and every ``refit_every`` steps after, the latest ``window``
measured steps are re-priced with their stored requests and plans and the job's constants are
refitted (``solver.profile_feedback``, bounded change). Each fit is a new version that applies
from the step after the last one already planned: a step that was planned keeps the profile it
was planned with, so a retried request replays its plan instead of conflicting with it.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict
from typing import Any

from api.database import Database
from api.errors import DatabaseUnavailable
from api.profile_store import JobProfileRow, ProfileStore
from api.storage import PlanKey, PlanStore, utcnow
from solver.calibration_fit import CalibrationFitError
from solver.measurement_schema import StepMeasurement
from solver.plan_builder import plan_id_for, request_digest
from solver.profile_feedback import (
    FeedbackConfig,
    Observation,
    constants_of,
    refit,
    refit_due,
    with_constants,
)
from solver.profile_lookup import ProfileLookup, with_named_profile
from solver.profiles import Profile
from solver.schema import Plan, PlanRequest

logger = logging.getLogger(__name__)


def config_of(raw: str) -> FeedbackConfig:
    return FeedbackConfig(**json.loads(raw))


def resolve_for_job(profiles: ProfileStore, request: PlanRequest) -> tuple[PlanRequest, int | None]:
    """``request`` priced with the job's fitted profile for its step, if the job opted in."""
    if request.job_id is None or request.step is None:
        return request, None
    feedback = profiles.get_feedback(request.job_id)
    if feedback is None or not feedback.enabled:
        return request, None
    version = profiles.job_profile_for_step(request.job_id, request.step)
    if version is None:
        return request, None
    constants = {**json.loads(version.body), "job_version": version.version}
    return with_constants(request, constants), version.version


def _observations(
    profiles: ProfileStore, plans: PlanStore, job_id: str, window: int
) -> list[Observation]:
    rows = profiles.latest_measurements(job_id, window)
    requests = profiles.step_requests(job_id, [r.step for r in rows])
    out = []
    for m in rows:
        req_row = requests.get(m.step)
        if req_row is None:
            continue  # measured without a plan from this service: nothing to re-price
        stored = plans.get(req_row.plan_id)
        if stored is None:
            continue
        measured = StepMeasurement.model_validate_json(m.body)
        a2a = None if measured.all_to_all_ms is None else measured.all_to_all_ms / 1e3
        out.append(
            Observation(
                PlanRequest.model_validate_json(req_row.request),
                Plan.model_validate_json(stored.body),
                measured.step_time_ms / 1e3,
                a2a,
            )
        )
    return out


def maybe_refit(profiles: ProfileStore, plans: PlanStore, job_id: str) -> JobProfileRow | None:
    """Refit the job's profile if it opted in and a refit is due; the new version or None."""
    feedback = profiles.get_feedback(job_id)
    if feedback is None or not feedback.enabled:
        return None
    config = config_of(feedback.config)
    versions = profiles.job_profiles(job_id)
    last = versions[-1] if versions else None
    count = profiles.count_measurements(job_id)
    if not refit_due(count, 0 if last is None else last.steps_used, config):
        return None
    obs = _observations(profiles, plans, job_id, config.window)
    if len(obs) < config.min_steps:
        return None
    # Versions stored before a constant joined the refit (``layer_overhead_us``) lack it: the
    # request's profile fills what they do not say.
    current = constants_of(obs[-1].request)
    if last is not None:
        current.update(json.loads(last.body))
    elif feedback.base_profile is not None:
        current.update(json.loads(feedback.base_profile))
    try:
        result = refit(obs, current, config)
    except (CalibrationFitError, ValueError) as exc:
        logger.warning("job %s: refit skipped: %s", job_id, exc)
        return None
    planned = profiles.max_planned_step(job_id)
    row = JobProfileRow(
        job_id=job_id,
        version=1 if last is None else last.version + 1,
        from_step=0 if planned is None else planned + 1,
        steps_used=count,
        error_before=_finite(result.median_abs_error_before),
        error_after=_finite(result.median_abs_error_after),
        body=json.dumps(result.constants, sort_keys=True),
        created_at=utcnow(),
    )
    return row if profiles.add_job_profile(row) else None


def _finite(x: float) -> float:
    return x if math.isfinite(x) else -1.0


def feedback_view(profiles: ProfileStore, job_id: str) -> dict[str, Any]:
    """The job's opt-in state and every fitted version (for the API and the dashboard)."""
    feedback = profiles.get_feedback(job_id)
    versions = [
        {
            "version": v.version,
            "from_step": v.from_step,
            "steps_used": v.steps_used,
            "median_abs_error_before": v.error_before,
            "median_abs_error_after": v.error_after,
            "constants": json.loads(v.body),
            "created_at": v.created_at.isoformat(),
        }
        for v in profiles.job_profiles(job_id)
    ]
    return {
        "job_id": job_id,
        "enabled": bool(feedback and feedback.enabled),
        "config": asdict(FeedbackConfig()) if feedback is None else json.loads(feedback.config),
        "versions": versions,
    }


def _lookup(profiles: ProfileStore, version: int | None = None) -> ProfileLookup:
    def lookup(name: str) -> Profile | None:
        stored = profiles.get_profile(name, version)
        if stored is None:
            return None
        return Profile.model_validate({**stored.body, "name": name, "version": stored.version})

    return lookup


def answered_profile_version(plans: PlanStore, request: PlanRequest) -> int | None:
    """The named profile's version an already-answered job step was planned with.

    A retry of that step must resolve ``profile_name`` as the first request did, even if the
    profile was replaced since: otherwise its digest changes and the retry becomes a 409
    instead of replaying the stored plan. The plan body names its profile (``Plan.profile``)."""
    if request.profile_name is None or request.profile is not None:
        return None
    if request.job_id is None or request.step is None:
        return None  # an anonymous key is the digest itself: a new version is a new plan
    stored = plans.get_key(PlanKey("named", plan_id_for(request, request.resolved_mode)))
    if stored is None:
        return None
    block = json.loads(stored.body).get("profile") or {}
    version = block.get("version")
    return version if block.get("name") == request.profile_name and version else None


def _resolve(
    profiles: ProfileStore, plans: PlanStore, request: PlanRequest
) -> tuple[PlanRequest, int | None]:
    lookup = _lookup(profiles, answered_profile_version(plans, request))
    return resolve_for_job(profiles, with_named_profile(request, lookup))


async def resolve_request(
    profiles: ProfileStore, db: Database, request: PlanRequest
) -> tuple[PlanRequest, int | None]:
    """The request as it will be planned: a named stored profile filled in (its newest
    version), then the job's fitted profile version when the job opted in (and that version)."""
    if request.profile_name is None and (request.job_id is None or request.step is None):
        return request, None
    digest = request_digest(request)
    try:
        # Time-bounded like every read.
        resolved = await db.call(_resolve, profiles, db.store, request)
    except DatabaseUnavailable:
        # A replay during an outage resolves as it did before, so it is answered from the plan
        # memory like any replay; a request never resolved here gets the 503.
        if digest not in profiles.resolved:
            raise
        remembered = profiles.resolved[digest]
        return (request, None) if remembered is None else remembered
    # Most requests resolve to themselves: remember only that (a few bytes, not the request),
    # else a busy service would hold thousands of requests' lengths here.
    profiles.resolved[digest] = None if resolved[0] is request else resolved
    return resolved


async def record_planned(
    profiles: ProfileStore, db: Database, request: PlanRequest, source: str, version: int | None
) -> None:
    """Remember a job step's request (what a refit re-prices) when it was first planned."""
    if request.job_id is None or request.step is None or source != "solved":
        return
    plan_id = plan_id_for(request, request.resolved_mode)
    try:
        await db.call(
            profiles.record_request,
            request.job_id,
            request.step,
            plan_id,
            request.model_dump_json(exclude={"deadline_ms"}),
            version,
        )
    except DatabaseUnavailable:
        # Logged once per outage by the database guard; a refit re-prices only recorded steps.
        logger.info(
            "step %s of job %r not recorded for refits: database unavailable",
            request.step,
            request.job_id,
        )
