"""Cross-replica single flight: two real ``uvicorn`` processes on one PostgreSQL schema, every
key posted to both at once; each key is solved exactly once and answered identically."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import event

from api.server import free_port
from api.storage import PlanKey, PlanRow, PlanStore, utcnow
from tests.api.conftest import ServerFactory, _postgres_schema, metric_value, small_request

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

KEYS = 12


@pytest.fixture
def pg_url(postgres_url: str) -> Iterator[str]:
    yield from _postgres_schema(postgres_url)


def start_replica(url: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {
        **os.environ,
        "REPACK_DATABASE_URL": url,
        "REPACK_SOLVER_WORKERS": "1",
        "REPACK_DB_TIMEOUT_MS": "2000",  # this test is about claims, not a loaded machine
    }
    cmd = [sys.executable, "-m", "uvicorn", "--factory", "api.main:create_app",
           "--port", str(port), "--log-level", "warning"]  # fmt: skip
    return subprocess.Popen(cmd, env=env), f"http://127.0.0.1:{port}"


def wait_ready(base: str) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{base} never became ready")


@pytest.fixture
def replicas(pg_url: str) -> Iterator[list[str]]:
    started = [start_replica(pg_url) for _ in range(2)]
    try:
        for _, base in started:
            wait_ready(base)
        yield [base for _, base in started]
    finally:
        for proc, _ in started:
            proc.send_signal(signal.SIGTERM)
        for proc, _ in started:
            proc.wait(30)


def step_body(step: int) -> dict[str, Any]:
    lengths = [4000 + 37 * ((step * 7 + i) % 50) for i in range(120)]
    return {"job_id": "shared", "step": step, "cluster": {"nodes": 4}, "lengths": lengths,
            "deadline_ms": 3000}  # fmt: skip


def test_each_key_is_solved_once_across_two_replicas(replicas: list[str]) -> None:
    barrier = threading.Barrier(2)

    def post(args: tuple[int, str]) -> tuple[int, httpx.Response]:
        step, base = args
        with httpx.Client(base_url=base, timeout=60) as c:
            barrier.wait()
            return step, c.post("/v1/plans", json=step_body(step))

    answers: dict[int, list[httpx.Response]] = {}
    with ThreadPoolExecutor(2) as pool:
        for step in range(KEYS):
            for s, r in pool.map(post, [(step, base) for base in replicas]):
                answers.setdefault(s, []).append(r)
    for step, pair in answers.items():
        assert [r.status_code for r in pair] == [200, 200], [r.text for r in pair]
        assert pair[0].content == pair[1].content
        sources = sorted(r.headers["x-repack-plan-source"] for r in pair)
        assert sources == ["database", "solved"], (step, sources, [r.elapsed for r in pair])
    solved = sum(
        metric_value(httpx.get(f"{base}/metrics").text, "repack_plans_total") for base in replicas
    )
    assert solved == KEYS


def test_an_expired_claim_is_taken_over(pg_url: str) -> None:
    store = PlanStore(pg_url)
    store.migrate()
    key = PlanKey("named", "j-1")
    assert store.claim(key, "a", utcnow() + timedelta(seconds=30)) is True
    assert store.claim(key, "b", utcnow() + timedelta(seconds=30)) is False
    store.release(key, "a")
    assert store.claim(key, "b", utcnow() - timedelta(seconds=1)) is True  # already expired
    assert store.claim(key, "c", utcnow() + timedelta(seconds=30)) is True
    store.close()


def test_a_plan_stored_while_we_claim_is_found(pg_url: str) -> None:
    """The race that solved keys twice: replica A stores its plan (deleting its claim) just
    before replica B's claim is written; B must answer A's plan, not win the key."""
    a, b = PlanStore(pg_url), PlanStore(pg_url)
    a.migrate()
    key = PlanKey("named", "race-0")
    expires = utcnow() + timedelta(seconds=30)
    assert a.claim(key, "a", expires) is True
    fired: list[bool] = []

    @event.listens_for(b.engine, "before_cursor_execute")
    def a_finishes_first(*args: Any) -> None:
        statement: str = args[2]
        if statement.startswith("INSERT INTO plan_claims") and not fired:
            fired.append(True)
            a.insert(stored_plan_row("race-0"), owner="a")

    claimed = b.claim(key, "b", expires)
    assert fired
    assert not isinstance(claimed, bool), "B won a key whose plan exists"
    assert claimed.plan_id == "race-0"
    assert b.claim(key, "c", expires) == claimed  # and B left no claim behind
    a.close()
    b.close()


def test_a_live_claim_of_another_replica_is_waited_for(
    pg_url: str, start_server: ServerFactory
) -> None:
    """A claim is taken over only by the process that wrote it (when none of its requests holds
    it): one held by another replica still makes this one wait for its plan."""
    server = start_server(pg_url, solver_workers=1)
    other = PlanStore(pg_url)
    key = PlanKey("named", "held-0")
    assert other.claim(key, "elsewhere.0", utcnow() + timedelta(seconds=30)) is True
    request = small_request("held", 0, deadline_ms=300)
    with httpx.Client(base_url=server.url, timeout=30) as c:
        waited = c.post("/v1/plans", json=request)
        assert waited.status_code == 503, waited.text
        assert waited.json()["type"].endswith(":plan-in-progress")
        assert other.get_key(key) is None
        assert metric_value(c.get("/metrics").text, "repack_plans_total") == 0
        assert other.claim(key, "elsewhere.1", utcnow() + timedelta(seconds=30)) is False
        other.release(key, "elsewhere.0")  # that replica gives up: this one may solve now
        solved = c.post("/v1/plans", json=request)
        assert solved.status_code == 200, solved.text
        assert solved.headers["x-repack-plan-source"] == "solved"
    other.close()


def stored_plan_row(plan_id: str) -> PlanRow:
    job, step = plan_id.rsplit("-", 1)
    return PlanRow(
        kind="named", plan_id=plan_id, job_id=job, step=int(step), request_digest="d",
        mode="repack", status="optimal", stopped_by="optimal", nodes=1, gpus_per_node=8,
        num_samples=2, step_time_ms=1.0, baseline_step_time_ms=1.0, speedup=1.0, mfu=0.5,
        baseline_mfu=0.5, gap=0.0, lower_bound_ms=1.0, solve_ms=1.0, lengths="[1,2]",
        body="{}", created_at=utcnow(),
    )  # fmt: skip
