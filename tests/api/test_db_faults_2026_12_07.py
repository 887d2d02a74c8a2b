"""Storage faults found by the hostile-input hunt of 2026-12-07, over real HTTP (uvicorn) on real
databases (SQLite files, PostgreSQL schemas):

* concurrent ``PUT /v1/profiles/{name}`` with different constants: every one is stored as its
  own version (consecutive, none lost), never a 500;
* concurrent measurements of a job opted into refits: the refit's CPU work is not counted
  against the database timeout, so a healthy database is never reported unavailable;
* ``DELETE /v1/jobs/{job}`` forgets the job's anonymous plans too: a re-POST solves and stores
  the plan again instead of answering it from memory without a row in the history;
* an SQLite file unlinked (or replaced) under a running service is a database fault (503,
  ``/readyz`` not ready) until a database file is at its path again, which is then migrated
  and used: a plan answered 200 is in the history, also after a restart.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import sqlite3
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from api.server import ServerThread
from tests.api.conftest import ServerFactory, small_request

PUTS = 20
ROUNDS = 3


async def _put_all(base_url: str, name: str) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=PUTS)
    async with httpx.AsyncClient(base_url=base_url, timeout=60, limits=limits) as c:
        return await asyncio.gather(
            *[c.put(f"/v1/profiles/{name}", json={"peak_tflops": 100.0 + i}) for i in range(PUTS)]
        )


def test_concurrent_profile_puts_each_get_their_own_version(server: ServerThread) -> None:
    """20 PUTs at once with different constants, three times: no 500; the versions handed out
    are unique and consecutive; each version reads back the constants that were put for it."""
    for round_ in range(ROUNDS):
        name = f"race-{round_}"
        answers = asyncio.run(_put_all(server.url, name))
        statuses = Counter(r.status_code for r in answers)
        assert set(statuses) <= {201, 503}, (statuses, [r.text for r in answers])
        for r in answers:
            if r.status_code == 503:  # contended past the bound: retry later, never a 500
                assert r.headers["content-type"] == "application/problem+json"
                assert int(r.headers["retry-after"]) >= 1
        stored = {r.json()["version"]: r.json() for r in answers if r.status_code == 201}
        assert sorted(stored) == list(range(1, len(stored) + 1)), statuses
        assert statuses[201] == PUTS, statuses  # on a healthy database every one gets through
        with httpx.Client(base_url=server.url, timeout=30) as c:
            newest = c.get(f"/v1/profiles/{name}")
            assert newest.status_code == 200 and newest.json() == stored[len(stored)]
            for version, body in stored.items():
                got = c.get(f"/v1/profiles/{name}", params={"version": version})
                assert got.json() == body


def _measured_request(job: str, step: int) -> dict[str, Any]:
    return {
        "job_id": job,
        "step": step,
        "cluster": {"nodes": 2},
        "lengths": [1000 + 7 * step, 2000, 3000, 40_000 + 11 * step, 700],
    }


async def _measure_all(base_url: str, job: str, steps: int) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=steps)
    async with httpx.AsyncClient(base_url=base_url, timeout=60, limits=limits) as c:
        return await asyncio.gather(
            *[
                c.post(
                    f"/v1/jobs/{job}/steps/{s}/measurements",
                    json={"step_time_ms": 50.0 + 3 * s, "all_to_all_ms": 5.0 + 0.1 * s},
                )
                for s in range(steps)
            ]
        )


def test_concurrent_refits_do_not_look_like_a_database_outage(
    db_url: str, start_server: ServerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """30 measurements at once for a job that refits on every one (window 30): every post is
    stored (201), none is a 503, and the database guard never logs an outage."""
    server = start_server(db_url, solver_workers=1)
    job, steps = "refit-burst", 30
    with httpx.Client(base_url=server.url, timeout=60) as c:
        opted = c.put(
            f"/v1/jobs/{job}/feedback",
            json={"enabled": True, "min_steps": 2, "refit_every": 1, "window": steps},
        )
        assert opted.status_code == 200, opted.text
        for s in range(steps):
            r = c.post("/v1/plans", json=_measured_request(job, s))
            assert r.status_code == 200, r.text
        time.sleep(0.3)  # each step's request is recorded just after its answer
    with caplog.at_level(logging.WARNING, logger="api.database"):
        answers = asyncio.run(_measure_all(server.url, job, steps))
    statuses = Counter(r.status_code for r in answers)
    assert statuses == {201: steps}, (statuses, [r.text for r in answers if r.status_code > 201])
    outage = [r.getMessage() for r in caplog.records if r.name == "api.database"]
    assert outage == [], outage
    with httpx.Client(base_url=server.url, timeout=30) as c:
        assert c.get("/readyz").status_code == 200
        versions = c.get(f"/v1/jobs/{job}/feedback").json()["versions"]
        assert [v["version"] for v in versions] == list(range(1, len(versions) + 1))
        assert versions, "no refit stored"
        fitted = [r.json()["profile_version"] for r in answers]
        assert {v for v in fitted if v is not None} <= {v["version"] for v in versions}
        # a burst ends on a version fitted from most of its steps (the refits that lost to
        # an earlier one read their inputs again; before, the newest used 2-11 of 30)
        assert versions[-1]["steps_used"] >= steps // 2, versions
        later = c.post("/v1/plans", json=_measured_request(job, steps))
        assert later.status_code == 200
        assert later.headers["x-repack-job-profile-version"] == str(versions[-1]["version"])


def _rows(db_url: str, plan_id: str) -> list[str]:
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT kind FROM plans WHERE plan_id = :p"), {"p": plan_id}
            ).all()
    finally:
        engine.dispose()
    return [r[0] for r in rows]


def test_deleting_a_job_forgets_its_anonymous_plans(db_url: str, client: httpx.Client) -> None:
    """The hunt's sequence (delcache.py): a job's anonymous plan (job_id, no step) and a named
    one, DELETE the job, then neither is served from memory, and a re-POST of the anonymous
    request is solved and stored again (a 200 plan is in the history)."""
    anon = {"job_id": "delme", "cluster": {"nodes": 2}, "lengths": [11, 22, 33]}
    first = client.post("/v1/plans", json=anon)
    assert first.status_code == 200, first.text
    plan_id = first.json()["plan_id"]
    assert client.post("/v1/plans", json={**anon, "step": 0}).status_code == 200
    assert client.get(f"/v1/plans/{plan_id}").status_code == 200  # cached now
    assert _rows(db_url, plan_id) == ["anonymous"]

    assert client.delete("/v1/jobs/delme").status_code == 204
    assert _rows(db_url, plan_id) == []
    gone = client.get(f"/v1/plans/{plan_id}")
    assert gone.status_code == 404, gone.headers.get("x-repack-plan-source")
    assert client.get("/v1/plans/delme-0").status_code == 404
    assert client.get("/v1/jobs/delme/steps").status_code == 404

    again = client.post("/v1/plans", json=anon)
    assert again.status_code == 200
    assert again.headers["x-repack-plan-source"] == "solved"
    assert again.json()["plan_id"] == plan_id
    assert _rows(db_url, plan_id) == ["anonymous"]
    assert client.get(f"/v1/plans/{plan_id}").status_code == 200


# --- an SQLite file unlinked or replaced under a running service --------------------------------

SQLITE_FILES = ("", "-wal", "-shm")


def _unlink_database(path: Path) -> None:
    for suffix in SQLITE_FILES:
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def _wait_ready(c: httpx.Client, within_s: float = 10.0) -> httpx.Response:
    deadline = time.monotonic() + within_s
    while True:
        r = c.get("/readyz")
        if r.status_code == 200 or time.monotonic() > deadline:
            return r
        time.sleep(0.1)


def _post(c: httpx.Client, job: str, step: int) -> httpx.Response:
    return c.post("/v1/plans", json=small_request(job, step))


def _assert_fault(c: httpx.Client, job: str, step: int) -> None:
    """While the path names no database: plans, listings and readiness answer 503."""
    for _ in range(3):  # the first call finds the fault, the next ones are answered at once
        r = _post(c, job, step)
        assert r.status_code == 503, (r.status_code, r.text[:200])
        assert r.headers["content-type"] == "application/problem+json"
        assert r.json()["type"].endswith("database-unavailable")
        assert int(r.headers["retry-after"]) >= 1
    time.sleep(0.1)  # let the outage's probe finish
    for _ in range(20):  # one probe each: every pooled connection meets the fault
        ready = c.get("/readyz")
        assert ready.status_code == 503, ready.text
        assert int(ready.headers["retry-after"]) >= 1
    assert c.get("/v1/jobs").status_code == 503


def _history(db_path: Path, start_server: ServerFactory, job: str) -> list[int]:
    """The job's stored steps as a freshly started server on the same file reports them."""
    fresh = start_server(f"sqlite:///{db_path}", solver_workers=1)
    try:
        with httpx.Client(base_url=fresh.url, timeout=30) as c:
            r = c.get(f"/v1/jobs/{job}/steps")
            return [] if r.status_code == 404 else [s["step"] for s in r.json()["items"]]
    finally:
        fresh.stop()


