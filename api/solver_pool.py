"""Solving off the event loop: a process pool sized to the cores behind a bounded queue.

``plan()`` is CPU-bound Python, so threads would serialise on the GIL and slow the event loop;
worker processes solve in parallel. Workers are forked from a ``forkserver`` that imported the
solver once, so a fresh worker costs milliseconds, and the loop process never forks itself.
Workers only solve: the event loop's process stores the plan (``api/database.py``), so every
database wait is bounded in one place and a worker never holds a database connection.

Each worker is bounded: it dies with the service (parent-death watch), it may use at most
``memory_mb`` of address space (``RLIMIT_AS``), a solve running past its hard limit (a multiple
of its deadline) is killed by the kernel (``SIGALRM``, default action), and a worker is
replaced after ``max_tasks`` solves so that a slow leak cannot grow without bound.

A worker that dies, even idle, breaks the whole executor: the next submit or readiness probe
replaces it, and the pool is healthy only while its executor is unbroken and has answered.

A request admitted to wait for a worker was admitted on an estimate (the queue length times
the recent mean solve time) that a burst or a slower step can prove wrong. One that no worker
has taken by its deadline is refused then, as it would have been at admission, instead of being
solved late: still in the executor's queue, it is cancelled; already in the call queue (whence
the executor cannot take it back), the worker refuses it without solving.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import math
import multiprocessing
import os
import resource
import select
import signal
import sys
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from api.errors import RequestTooLarge, Saturated, SolverUnavailable
from api.storage import PlanRow, plan_row
from solver.errors import PlanningError
from solver.plan_builder import canonical_json
from solver.planner import plan
from solver.schema import PlanRequest

log = logging.getLogger("repack.solver_pool")

INITIAL_MEAN_S = 0.05
"""Assumed solve time (and admission-to-answer time) until the first solves are measured."""
WARMUP_REQUEST = PlanRequest(cluster={"nodes": 1}, lengths=[1024, 512])
"""A tiny step every worker solves at start, so the first real request finds it warm."""
PR_SET_PDEATHSIG = 1
"""prctl option: the signal a process gets when its parent dies (Linux)."""
ROW_COLUMNS = tuple(c.name for c in PlanRow.__table__.columns)


@dataclass(frozen=True)
class WorkerLimits:
    """What one worker may spend (0 = unlimited)."""

    memory_mb: int
    max_tasks: int
    hard_stop_factor: float
    """A solve is killed once it has run this many times its request's deadline..."""
    hard_stop_min_s: float
    """...but never sooner than this (a tiny deadline still allows the greedy plan)."""


@dataclass(frozen=True)
class Solved:
    """A worker's answer: the row to store and the quality of the plan made."""

    row: dict[str, Any]
    worker_s: float
    """Seconds the worker spent on this request."""
    mode: str
    status: str
    stopped_by: str | None
    gap: float | None
    speedup: float

    def plan_row(self) -> PlanRow:
        return PlanRow(**self.row)


@dataclass(frozen=True)
class Rejected:
    """The solver refused the request (``PlanningError``), carried as data: the exception's
    constructor takes two arguments, so it cannot cross the process boundary by pickling."""

    field: str
    message: str


@dataclass(frozen=True)
class Expired:
    """A worker reached a queued request only after its deadline and did not solve it."""


@dataclass
class _TakeBack:
    """Cancels a queued solve's job if no worker has taken it yet (the executor's queue)."""

    job: Future[Any]
    taken: bool = False

    def __call__(self) -> None:
        self.taken = self.job.cancel()


