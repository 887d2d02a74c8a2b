"""A solver worker killed while idle (OOM killer, an operator, a crash between solves) breaks
the pool without failing any solve: the next request replaces it and is solved, /readyz never
calls the solver ok while it is broken, and a probe alone brings a broken pool back."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

import httpx
import pytest
from fastapi import FastAPI

from api.server import ServerThread
from api.solver_pool import SolverPool
from tests.api.conftest import ServerFactory, small_request

pytestmark = pytest.mark.slow

SETTLE_S = 30.0
"""How long a worker's death, or a replacement pool's start, may take to show (a loaded
2-core machine: a new worker re-imports the main script before it can solve)."""


def gone(pid: int) -> bool:
    """The process has exited (reaped, or a zombie its parent has not reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + SETTLE_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {SETTLE_S:.0f} s: {what}"
        time.sleep(0.05)


def pool_of(server: ServerThread) -> SolverPool:
    pool: SolverPool = cast(FastAPI, server.server.config.app).state.service.pool
    return pool


def kill_idle_workers(pool: SolverPool) -> set[int]:
    """SIGKILL every worker between solves and wait until the pool has noticed."""
    pids = pool.worker_pids()
    assert pids, "the pool has no worker to kill"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: all(gone(pid) for pid in pids), "the killed workers exit")
    wait_until(lambda: not pool.healthy, "the pool stops calling itself healthy")
    return pids


def assert_problem_503(r: httpx.Response, slug: str) -> None:
    assert r.status_code == 503, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["type"] == f"urn:repack:problem:{slug}"
    assert int(r.headers["retry-after"]) >= 1


def wait_ready(c: httpx.Client) -> None:
    """Probe until ready; every answer before that is a 503 problem with Retry-After."""

    def ready() -> bool:
        r = c.get("/readyz")
        if r.status_code == 200:
            assert r.json() == {"status": "ready", "database": "ok", "solver": "ok"}
            return True
        assert_problem_503(r, "not-ready")
        return False

    wait_until(ready, "/readyz answers ready")


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'plans.db'}"


@contextlib.contextmanager
def main_script_broken(tmp_path: Path) -> Iterator[None]:
    """New workers cannot start: the main script each re-imports no longer imports (as after
    an in-place upgrade that broke it). Workers already running are not affected."""
    script = tmp_path / "upgraded_main.py"
    script.write_text('raise ImportError("the code on disk changed under the service")\n')
    main = sys.modules["__main__"]
    with pytest.MonkeyPatch.context() as m:
        m.setattr(main, "__spec__", None, raising=False)  # `python -m pytest`: by path too
        m.setattr(main, "__file__", str(script), raising=False)
        yield


def test_a_worker_killed_while_idle_is_replaced_by_the_next_request(
    sqlite_url: str, start_server: ServerFactory
) -> None:
    server = start_server(sqlite_url, solver_workers=2)
    pool = pool_of(server)
    with httpx.Client(base_url=server.url, timeout=60) as c:
        assert c.post("/v1/plans", json=small_request("idle", 0)).status_code == 200
        killed = kill_idle_workers(pool)
        for step in (1, 2):  # solved on a new pool, not refused, never a 500
            r = c.post("/v1/plans", json=small_request("idle", step))
            assert r.status_code == 200, r.text
            assert r.json()["step"] == step
        assert pool.replaced == 1
        assert not pool.worker_pids() & killed
        assert pool.healthy
        wait_ready(c)


def test_readiness_replaces_a_pool_broken_while_idle(
    sqlite_url: str, start_server: ServerFactory
) -> None:
    """No request need come: an instance a failing probe takes out of rotation gets none."""
    server = start_server(sqlite_url, solver_workers=1)
    pool = pool_of(server)
    with httpx.Client(base_url=server.url, timeout=60) as c:
        assert c.post("/v1/plans", json=small_request("probe", 0)).status_code == 200
        killed = kill_idle_workers(pool)
        wait_ready(c)
        assert pool.replaced == 1
        assert pool.worker_pids() and not pool.worker_pids() & killed
        assert c.post("/v1/plans", json=small_request("probe", 1)).status_code == 200


def test_while_no_replacement_can_start_503_and_not_ready(
    sqlite_url: str, start_server: ServerFactory, tmp_path: Path
) -> None:
    server = start_server(sqlite_url, solver_workers=1)
    pool = pool_of(server)
    with httpx.Client(base_url=server.url, timeout=60) as c:
        assert c.post("/v1/plans", json=small_request("stuck", 0)).status_code == 200
        with main_script_broken(tmp_path):
            kill_idle_workers(pool)
            for _ in range(2):
                assert_problem_503(c.get("/readyz"), "not-ready")
                r = c.post("/v1/plans", json=small_request("stuck", 1))
                assert_problem_503(r, "solver-unavailable")
                assert not pool.healthy
        wait_ready(c)  # the main script imports again: a probe's new pool starts
        assert c.post("/v1/plans", json=small_request("stuck", 1)).status_code == 200