def test_unlinked_sqlite_file_answers_503_until_a_backup_is_restored(
    tmp_path: Path, start_server: ServerFactory
) -> None:
    """The hunt's unlink.py, then the operator's fix: the database and its -wal and -shm are
    removed while the service runs; every write is a 503 (no plan answered 200 unless stored),
    /readyz is not ready, and the service creates no file of its own; once a backup is put back
    the service uses it without a restart, and every plan it answered 200 is in the history."""
    db_path = tmp_path / "data" / "repack.db"
    server = start_server(f"sqlite:///{db_path}", solver_workers=1)
    job = "unlinked"
    answered: set[int] = set()
    with httpx.Client(base_url=server.url, timeout=30) as c:
        for step in (0, 1):
            assert _post(c, job, step).status_code == 200
            answered.add(step)
        backup = tmp_path / "backup.db"
        with sqlite3.connect(db_path) as src, sqlite3.connect(backup) as dst:
            src.backup(dst)

        _unlink_database(db_path)
        _assert_fault(c, job, 2)
        assert sorted(os.listdir(db_path.parent)) == []  # no empty database made behind our back

        staged = tmp_path / "data" / "restore.tmp"
        shutil.copyfile(backup, staged)
        staged.replace(db_path)
        assert _wait_ready(c).status_code == 200
        for step in (2, 3):
            r = _post(c, job, step)
            assert r.status_code == 200, r.text
            assert r.headers["x-repack-plan-source"] == "solved"
            answered.add(step)
        assert _post(c, job, 0).status_code == 200  # from the restored history
        steps = c.get(f"/v1/jobs/{job}/steps").json()["items"]
        assert [s["step"] for s in steps] == [0, 1, 2, 3]
    server.stop()
    assert set(_history(db_path, start_server, job)) == answered


