"""Idempotent planning: one plan per key, solved once, stored once, replayed byte for byte.

Keys live in two namespaces (``api/storage.py``): a request with ``job_id`` and ``step`` is the
named key ``{job_id}-{step}``; any other is the anonymous key ``{mode}-{digest}``. The request
digest (SHA-256 of the validated request without ``deadline_ms``, first 16 hex digits) decides
whether a second request for a named key is a replay (same digest) or a conflict.
``deadline_ms`` is left out on purpose: ranks of one job may wait with different budgets, and
they must still get the same plan.

Single flight holds on two levels: within a process, requests for a key join one task; across
replicas, the task first claims the key in the database (``plan_claims``), and a replica that
finds it claimed waits for the plan to appear instead of solving it again.

Each claiming task owns its claim as ``{process}.{n}``. A claim of this process that no running
task holds is orphaned (its request gave up: the insert landed after the call's timeout, or the
release failed during an outage) and the next task for the key takes it over instead of waiting
it out; claims of other processes are respected until they expire.

Every answer comes within the request's budget plus one database timeout: each database call
is bounded by what is left of that (``api/database.py``). This module raises domain errors
(``api/errors.py``); ``api/problems.py`` maps them to HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from cachetools import LRUCache

from api.database import Database
from api.errors import IdempotencyConflict, RequestTooLarge, Saturated, SolveElsewhere
from api.metrics import ServiceMetrics
from api.solver_pool import Rejected, SolverPool
from api.storage import PlanKey, StoredPlan, key_of, utcnow
from solver.errors import PlanningError
from solver.plan_builder import plan_id_for, request_digest
from solver.schema import PlanRequest

Source = Literal["solved", "inflight", "memory", "database"]
POLL_FIRST_S = 0.01
POLL_MAX_S = 0.1
"""How often a replica waiting for another replica's solve looks for the plan."""


@dataclass(frozen=True)
class PlanAnswer:
    body: bytes
    source: Source


@dataclass(frozen=True)
class WorkLimits:
    """The largest request a solver worker is given (``RequestTooLarge`` beyond)."""

    max_samples: int
    max_samples_x_ranks: int
    max_ranks: int = 16_384
    """A plan carries split sizes for every rank of every parent: 262,144 ranks took 21 s and
    39 MB for one sample, past any deadline (the worker was killed on every retry)."""


@dataclass(frozen=True)
class _Budget:
    deadline_at: float
    """When the plan is due (monotonic); the solver's budget ends here."""
    answer_by: float
    """When the answer is due at the latest: the deadline plus one database timeout."""
    budget_ms: float


