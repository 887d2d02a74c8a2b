"""The closed loop in the service: measured steps -> refitted job profile -> next plans.

Opt-in per job (``PUT /v1/jobs/{job}/feedback``). After each new measurement of an opted-in job,
once ``min_steps`` are measured and every ``refit_every`` steps after, the latest ``window``
measured steps are re-priced with their stored requests and plans and the job's constants are
refitted (``solver.profile_feedback``, bounded change). Each fit is a new version that applies
from the step after the last one already planned: a step that was planned keeps the profile it
was planned with, so a retried request replays its plan instead of conflicting with it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from cachetools import LRUCache

from api.database import Database, StagedWork
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


@dataclass(frozen=True)
class RefitInputs:
    """What a due refit reads from the database, as stored (parsed off the database threads)."""

    config: FeedbackConfig
    version: int
    """The version this refit would store (the newest + 1)."""
    last_body: str | None
    """The newest fitted version's constants (JSON), if any."""
    base_profile: str | None
    count: int
    """Measured steps of the job when the inputs were read."""
    steps: list[tuple[str, bytes, str]]
    """Per measured step with a stored request and plan: request JSON, plan body, measurement
    JSON, oldest first."""


@dataclass(frozen=True)
class Fitted:
    constants: dict[str, float]
    error_before: float
    error_after: float


def refit_inputs(profiles: ProfileStore, plans: PlanStore, job_id: str) -> RefitInputs | None:
    """The database step before a refit: the inputs if the job opted in and a refit is due."""
    feedback = profiles.get_feedback(job_id)
    if feedback is None or not feedback.enabled:
        return None
    config = config_of(feedback.config)
    versions = profiles.job_profiles(job_id)
    last = versions[-1] if versions else None
    count = profiles.count_measurements(job_id)
    if not refit_due(count, 0 if last is None else last.steps_used, config):
        return None
    rows = profiles.latest_measurements(job_id, config.window)
    requests = profiles.step_requests(job_id, [r.step for r in rows])
    stored = plans.get_many([r.plan_id for r in requests.values()])
    steps = []
    for m in rows:
        req_row = requests.get(m.step)
        if req_row is None:
            continue  # measured without a plan from this service: nothing to re-price
        plan = stored.get(req_row.plan_id)
        if plan is None:
            continue
        steps.append((req_row.request, plan.body, m.body))
    if len(steps) < config.min_steps:
        return None
    return RefitInputs(
        config,
        1 if last is None else last.version + 1,
        None if last is None else last.body,
        feedback.base_profile,
        count,
        steps,
    )


def _observations(inputs: RefitInputs) -> list[Observation]:
    out = []
    for request, plan, measurement in inputs.steps:
        measured = StepMeasurement.model_validate_json(measurement)
        a2a = None if measured.all_to_all_ms is None else measured.all_to_all_ms / 1e3
        out.append(
            Observation(
                PlanRequest.model_validate_json(request),
                Plan.model_validate_json(plan),
                measured.step_time_ms / 1e3,
                a2a,
            )
        )
    return out


def fit(job_id: str, inputs: RefitInputs) -> Fitted | None:
    """The computation of a refit (no database): re-price the steps and refit the constants;
    None when the fit fails (logged)."""
    obs = _observations(inputs)
    # Versions stored before a constant joined the refit (``layer_overhead_us``) lack it: the
    # request's profile fills what they do not say.
    current = constants_of(obs[-1].request)
    if inputs.last_body is not None:
        current.update(json.loads(inputs.last_body))
    elif inputs.base_profile is not None:
        current.update(json.loads(inputs.base_profile))
    try:
        result = refit(obs, current, inputs.config)
    except (CalibrationFitError, ValueError) as exc:
        logger.warning("job %s: refit skipped: %s", job_id, exc)
        return None
    return Fitted(
        result.constants,
        _finite(result.median_abs_error_before),
        _finite(result.median_abs_error_after),
    )


def store_refit(
    profiles: ProfileStore, job_id: str, inputs: RefitInputs, fitted: Fitted
) -> JobProfileRow | None:
    """The database step after a refit: store it as ``inputs.version``, applying from the step
    after the last one planned; None when another refit stored that version first."""
    planned = profiles.max_planned_step(job_id)
    row = JobProfileRow(
        job_id=job_id,
        version=inputs.version,
        # the step after the last one planned, but no step beyond int64 exists to plan
        from_step=0 if planned is None else min(planned + 1, MAX_STEP),
        steps_used=inputs.count,
        error_before=fitted.error_before,
        error_after=fitted.error_after,
        body=json.dumps(fitted.constants, sort_keys=True),
        created_at=utcnow(),
    )
    return row if profiles.add_job_profile(row) else None