def test_unlinked_sqlite_file_recovers_on_an_empty_file_and_forgets_the_old_plans(
    tmp_path: Path, start_server: ServerFactory
) -> None:
    """No backup: the operator creates an empty file at the path (``touch``). The service
    migrates it and starts a new history; plans of the lost file are not replayed from memory
    (they are in no history any more), they are solved and stored again."""
    db_path = tmp_path / "repack.db"
    server = start_server(f"sqlite:///{db_path}", solver_workers=1)
    job = "recreated"
    with httpx.Client(base_url=server.url, timeout=30) as c:
        first = _post(c, job, 0)
        assert first.status_code == 200
        assert _post(c, job, 0).headers["x-repack-plan-source"] == "memory"
        _unlink_database(db_path)
        _assert_fault(c, job, 1)

        db_path.touch()
        assert _wait_ready(c).status_code == 200
        again = _post(c, job, 0)
        assert again.status_code == 200
        assert again.headers["x-repack-plan-source"] == "solved"
        assert again.json()["plan_id"] == first.json()["plan_id"]  # stored anew
        assert _post(c, job, 1).status_code == 200
    server.stop()
    assert _history(db_path, start_server, job) == [0, 1]


def test_sqlite_file_replaced_by_another_database_is_used_after_migrating_it(
    tmp_path: Path, start_server: ServerFactory
) -> None:
    """The file is replaced in one step (its -wal and -shm removed, another database renamed
    over it): the service notices on its next call, migrates the new file and uses it; no
    write lands in the replaced file."""
    db_path = tmp_path / "repack.db"
    server = start_server(f"sqlite:///{db_path}", solver_workers=1)
    with httpx.Client(base_url=server.url, timeout=30) as c:
        assert _post(c, "old", 0).status_code == 200
        other = tmp_path / "other.db"
        sqlite3.connect(other).close()  # an empty SQLite database, no schema yet
        for suffix in SQLITE_FILES[1:]:
            Path(f"{db_path}{suffix}").unlink(missing_ok=True)
        other.replace(db_path)
        r = _post(c, "new", 0)
        if r.status_code == 503:  # the call that noticed may be the one that pays for it
            assert _wait_ready(c).status_code == 200
            r = _post(c, "new", 0)
        assert r.status_code == 200, r.text
        for step in range(1, 6):
            assert _post(c, "new", step).status_code == 200
        assert c.get("/readyz").status_code == 200
        for _ in range(5):  # whichever pooled connection answers
            assert c.get("/v1/jobs/old/steps").status_code == 404
            steps = c.get("/v1/jobs/new/steps").json()["items"]
            assert [s["step"] for s in steps] == list(range(6))
    server.stop()
    assert _history(db_path, start_server, "new") == list(range(6))


def test_a_refit_after_the_largest_step_is_stored(db_url: str, start_server: ServerFactory) -> None:
    """Steps up to 2^63-1 are accepted; a refit after the last one set its first step to 2^63,
    past the database's int64: a 500 on SQLite, a 503 and an outage on PostgreSQL (a re-check
    hunt, 2026-12-07). The version now applies from the largest step."""
    server = start_server(db_url, solver_workers=1)
    job, last = "last-steps", 2**63 - 1
    with httpx.Client(base_url=server.url, timeout=60) as c:
        opted = c.put(
            f"/v1/jobs/{job}/feedback", json={"enabled": True, "min_steps": 2, "refit_every": 1}
        )
        assert opted.status_code == 200, opted.text
        for i, s in enumerate((last - 1, last)):
            body = {**_measured_request(job, i), "step": s}
            assert c.post("/v1/plans", json=body).status_code == 200
        time.sleep(0.3)  # each step's request is recorded just after its answer
        for i, s in enumerate((last - 1, last)):
            r = c.post(
                f"/v1/jobs/{job}/steps/{s}/measurements",
                json={"step_time_ms": 50.0 + 9 * i, "all_to_all_ms": 5.0 + i},
            )
            assert r.status_code == 201, r.text
        versions = c.get(f"/v1/jobs/{job}/feedback").json()["versions"]
        assert [v["from_step"] for v in versions] == [last]
        assert c.get("/readyz").status_code == 200
