"""Refits of one job take turns in a service process (``api.feedback.MaybeRefit``), over real
HTTP (uvicorn, SQLite): a burst of 30 measurements used to read the job's window of plans
once per post, all at once, and with both cores busy one read queued past the database
timeout, so 5-12 of the posts answered 503 (CI's own second test process was enough)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

import api.feedback as feedback
from tests.api.conftest import ServerFactory
from tests.api.test_db_faults_2026_12_07 import _measure_all, _measured_request


def test_a_burst_of_measurements_reads_refit_inputs_one_at_a_time(
    tmp_path: Path, start_server: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = start_server(f"sqlite:///{tmp_path / 'plans.db'}", solver_workers=1)
    job, steps = "turns", 30
    with httpx.Client(base_url=server.url, timeout=60) as c:
        opted = c.put(
            f"/v1/jobs/{job}/feedback",
            json={"enabled": True, "min_steps": 2, "refit_every": 1, "window": steps},
        )
        assert opted.status_code == 200, opted.text
        for s in range(steps):
            assert c.post("/v1/plans", json=_measured_request(job, s)).status_code == 200
    reading, most, lock = 0, 0, threading.Lock()
    real = feedback.refit_inputs

    def counted(*args: Any) -> Any:
        nonlocal reading, most
        with lock:
            reading += 1
            most = max(most, reading)
        try:
            return real(*args)
        finally:
            with lock:
                reading -= 1

    monkeypatch.setattr(feedback, "refit_inputs", counted)
    answers = asyncio.run(_measure_all(server.url, job, steps))
    assert [r.status_code for r in answers] == [201] * steps, [r.text for r in answers][:3]
    assert most == 1  # the same job's refits read their inputs one at a time
    with httpx.Client(base_url=server.url, timeout=30) as c:
        versions = c.get(f"/v1/jobs/{job}/feedback").json()["versions"]
    assert versions and versions[-1]["steps_used"] >= steps // 2, versions
