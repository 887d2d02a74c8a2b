"""Solving off the event loop: a process pool sized to the cores behind a bounded queue.

``plan()`` is CPU-bound Python, so threads would serialise on the GIL and slow the event loop;
worker processes solve in parallel. Workers are forked from a ``forkserver`` that imported the
solver once, so a fresh worker costs milliseconds, and the loop process never forks itself.
"""

from __future__ import annotations

import asyncio
import gc
import math
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

from solver.errors import PlanningError
from solver.plan_builder import canonical_json
from solver.planner import plan
from solver.schema import PlanRequest

WARMUP_REQUEST = PlanRequest(cluster={"nodes": 1}, lengths=[1024, 512])
"""A tiny step every worker solves at start, so the first real request finds it warm."""


@dataclass(frozen=True)
class Solved:
    """A worker's answer: the canonical plan bytes plus the fields the service indexes."""

    body: bytes
    plan_id: str
    mode: str
    status: str
    stopped_by: str | None
    metrics: dict[str, float | None]


@dataclass(frozen=True)
class Rejected:
    """The solver refused the request (``PlanningError``), carried as data: the exception's
    constructor takes two arguments, so it cannot cross the process boundary by pickling."""

    field: str
    message: str


class Saturated(Exception):
    """The queue is full; ``retry_after_s`` estimates when a slot frees up."""

    def __init__(self, retry_after_s: int) -> None:
        super().__init__(f"solver queue full, retry after {retry_after_s} s")
        self.retry_after_s = retry_after_s


def _init_worker() -> None:
    """Move the imported modules' objects out of the garbage collector's reach.

    ``plan()`` allocates enough to trigger full collections, and each one would otherwise walk
    every object the imports of numpy, pydantic and OR-Tools left behind.
    """
    gc.collect()
    gc.freeze()


def solve_in_worker(
    request: PlanRequest, deadline_at: float, margin_ms: float, min_budget_ms: float
) -> Solved | Rejected:
    """Runs in a worker process: plan within what is left of the deadline.

    ``deadline_at`` is a ``time.monotonic()`` instant; the monotonic clock is system-wide on
    Linux, so the time the request spent queued counts against its budget.
    """
    budget_ms = max(min_budget_ms, (deadline_at - time.monotonic()) * 1e3 - margin_ms)
    try:
        result = plan(request, deadline_ms=budget_ms)
    except PlanningError as exc:
        return Rejected(exc.field, exc.message)
    metrics = result.metrics.model_dump(exclude={"stopped_by"})
    return Solved(
        body=canonical_json(result).encode(),
        plan_id=result.plan_id,
        mode=result.mode,
        status=result.status,
        stopped_by=result.metrics.stopped_by,
        metrics=metrics,
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
    ) -> None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["solver.planner", "api.solver_pool"])
        self.workers = workers
        self.capacity = workers + queue_limit
        self.retry_after_s = retry_after_s
        self.margin_ms = margin_ms
        self.min_budget_ms = min_budget_ms
        self.pending = 0
        self.healthy = False
        self._mean_latency_s = 0.05
        self._ctx = ctx
        self._executor = self._new_executor()

    def _new_executor(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            max_workers=self.workers, mp_context=self._ctx, initializer=_init_worker
        )

    async def warm_up(self) -> None:
        """Start every worker by giving each a tiny solve; marks the pool healthy."""
        loop = asyncio.get_running_loop()
        deadline_at = time.monotonic() + 60
        jobs = [
            loop.run_in_executor(
                self._executor, solve_in_worker, WARMUP_REQUEST, deadline_at, 0.0, 1.0
            )
            for _ in range(self.workers)
        ]
        await asyncio.gather(*jobs)
        self.healthy = True

    def retry_after(self) -> int:
        """Seconds to wait before retrying: the recent mean time from admission to answer.

        A slot frees sooner than that (whenever any solve ends), so this errs on the side of
        patience, which is what a saturated service needs from its clients.
        """
        return max(self.retry_after_s, math.ceil(self._mean_latency_s))

    def submit(self, request: PlanRequest, deadline_at: float) -> asyncio.Future[Solved | Rejected]:
        """Queue a solve, or raise ``Saturated`` at once when the queue is full.

        Synchronous on purpose: admission and the slot it takes happen without yielding to the
        event loop, so a burst cannot over-admit.
        """
        if self.pending >= self.capacity:
            raise Saturated(self.retry_after())
        self.pending += 1
        start = time.perf_counter()
        future = asyncio.get_running_loop().run_in_executor(
            self._executor,
            solve_in_worker,
            request,
            deadline_at,
            self.margin_ms,
            self.min_budget_ms,
        )

        def _release(done: asyncio.Future[Solved | Rejected]) -> None:
            self.pending -= 1
            if not done.cancelled() and isinstance(done.exception(), BrokenProcessPool):
                self._replace_broken()
            # A running mean of admission-to-answer time sizes Retry-After.
            self._mean_latency_s = 0.9 * self._mean_latency_s + 0.1 * (time.perf_counter() - start)

        future.add_done_callback(_release)
        return future

    def _replace_broken(self) -> None:
        """A worker died (killed, out of memory): fail its solves, start a fresh pool."""
        if self._executor._broken:  # private, but the only way to tell without submitting
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = self._new_executor()

    def close(self) -> None:
        self.healthy = False
        self._executor.shutdown(wait=True, cancel_futures=True)