def _watch_parent(main_pid: int) -> None:
    """Exit as soon as ``main_pid`` (the service) is gone, whatever killed it.

    The worker's own parent is the forkserver, so ``PR_SET_PDEATHSIG`` alone would not notice
    the service dying; a pidfd becomes readable when the process exits (Linux >= 5.3), with a
    once-a-second poll as the fallback.
    """
    try:
        fd = os.pidfd_open(main_pid)
    except (AttributeError, OSError):
        fd = -1

    def watch() -> None:
        if fd >= 0:
            select.select([fd], [], [])
        else:
            while os.getppid() != 1:
                try:
                    os.kill(main_pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _die_with_parent() -> None:
    if sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _init_worker(main_pid: int, memory_mb: int) -> None:
    """Bound the worker (parent death, memory, hard stop) and move the imports out of the
    garbage collector's reach: ``plan()`` allocates enough to trigger full collections, and
    each would otherwise walk every object the imports of numpy, pydantic and OR-Tools left."""
    _die_with_parent()
    _watch_parent(main_pid)
    signal.signal(signal.SIGALRM, signal.SIG_DFL)  # the hard stop: the kernel ends the process
    if memory_mb > 0:
        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    gc.collect()
    gc.freeze()


def warm_worker() -> int:
    """Solve a tiny step (not stored) so the first real request finds the worker warm."""
    plan(WARMUP_REQUEST)
    return os.getpid()


def solve(
    request: PlanRequest,
    digest: str,
    deadline_at: float,
    margin_ms: float,
    min_budget_ms: float,
    hard_stop_s: float,
    start_by: float | None = None,
) -> Solved | Rejected | Expired:
    """Runs in a worker process: plan within what is left of the deadline.

    ``deadline_at`` is a ``time.monotonic()`` instant; the monotonic clock is system-wide on
    Linux, so the time the request spent queued counts against its budget. A request that
    waited for a worker (``start_by`` set) and is reached only after ``start_by`` is not
    solved.
    """
    start = time.monotonic()
    if start_by is not None and start > start_by:
        return Expired()
    signal.setitimer(signal.ITIMER_REAL, hard_stop_s)
    try:
        budget_ms = max(min_budget_ms, (deadline_at - start) * 1e3 - margin_ms)
        try:
            result = plan(request, deadline_ms=budget_ms)
        except PlanningError as exc:
            return Rejected(exc.field, exc.message)
        row = plan_row(request, digest, result, canonical_json(result))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    m = result.metrics
    return Solved(
        row={name: getattr(row, name) for name in ROW_COLUMNS},
        worker_s=time.monotonic() - start,
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
        limits: WorkerLimits,
    ) -> None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["solver.planner", "api.solver_pool"])
        self.workers = workers
        self.capacity = workers + queue_limit
        self.retry_after_s = retry_after_s
        self.margin_ms = margin_ms
        self.min_budget_ms = min_budget_ms
        self.limits = limits
        self.pending = 0
        self.replaced = 0
        """Times the pool was replaced after a worker died."""
        self._mean_latency_s = INITIAL_MEAN_S
        self._mean_service_s = INITIAL_MEAN_S
        self._ctx = ctx
        self._executor = self._new_executor()
        self._answered = False
        """A worker of this executor has answered (warm-up or solve) since it started."""
        self._warming: asyncio.Future[None] | None = None

    def _new_executor(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            max_workers=self.workers,
            mp_context=self._ctx,
            initializer=_init_worker,
            initargs=(os.getpid(), self.limits.memory_mb),
            max_tasks_per_child=self.limits.max_tasks or None,
        )

    def worker_pids(self) -> set[int]:
        return set(self._executor._processes or {})  # private, but the only way to see them

    @property
    def healthy(self) -> bool:
        """Workers of this executor have answered and none has died since: a worker that dies
        idle breaks the executor without failing any solve, so a flag set once would lie."""
        return self._answered and not self._broken()

    def _broken(self) -> bool:
        return bool(self._executor._broken)  # private, but the only way to tell without a job

    async def warm_up(self) -> None:
        """Start every worker by giving each a tiny solve; marks the pool healthy."""
        executor = self._executor
        loop = asyncio.get_running_loop()
        jobs = [loop.run_in_executor(executor, warm_worker) for _ in range(self.workers)]
        await asyncio.gather(*jobs)
        if executor is self._executor:  # not replaced meanwhile
            self._answered = True

    async def recover(self, timeout_s: float) -> bool:
        """Replace a broken pool and warm it up, waiting at most ``timeout_s``; whether healthy.

        For readiness probes: a pool broken while idle is otherwise replaced only by the next
        request, which an instance its failing probe took out of rotation would never get. A
        warm-up that outlasts the wait goes on, so that a later probe finds it done.
        """
        if self.healthy:
            return True
        self._replace_broken()
        if self._warming is None or self._warming.done():
            self._warming = asyncio.ensure_future(self.warm_up())
        try:
            await asyncio.wait_for(asyncio.shield(self._warming), timeout_s)
        except TimeoutError:
            pass  # still starting: not ready yet
        except Exception as exc:  # the new workers died too (BrokenProcessPool) or failed
            log.warning("the new solver workers did not start: %r", exc)
        return self.healthy

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

    def hard_stop_s(self, budget_ms: float) -> float:
        """How long a solve of a request with this budget may run before it is killed."""
        return max(self.limits.hard_stop_min_s, self.limits.hard_stop_factor * budget_ms / 1e3)

    def submit(
        self, request: PlanRequest, digest: str, deadline_at: float, budget_ms: float
    ) -> asyncio.Future[Solved | Rejected]:
        """Queue a solve, or raise ``Saturated`` when the queue is full or the expected wait
        for a worker would already use up the request's deadline (a fast 429 lets the client
        fall back at once instead of getting a late plan). The returned future raises the same
        ``Saturated`` if the request waited and no worker took it by then after all.

        Synchronous on purpose: admission and the slot it takes happen without yielding to the
        event loop, so a burst cannot over-admit.
        """
        if self.pending >= self.capacity:
            raise Saturated("the solver queue is full; retry later", self.retry_after())
        wait_s = self.expected_wait_s()
        start_by = deadline_at - self.margin_ms / 1e3
        if wait_s > 0 and time.monotonic() + wait_s > start_by:
            # A free worker always takes the request, however small its deadline.
            raise _too_late(self.retry_after())
        start = time.perf_counter()
        hard_stop_s = self.hard_stop_s(budget_ms)
        waits = wait_s > 0
        job = self._submit_job(
            solve,
            request,
            digest,
            deadline_at,
            self.margin_ms,
            self.min_budget_ms,
            hard_stop_s,
            start_by if waits else None,
        )
        self.pending += 1
        executor = self._executor
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Solved | Rejected | Expired] = asyncio.wrap_future(job, loop=loop)
        take_back = _TakeBack(job)
        if waits:  # still in the executor's queue at its deadline: taken back (429)
            timer = loop.call_later(start_by - time.monotonic(), take_back)
            future.add_done_callback(lambda _: timer.cancel())

        def _release(done: asyncio.Future[Solved | Rejected | Expired]) -> None:
            self.pending -= 1
            if done.cancelled():
                pass
            elif (error := done.exception()) is not None:
                if isinstance(error, BrokenProcessPool):
                    self._replace_broken()
            else:
                if executor is self._executor:  # a worker of the current executor answered
                    self._answered = True
                if isinstance(solved := done.result(), Solved):
                    self._mean_service_s = 0.9 * self._mean_service_s + 0.1 * solved.worker_s
            # A running mean of admission-to-answer time sizes Retry-After.
            self._mean_latency_s = 0.9 * self._mean_latency_s + 0.1 * (time.perf_counter() - start)

        future.add_done_callback(_release)
        return self._translated(future, take_back, time.monotonic(), hard_stop_s)

    def _submit_job(self, *job: Any) -> Future[Any]:
        """``executor.submit(*job)``; an executor that a worker dying idle broke refuses the job
        at once (``BrokenProcessPool``), so it is replaced, like after a death during a solve,
        and the job goes to the new one: the request is solved, not failed."""
        try:
            return self._executor.submit(*job)
        except BrokenProcessPool:
            self._replace_broken()
        return self._executor.submit(*job)  # a new executor is never broken yet

    def _translated(
        self,
        future: asyncio.Future[Solved | Rejected | Expired],
        take_back: _TakeBack,
        started: float,
        hard_stop_s: float,
    ) -> asyncio.Future[Solved | Rejected]:
        """``future`` with a dead worker, an exhausted memory limit and a request no worker
        took before its deadline as domain errors."""

        async def wait() -> Solved | Rejected:
            try:
                result = await future
            except asyncio.CancelledError:
                if not take_back.taken or _cancelling():
                    raise
                raise _too_late(self.retry_after()) from None  # taken back at its deadline
            except BrokenProcessPool:
                if time.monotonic() - started >= hard_stop_s * 0.95:
                    raise SolverUnavailable(
                        f"the solve ran past its hard limit ({hard_stop_s:.1f} s); its worker "
                        "was stopped and replaced",
                        self.retry_after_s,
                    ) from None
                raise SolverUnavailable(
                    "a solver worker died; the pool was restarted", self.retry_after_s
                ) from None
            except MemoryError:
                raise RequestTooLarge(
                    "lengths",
                    f"the step needs more than the {self.limits.memory_mb} MB a solver worker "
                    "may use (REPACK_WORKER_MEMORY_MB); send fewer samples or raise the limit",
                ) from None
            if isinstance(result, Expired):
                raise _too_late(self.retry_after())
            return result

        return asyncio.ensure_future(wait())

    def _replace_broken(self) -> None:
        """A worker died (killed, out of memory, hard stop): fail its solves, start afresh."""
        if self._broken():
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = self._new_executor()
            self._answered = False  # healthy again once a new worker answers
            self.replaced += 1
            log.error("a solver worker died; the worker pool was replaced")

    def close(self) -> None:
        self._answered = False
        self._executor.shutdown(wait=True, cancel_futures=True)


def _too_late(retry_after_s: int) -> Saturated:
    return Saturated(
        "no solver could start before the deadline; retry later", retry_after_s, "deadline"
    )


def _cancelling() -> bool:
    """Whether the running task itself is being cancelled (not just the future it awaits)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
