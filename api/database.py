"""The event loop's door to the database: every call runs on a bounded thread pool and is
abandoned after a timeout, so a database that refuses, stalls or resets costs a request at most
its timeout and becomes ``DatabaseUnavailable`` (503 + Retry-After at the HTTP edge).

A stalled call keeps its thread until the server answers, the statement timeout fires or the
kernel's keepalive gives up; the pool has as many threads as the engine has connections, so
stalled calls never multiply, and a call waiting for a thread times out like any other.
Failures are logged once per outage (the first, then one line when the database is back).

During an outage (from a failed call to the next successful one) only one call at a time goes
to the database, as a probe; the others fail at once instead of each waiting out the timeout,
so that clients fall back quickly and stalled threads do not pile up.

The timeout measures the database, so a call must not compute: work that reads, computes and
writes (a refit, ``api/feedback.py``) is a ``StagedWork``, whose database steps are calls of
their own and whose computation runs off the database threads, outside every timeout.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any, Generic, TypeVar

from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from api.errors import DatabaseUnavailable
from api.storage import (
    POOL_CONNECTIONS,
    DbTimeouts,
    JobSummary,
    PlanKey,
    PlanRow,
    PlanStore,
    StoredPlan,
)

log = logging.getLogger("api.database")
T = TypeVar("T")
MIN_CALL_S = 0.01
"""A call with less time than this left is not started (it could not finish in time)."""


def describe(exc: BaseException) -> str:
    """One line naming the failure (for the log, never for a client)."""
    orig = getattr(exc, "orig", None) or exc
    first = (str(orig).strip().splitlines() or [""])[0]
    return f"{type(orig).__name__}: {first}" if first else type(orig).__name__


def masked_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (or a placeholder if it cannot be parsed,
    since it may still hold one)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ValueError:
        return "(an unparseable URL)"


def open_store(url: str, timeouts: DbTimeouts) -> PlanStore:
    """A store on ``url`` with its schema migrated to the newest revision; one clear
    ``DatabaseUnavailable`` line (no traceback) when that fails."""
    try:
        store = PlanStore(url, timeouts)
    except (SQLAlchemyError, ValueError, ImportError) as exc:
        raise DatabaseUnavailable(
            f"invalid database URL {masked_url(url)}: {describe(exc)}"
        ) from None
    try:
        store.migrate()
    except (SQLAlchemyError, OSError) as exc:
        store.close()
        raise DatabaseUnavailable(
            f"cannot open the database at {masked_url(url)}: {describe(exc)}"
        ) from None
    return store


class StagedWork(Generic[T]):
    """Work that mixes database steps with computation. Called directly it runs all of it,
    blocking; given to ``Database.call`` it runs as ``staged(db, *args)``: each database step
    is a time-bounded ``db.call`` of its own, and the computation between them is not charged
    to the database (nor run on its threads)."""

    def __call__(self, *args: Any) -> T:
        raise NotImplementedError

    async def staged(self, db: Database, *args: Any) -> T:
        raise NotImplementedError


class Database:
    """Async, time-bounded calls to a ``PlanStore``."""

    def __init__(self, store: PlanStore, timeout_s: float, retry_after_s: int = 1) -> None:
        self.store = store
        self.timeout_s = timeout_s
        self.retry_after_s = retry_after_s
        self._executor = ThreadPoolExecutor(POOL_CONNECTIONS, thread_name_prefix="db")
        self._failing_since: float | None = None
        self._failures = 0
        self._probing = False

    async def call(self, fn: Callable[..., T], *args: object, until: float | None = None) -> T:
        """``fn(*args)`` on the database thread pool, within ``timeout_s`` and before the
        monotonic instant ``until`` if given (a ``StagedWork``: its database steps each are)."""
        if isinstance(fn, StagedWork):
            result: T = await fn.staged(self, *args)
            return result
        timeout = self.timeout_s
        if until is not None:
            timeout = min(timeout, until - time.monotonic())
        if timeout < MIN_CALL_S:  # the request is out of time, not the database
            raise DatabaseUnavailable("no time left for the database; retry later", 1)
        probe = self._failing_since is not None
        if probe:
            if self._probing:  # during an outage one call at a time finds out if it is over
                raise self._failed("still failing")
            self._probing = True
        loop = asyncio.get_running_loop()
        try:
            result = await asyncio.wait_for(
                loop.run_in_executor(self._executor, fn, *args), timeout
            )
        except TimeoutError:
            raise self._failed(f"no answer within {timeout * 1e3:.0f} ms") from None
        except (SQLAlchemyError, OSError) as exc:
            raise self._failed(describe(exc)) from None
        finally:
            if probe:
                self._probing = False
        if self._failing_since is not None:
            log.warning(
                "database answers again after %.1f s (%d failed calls)",
                time.monotonic() - self._failing_since,
                self._failures,
            )
            self._failing_since, self._failures = None, 0
        return result

    def _failed(self, reason: str) -> DatabaseUnavailable:
        self._failures += 1
        if self._failing_since is None:
            self._failing_since = time.monotonic()
            log.warning(
                "database unavailable: %s; answering 503 until it recovers "
                "(further failures are counted, not logged)",
                reason,
            )
        return DatabaseUnavailable("database unavailable; retry later", self.retry_after_s)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self.store.close()

    # The store's methods, time-bounded.

    async def ping(self, timeout_s: float) -> None:
        await self.call(self.store.ping, until=time.monotonic() + timeout_s)

    async def get(self, plan_id: str) -> StoredPlan | None:
        return await self.call(self.store.get, plan_id)

    async def get_key(self, key: PlanKey, until: float | None = None) -> StoredPlan | None:
        return await self.call(self.store.get_key, key, until=until)

    async def get_row(self, plan_id: str) -> PlanRow | None:
        return await self.call(self.store.get_row, plan_id)

    async def claim(
        self,
        key: PlanKey,
        owner: str,
        expires_at: datetime,
        orphaned: Callable[[str], bool],
        until: float,
    ) -> StoredPlan | bool:
        return await self.call(self.store.claim, key, owner, expires_at, orphaned, until=until)

    async def release(self, key: PlanKey, owner: str) -> None:
        await self.call(self.store.release, key, owner)

    async def insert(self, row: PlanRow, owner: str) -> StoredPlan:
        return await self.call(self.store.insert, row, owner)

    async def delete_job(self, job_id: str) -> int:
        return await self.call(self.store.delete_job, job_id)

    async def delete_older_than(self, cutoff: datetime) -> int:
        return await self.call(self.store.delete_older_than, cutoff)

    async def list_jobs(self, after: str | None, limit: int) -> list[JobSummary]:
        return await self.call(self.store.list_jobs, after, limit)

    async def has_job(self, job_id: str) -> bool:
        return await self.call(self.store.has_job, job_id)

    async def list_steps(self, job_id: str, after: int | None, limit: int) -> Sequence[PlanRow]:
        return await self.call(self.store.list_steps, job_id, after, limit)
