"""The database guard on its own: timeouts, errors as ``DatabaseUnavailable``, one probe at a
time during an outage, and one log line per outage (real SQLite store, real threads)."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError

from api.database import Database
from api.errors import DatabaseUnavailable
from api.storage import PlanStore


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    store = PlanStore(f"sqlite:///{tmp_path / 'plans.db'}")
    store.migrate()
    guard = Database(store, timeout_s=0.2)
    yield guard
    guard.close()


def broken() -> None:
    raise OperationalError("SELECT 1", {}, Exception("connection refused"))


def test_a_hung_call_is_abandoned_at_the_timeout(db: Database) -> None:
    release = threading.Event()

    async def scenario() -> None:
        with pytest.raises(DatabaseUnavailable) as caught:
            await db.call(release.wait, 30)
        assert caught.value.retry_after_s == 1
        # The outage's probe is done: the next call goes through and ends the outage.
        release.set()
        assert await db.list_jobs(None, 10) == []

    asyncio.run(scenario())


def test_one_probe_at_a_time_during_an_outage(db: Database) -> None:
    release = threading.Event()
    calls: list[int] = []

    def slow_probe() -> None:
        calls.append(1)
        release.wait(5)

    async def scenario() -> None:
        with pytest.raises(DatabaseUnavailable):
            await db.call(broken)
        probe = asyncio.ensure_future(db.call(slow_probe))
        await asyncio.sleep(0.05)  # the probe is running
        with pytest.raises(DatabaseUnavailable):
            await db.call(calls.append, 2)  # refused at once, never reaches the database
        release.set()
        await probe
        await db.call(calls.append, 3)

    asyncio.run(scenario())
    assert calls == [1, 3]


def test_an_outage_is_logged_once(db: Database, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        for _ in range(5):
            with pytest.raises(DatabaseUnavailable):
                await db.call(broken)
        await db.ping(1.0)

    with caplog.at_level(logging.WARNING, logger="api.database"):
        asyncio.run(scenario())
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert lines[0].startswith("database unavailable: Exception: connection refused")
    assert "answers again" in lines[1]
    assert "(5 failed calls)" in lines[1]