MAX_STEP = 2**63 - 1
"""The largest step (the database's int64)."""
FIT_THREADS = 1
"""Refits computing at once (per process): each is pure CPU, so more would only slow the
event loop and the database threads down (one GIL)."""
REFIT_ATTEMPTS = 3
"""Reads of a refit's inputs when refits of the same version win first (then it gives up)."""
STORED_MEMO = 1024
"""Jobs whose newest stored refit this process remembers (to skip fits that would lose)."""


class MaybeRefit(StagedWork[JobProfileRow | None]):
    """Refit the job's profile if it opted in and a refit is due; the new version or None.

    Through ``Database.call`` (the measurements route) it runs in three steps: read the inputs
    (one database call), fit on a refit thread (no database, no database timeout), store the
    version (another call). A refit whose version number another refit of this process has
    stored meanwhile is not computed (it would lose at the store).

    Refits of one job take turns in a process (``_turns``): a burst of measurements otherwise
    read the job's window of plans once per post, all at once, and on a busy machine (two
    cores taken by other work, or CI's other test process) one read queued past the database
    timeout put the service in outage mode, so 5-12 of 30 posts answered 503. Taking turns,
    a later refit finds the earlier one's version and is no longer due (a light read)."""

    def __init__(self) -> None:
        self._executor: ThreadPoolExecutor | None = None
        self._stored: LRUCache[tuple[str, int, str], int] = LRUCache(STORED_MEMO)
        """The newest version this process stored, by database (URL and generation) and job."""
        self._turns: dict[tuple[int, tuple[str, int, str]], tuple[asyncio.Lock, int]] = {}
        """Per event loop and job: the lock refits wait on and how many hold or wait for it
        (the entry goes when none does)."""

    def __call__(
        self, profiles: ProfileStore, plans: PlanStore, job_id: str
    ) -> JobProfileRow | None:
        inputs = refit_inputs(profiles, plans, job_id)
        fitted = None if inputs is None else fit(job_id, inputs)
        if inputs is None or fitted is None:
            return None
        return store_refit(profiles, job_id, inputs, fitted)

    async def staged(
        self, db: Database, profiles: ProfileStore, plans: PlanStore, job_id: str
    ) -> JobProfileRow | None:
        memo = (plans.url, plans.generation, job_id)
        key = (id(asyncio.get_running_loop()), memo)  # a lock belongs to one event loop
        lock, users = self._turns.get(key, (asyncio.Lock(), 0))
        self._turns[key] = (lock, users + 1)
        try:
            async with lock:
                return await self._refit(db, profiles, plans, memo)
        finally:
            lock, users = self._turns[key]
            if users == 1:
                del self._turns[key]
            else:
                self._turns[key] = (lock, users - 1)

    async def _refit(
        self, db: Database, profiles: ProfileStore, plans: PlanStore, memo: tuple[str, int, str]
    ) -> JobProfileRow | None:
        job_id = memo[2]
        if self._executor is None:
            self._executor = ThreadPoolExecutor(FIT_THREADS, thread_name_prefix="refit")
        loop = asyncio.get_running_loop()
        # A refit that another one stored first read its inputs before that one's steps were
        # all in: read them again (a next version may be due, from more steps), a few times,
        # so that a burst of measurements ends on a version fitted from most of them.
        for _ in range(REFIT_ATTEMPTS):
            inputs = await db.call(refit_inputs, profiles, plans, job_id)
            if inputs is None:
                return None
            if self._lost(memo, inputs):
                continue
            fitted = await loop.run_in_executor(self._executor, self._fit, memo, inputs)
            if fitted is None:
                if self._lost(memo, inputs):  # lost while it waited for the refit thread
                    continue
                return None  # the fit itself found nothing to change
            row = await db.call(store_refit, profiles, job_id, inputs, fitted)
            if row is not None:
                self._stored[memo] = max(row.version, self._stored.get(memo, 0))
                return row
        return None

    def _lost(self, memo: tuple[str, int, str], inputs: RefitInputs) -> bool:
        return self._stored.get(memo, 0) >= inputs.version

    def _fit(self, memo: tuple[str, int, str], inputs: RefitInputs) -> Fitted | None:
        if self._lost(memo, inputs):  # checked again: it may have waited for the thread
            return None
        return fit(memo[2], inputs)


maybe_refit = MaybeRefit()
"""``await db.call(maybe_refit, profiles, db.store, job_id)``, or ``maybe_refit(profiles,
plans, job_id)`` blocking."""


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