class PlanService:
    """Answers ``POST /v1/plans``: replay, join an in-flight solve, or solve and store."""

    def __init__(
        self,
        db: Database,
        pool: SolverPool,
        metrics: ServiceMetrics,
        cache_size: int,
        default_deadline_ms: int,
        work: WorkLimits,
    ) -> None:
        self.db = db
        self.pool = pool
        self.metrics = metrics
        self.cache: LRUCache[PlanKey, StoredPlan] | None = (
            LRUCache(cache_size) if cache_size else None
        )
        self.default_deadline_ms = default_deadline_ms
        self.work = work
        self.process = uuid.uuid4().hex
        """This process's name; its claims are owned by ``{process}.{n}``."""
        self._claim_numbers = itertools.count()
        self._live_claims: set[str] = set()
        """Owners of the claims that running tasks hold or are writing."""
        self._generation = db.store.generation
        """The database generation the plan memory holds plans of."""
        self._inflight: dict[PlanKey, asyncio.Task[tuple[StoredPlan, Source]]] = {}
        self._background: set[asyncio.Task[Any]] = set()

    def _orphaned(self, owner: str) -> bool:
        """Whether a claim's owner is this process with no running task behind it (read on a
        database thread: membership tests only)."""
        return owner.startswith(f"{self.process}.") and owner not in self._live_claims

    def _memory(self) -> LRUCache[PlanKey, StoredPlan] | None:
        """The plan memory, emptied first if the database became another one (an SQLite file
        replaced at its path): its plans are in no history any more."""
        generation = self.db.store.generation
        if generation != self._generation:
            self._generation = generation
            if self.cache is not None:
                self.cache.clear()
        return self.cache

    def _cached(self, key: PlanKey) -> StoredPlan | None:
        cache = self._memory()
        return None if cache is None else cache.get(key)

    def _remember(self, key: PlanKey, stored: StoredPlan) -> None:
        cache = self._memory()
        if cache is not None:
            cache[key] = stored

    def forget_job(self, job_id: str) -> None:
        """Drop a deleted job's plans from memory: its named keys and its anonymous plans
        (requests with its ``job_id`` and no step), which the delete removed too."""
        if self.cache is None:
            return
        for key in [k for k, stored in self.cache.items() if stored.job_id == job_id]:
            self.cache.pop(key, None)

    async def get(self, plan_id: str) -> bytes | None:
        """A stored plan by id (a named plan wins over an anonymous one with the same id)."""
        for kind in ("named", "anonymous"):
            cached = self._cached(PlanKey(kind, plan_id))
            if cached is not None:
                return cached.body
        stored = await self.db.get(plan_id)
        return None if stored is None else stored.body

    def check_size(self, request: PlanRequest) -> None:
        """Refuse work no deadline can serve before it reaches a worker."""
        samples, ranks = len(request.lengths), request.cluster.world_size
        if ranks > self.work.max_ranks:
            raise RequestTooLarge(
                "cluster",
                f"{request.cluster.nodes} nodes x {request.cluster.gpus_per_node} GPUs = {ranks} "
                f"ranks exceed the limit of {self.work.max_ranks} per request (REPACK_MAX_RANKS)",
            )
        if samples > self.work.max_samples:
            raise RequestTooLarge(
                "lengths",
                f"{samples} samples exceed the limit of {self.work.max_samples} per request "
                "(REPACK_MAX_SAMPLES)",
            )
        if samples * ranks > self.work.max_samples_x_ranks:
            raise RequestTooLarge(
                "lengths",
                f"{samples} samples x {ranks} ranks = {samples * ranks} exceed the limit of "
                f"{self.work.max_samples_x_ranks} (REPACK_MAX_SAMPLES_X_RANKS)",
            )

    async def plan(self, request: PlanRequest) -> PlanAnswer:
        """The plan for ``request``'s key; solves only if no plan exists or is being made."""
        started = time.monotonic()
        self.check_size(request)
        budget_ms = request.deadline_ms or self.default_deadline_ms
        deadline_at = started + budget_ms / 1e3
        budget = _Budget(deadline_at, deadline_at + self.db.timeout_s, budget_ms)
        key = key_of(request, plan_id_for(request, request.resolved_mode))
        digest = request_digest(request)
        stored = self._cached(key)
        if stored is not None:
            self.metrics.cache_hits.labels(source="memory").inc()
            answer = PlanAnswer(_check(stored, digest).body, "memory")
        else:
            answer = await self._shared(request, key, digest, budget)
        if (time.monotonic() - started) * 1e3 > budget_ms:
            self.metrics.late.inc()
        return answer

    async def _shared(
        self, request: PlanRequest, key: PlanKey, digest: str, budget: _Budget
    ) -> PlanAnswer:
        """Join the key's running task in this process, or start it."""
        task = self._inflight.get(key)
        joined = task is not None
        if task is None:
            task = asyncio.create_task(self._obtain(request, key, digest, budget))
            self._inflight[key] = task
            task.add_done_callback(lambda done: self._forget(key, done))
        else:
            self.metrics.cache_hits.labels(source="inflight").inc()
        try:
            stored, source = await asyncio.wait_for(
                asyncio.shield(task), budget.answer_by - time.monotonic()
            )
        except TimeoutError:
            raise SolveElsewhere(
                "the plan for this key is still being made; retry later", 1
            ) from None
        return PlanAnswer(_check(stored, digest).body, "inflight" if joined else source)

    def _forget(self, key: PlanKey, done: asyncio.Task[tuple[StoredPlan, Source]]) -> None:
        """Drop a finished task from the in-flight map. Its exception, if any, is marked as
        retrieved here: every waiter got it, and one whose client left must not log it again."""
        self._inflight.pop(key, None)
        if not done.cancelled():
            done.exception()

    async def _obtain(
        self, request: PlanRequest, key: PlanKey, digest: str, budget: _Budget
    ) -> tuple[StoredPlan, Source]:
        """The stored plan if there is one; else claim the key and solve it, or wait for the
        replica whose claim holds it (taking over if that claim expires)."""
        stored = await self.db.get_key(key, until=budget.answer_by)
        if stored is not None:
            self.metrics.cache_hits.labels(source="database").inc()
            self._remember(key, stored)
            return stored, "database"
        expires_at = utcnow() + timedelta(
            seconds=self.pool.hard_stop_s(budget.budget_ms) + 2 * self.db.timeout_s
        )
        owner = f"{self.process}.{next(self._claim_numbers)}"
        self._live_claims.add(owner)
        try:
            return await self._claim_and_solve(request, key, digest, budget, owner, expires_at)
        finally:  # from here a claim of ``owner`` left in the database is orphaned
            self._live_claims.discard(owner)

    async def _claim_and_solve(
        self,
        request: PlanRequest,
        key: PlanKey,
        digest: str,
        budget: _Budget,
        owner: str,
        expires_at: datetime,
    ) -> tuple[StoredPlan, Source]:
        """Claim the key as ``owner`` and solve it, or poll while another live claim holds it."""
        delay = POLL_FIRST_S
        while True:
            claimed = await self.db.claim(key, owner, expires_at, self._orphaned, budget.answer_by)
            if isinstance(claimed, StoredPlan):
                self.metrics.cache_hits.labels(source="database").inc()
                self._remember(key, claimed)
                return claimed, "database"
            if claimed:
                return await self._solve(request, key, digest, budget, owner), "solved"
            if time.monotonic() + delay > budget.deadline_at:
                raise SolveElsewhere(
                    "another replica is solving this key and did not finish within the "
                    "deadline; retry later",
                    1,
                )
            await asyncio.sleep(delay)
            delay = min(2 * delay, POLL_MAX_S)

    async def _solve(
        self, request: PlanRequest, key: PlanKey, digest: str, budget: _Budget, owner: str
    ) -> StoredPlan:
        """Solve in a worker and store the plan (dropping our claim); on any failure the
        claim is given back so that a retry, here or on another replica, may solve it."""
        try:
            try:
                solving = self.pool.submit(request, digest, budget.deadline_at, budget.budget_ms)
                self.metrics.queue.set(self.pool.pending)
                solved = await solving
            except Saturated as exc:  # at admission, or no worker took it before its deadline
                self.metrics.rejected.labels(reason=exc.reason).inc()
                raise
            finally:
                self.metrics.queue.set(self.pool.pending)
            if isinstance(solved, Rejected):
                raise PlanningError(solved.field, solved.message)
            row = solved.plan_row()
            body = row.body.encode()
            # Not bounded by the request's budget (its answer is, in ``_shared``): a plan
            # that came late is still stored, so that the retry replays it.
            stored = await self.db.insert(row, owner)
        except BaseException:
            self._in_background(self.db.release(key, owner))
            raise
        self._remember(key, stored)
        if stored.body == body:  # count plans this instance made, not lost races
            self.metrics.observe_plan(
                solved.status, solved.mode, solved.stopped_by, solved.gap, solved.speedup
            )
        return stored

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        """Best-effort clean-up that no request waits for (a failed release leaves an
        orphaned claim: a retry here takes it over, other replicas wait until it expires)."""

        async def quietly() -> None:
            with contextlib.suppress(Exception):  # already logged by the database guard
                await work

        task = asyncio.create_task(quietly())
        self._background.add(task)
        task.add_done_callback(self._background.discard)


def _check(stored: StoredPlan, digest: str) -> StoredPlan:
    if stored.request_digest != digest:
        raise IdempotencyConflict(
            f"plan {stored.plan_id} exists for a different request body; the key "
            "(job_id, step) may only be reused with the same body (deadline_ms aside)"
        )
    return stored
