"""Idempotent planning: one plan per key, solved once, stored once, replayed byte for byte.

The key is the plan id the solver derives: ``{job_id}-{step}`` when both are given, else
``{mode}-{digest}`` of the request. The request digest (the solver's ``request_digest``:
SHA-256 of the validated request without ``deadline_ms``, first 16 hex digits) decides whether
a second request for a key is a replay (same digest) or a conflict (409). ``deadline_ms`` is
left out on purpose: ranks of one job may wait with different budgets, and they must still get
the same plan.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Literal

from starlette.concurrency import run_in_threadpool

from api.metrics import ServiceMetrics
from api.problems import ProblemError
from api.solver_pool import Rejected, Saturated, Solved, SolverPool
from api.storage import PlanStore, StoredPlan
from solver.errors import PlanningError
from solver.plan_builder import plan_id_for, request_digest
from solver.schema import PlanRequest

log = logging.getLogger("repack.service")

Source = Literal["solved", "inflight", "memory", "database"]


@dataclass(frozen=True)
class PlanAnswer:
    body: bytes
    source: Source


class PlanCache:
    """Bounded LRU of stored plans; safe because a stored plan never changes."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[str, StoredPlan] = OrderedDict()

    def get(self, plan_id: str) -> StoredPlan | None:
        item = self._items.get(plan_id)
        if item is not None:
            self._items.move_to_end(plan_id)
        return item

    def put(self, item: StoredPlan) -> None:
        if self.size == 0:
            return
        self._items[item.plan_id] = item
        self._items.move_to_end(item.plan_id)
        while len(self._items) > self.size:
            self._items.popitem(last=False)


class PlanService:
    """Answers ``POST /v1/plans``: replay, join an in-flight solve, or solve and store."""

    def __init__(
        self,
        store: PlanStore,
        pool: SolverPool,
        metrics: ServiceMetrics,
        cache_size: int,
        default_deadline_ms: int,
    ) -> None:
        self.store = store
        self.pool = pool
        self.metrics = metrics
        self.cache = PlanCache(cache_size)
        self.default_deadline_ms = default_deadline_ms
        self._inflight: dict[str, asyncio.Task[StoredPlan]] = {}

    async def get(self, plan_id: str) -> bytes | None:
        cached = self.cache.get(plan_id)
        if cached is None:
            cached = await run_in_threadpool(self.store.get, plan_id)
            if cached is not None:
                self.cache.put(cached)
        return None if cached is None else cached.body

    async def plan(self, request: PlanRequest) -> PlanAnswer:
        """The plan for ``request``'s key; solves only if no plan exists or is being made."""
        started = time.monotonic()
        budget_ms = request.deadline_ms or self.default_deadline_ms
        plan_id = plan_id_for(request, request.resolved_mode)
        digest = request_digest(request)
        answer = await self._existing(plan_id, digest)
        if answer is None:
            task = self._inflight.get(plan_id)
            if task is not None:
                self.metrics.cache_hits.labels(source="inflight").inc()
                stored = await asyncio.shield(task)
                answer = PlanAnswer(self._check(stored, digest).body, "inflight")
            else:
                answer = await self._lead(request, plan_id, digest, started + budget_ms / 1e3)
        if (time.monotonic() - started) * 1e3 > budget_ms:
            self.metrics.late.inc()
        return answer

    async def _existing(self, plan_id: str, digest: str) -> PlanAnswer | None:
        """The stored plan for this key, from memory or the database, if there is one."""
        source: Source = "memory"
        stored = self.cache.get(plan_id)
        if stored is None and plan_id not in self._inflight:
            source = "database"
            stored = await run_in_threadpool(self.store.get, plan_id)
            if stored is not None:
                self.cache.put(stored)
            else:  # a solve of this key may have finished while the database was read
                source, stored = "memory", self.cache.get(plan_id)
        if stored is None:
            return None
        self.metrics.cache_hits.labels(source=source).inc()
        return PlanAnswer(self._check(stored, digest).body, source)

    async def _lead(
        self, request: PlanRequest, plan_id: str, digest: str, deadline_at: float
    ) -> PlanAnswer:
        try:
            solving = self.pool.submit(request, digest, deadline_at)
        except Saturated as exc:
            self.metrics.rejected.labels(reason=exc.code).inc()
            log.warning(
                "plan rejected: %s",
                exc.reason,
                extra={
                    "job_id": request.job_id,
                    "step": request.step,
                    "status": 429,
                    "reason": exc.code,
                },
            )
            raise ProblemError(
                429,
                "saturated",
                f"{exc.reason}; retry later",
                headers={"Retry-After": str(exc.retry_after_s)},
            ) from exc
        self.metrics.queue.set(self.pool.pending)
        task = asyncio.create_task(self._finish(solving))
        self._inflight[plan_id] = task
        task.add_done_callback(lambda done: self._forget(plan_id, done))
        stored = await asyncio.shield(task)
        return PlanAnswer(self._check(stored, digest).body, "solved")

    def _forget(self, plan_id: str, done: asyncio.Task[StoredPlan]) -> None:
        """Drop a finished solve from the in-flight map. Its exception, if any, is marked as
        retrieved here: every waiter got it, and one whose client left must not log it again."""
        self._inflight.pop(plan_id, None)
        if not done.cancelled():
            done.exception()

    async def _finish(self, solving: asyncio.Future[Solved | Rejected]) -> StoredPlan:
        """Await the worker (which stored the plan) and publish the result."""
        try:
            solved = await solving
        except BrokenProcessPool as exc:
            raise ProblemError(
                503,
                "solver-unavailable",
                "a solver worker died; the pool was restarted",
                headers={"Retry-After": str(self.pool.retry_after_s)},
            ) from exc
        finally:
            self.metrics.queue.set(self.pool.pending)
        if isinstance(solved, Rejected):
            raise PlanningError(solved.field, solved.message)
        self.cache.put(solved.stored)
        if solved.fresh:  # count plans this instance made, not lost races
            self.metrics.observe_plan(
                solved.status, solved.mode, solved.stopped_by, solved.gap, solved.speedup
            )
        return solved.stored

    @staticmethod
    def _check(stored: StoredPlan, digest: str) -> StoredPlan:
        if stored.request_digest != digest:
            raise ProblemError(
                409,
                "idempotency-conflict",
                f"plan {stored.plan_id} exists for a different request body; the key "
                "(job_id, step) may only be reused with the same body (deadline_ms aside)",
            )
        return stored
