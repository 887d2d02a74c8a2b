"""Solving off the event loop: a process pool sized to the cores behind a bounded queue.

``plan()`` is CPU-bound Python, so threads would serialise on the GIL and slow the event loop;
worker processes solve in parallel. Workers are forked from a ``forkserver`` that imported the
solver once, so a fresh worker costs milliseconds, and the loop process never forks itself.
A worker also stores the plan it made (its own database connections), so a new plan costs the
event loop's process no serialisation and no database write.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

from api.storage import PlanStore, StoredPlan, plan_row
from solver.errors import PlanningError
from solver.plan_builder import canonical_json
from solver.planner import plan
from solver.schema import PlanRequest

log = logging.getLogger("repack.solver_pool")

INITIAL_MEAN_S = 0.05
"""Assumed solve time (and admission-to-answer time) until the first solves are measured."""
WARMUP_REQUEST = PlanRequest(cluster={"nodes": 1}, lengths=[1024, 512])
"""A tiny step every worker solves at start, so the first real request finds it warm."""


_store: PlanStore | None = None
"""The worker process's own repository (set by ``_init_worker``)."""


@dataclass(frozen=True)
class Solved:
    """A worker's answer: what is stored for the key now, and the quality of the plan made."""

    stored: StoredPlan
    worker_s: float
    """Seconds the worker spent on this request (solve and store)."""
    fresh: bool
    """True when this solve's plan is the stored one (False: another writer was first)."""
    mode: str
    status: str
    stopped_by: str | None
    gap: float | None
    speedup: float


@dataclass(frozen=True)
class Rejected:
    """The solver refused the request (``PlanningError``), carried as data: the exception's
    constructor takes two arguments, so it cannot cross the process boundary by pickling."""

    field: str
    message: str


class Saturated(Exception):
    """The request cannot be solved now (``reason``); ``retry_after_s`` says when to retry."""

    def __init__(self, reason: str, retry_after_s: int, code: str = "queue_full") -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = retry_after_s
        self.code = code
        """Metric label and log field: queue_full or deadline."""


def _init_worker(database_url: str) -> None:
    """Open the worker's database and move the imports out of the garbage collector's reach.

    ``plan()`` allocates enough to trigger full collections, and each one would otherwise walk
    every object the imports of numpy, pydantic and OR-Tools left behind.
    """
    global _store
    _store = PlanStore(database_url)
    gc.collect()
    gc.freeze()


def warm_worker() -> None:
    """Solve a tiny step (not stored) so the first real request finds the worker warm."""
    plan(WARMUP_REQUEST)


def solve_and_store(
    request: PlanRequest,
    digest: str,
    deadline_at: float,
    margin_ms: float,
    min_budget_ms: float,
) -> Solved | Rejected:
    """Runs in a worker process: plan within what is left of the deadline, then store it.

    ``deadline_at`` is a ``time.monotonic()`` instant; the monotonic clock is system-wide on
    Linux, so the time the request spent queued counts against its budget. The insert is
    first-writer-wins, so the answer is whatever the key holds afterwards.
    """
    start = time.monotonic()
    budget_ms = max(min_budget_ms, (deadline_at - start) * 1e3 - margin_ms)
    try:
        result = plan(request, deadline_ms=budget_ms)
    except PlanningError as exc:
        return Rejected(exc.field, exc.message)
    body = canonical_json(result)
    assert _store is not None, "worker started without _init_worker"
    stored = _store.insert(plan_row(request, digest, result, body))
    m = result.metrics
    return Solved(
        stored=stored,
        worker_s=time.monotonic() - start,
        fresh=stored.body == body.encode(),
        mode=result.mode,
        status=result.status,
        stopped_by=m.stopped_by,
        gap=m.gap,
        speedup=m.speedup,
    )


class SolverPool:
    """A bounded pool: ``workers`` solve, ``queue_limit`` more may wait, the rest are refused."""

    def __init__(
        self,
        workers: int,
        queue_limit: int,
        retry_after_s: int,
        margin_ms: float,
        min_budget_ms: float,
        database_url: str,
    ) -> None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["solver.planner", "api.solver_pool"])
        self.workers = workers
        self.capacity = workers + queue_limit
        self.retry_after_s = retry_after_s
        self.margin_ms = margin_ms
        self.min_budget_ms = min_budget_ms
        self.database_url = database_url
        self.pending = 0
        self.healthy = False
        self._mean_latency_s = INITIAL_MEAN_S
        self._mean_service_s = INITIAL_MEAN_S
        self._ctx = ctx
        self._executor = self._new_executor()

    def _new_executor(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            max_workers=self.workers,
            mp_context=self._ctx,
            initializer=_init_worker,
            initargs=(self.database_url,),
        )

    async def warm_up(self) -> None:
        """Start every worker by giving each a tiny solve; marks the pool healthy."""
        loop = asyncio.get_running_loop()
        jobs = [loop.run_in_executor(self._executor, warm_worker) for _ in range(self.workers)]
        await asyncio.gather(*jobs)
        self.healthy = True

    def retry_after(self) -> int:
        """Seconds to wait before retrying: the recent mean time from admission to answer.

        A slot frees sooner than that (whenever any solve ends), so this errs on the side of
        patience, which is what a saturated service needs from its clients.
        """
        return max(self.retry_after_s, math.ceil(self._mean_latency_s))

    def expected_wait_s(self) -> float:
        """How long a solve submitted now would wait for a worker (0 when one is free)."""
        ahead = self.pending - self.workers + 1
        return max(0, ahead) * self._mean_service_s / self.workers

    def submit(
        self, request: PlanRequest, digest: str, deadline_at: float
    ) -> asyncio.Future[Solved | Rejected]:
        """Queue a solve (stored by the worker), or raise ``Saturated`` when the queue is full
        or the expected wait for a worker would already use up the request's deadline (a fast
        429 lets the client fall back at once instead of getting a late plan).

        Synchronous on purpose: admission and the slot it takes happen without yielding to the
        event loop, so a burst cannot over-admit.
        """
        if self.pending >= self.capacity:
            raise Saturated("the solver queue is full", self.retry_after())
        wait_s = self.expected_wait_s()
        if wait_s > 0 and time.monotonic() + wait_s > deadline_at - self.margin_ms / 1e3:
            # A free worker always takes the request, however small its deadline.
            raise Saturated(
                "no solver could start before the deadline", self.retry_after(), "deadline"
            )
        self.pending += 1
        start = time.perf_counter()
        future = asyncio.get_running_loop().run_in_executor(
            self._executor,
            solve_and_store,
            request,
            digest,
            deadline_at,
            self.margin_ms,
            self.min_budget_ms,
        )

        def _release(done: asyncio.Future[Solved | Rejected]) -> None:
            self.pending -= 1
            if done.cancelled():
                pass
            elif (error := done.exception()) is not None:
                if isinstance(error, BrokenProcessPool):
                    self._replace_broken()
            elif isinstance(solved := done.result(), Solved):
                self._mean_service_s = 0.9 * self._mean_service_s + 0.1 * solved.worker_s
            # A running mean of admission-to-answer time sizes Retry-After.
            self._mean_latency_s = 0.9 * self._mean_latency_s + 0.1 * (time.perf_counter() - start)

        future.add_done_callback(_release)
        return future

    def _replace_broken(self) -> None:
        """A worker died (killed, out of memory): fail its solves, start a fresh pool."""
        if self._executor._broken:  # private, but the only way to tell without submitting
            log.error("a solver worker died; replacing the worker pool")
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = self._new_executor()

    def close(self) -> None:
        self.healthy = False
        self._executor.shutdown(wait=True, cancel_futures=True)
