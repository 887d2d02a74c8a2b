"""Logs and metrics an operator relies on: one structured line per plan with the request id,
429/503 logged, solve-time and queue-wait histograms, process metrics, JSON log lines."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from api.logging_setup import build_handler
from api.plan_log import plan_fields
from tests.api.conftest import ServerFactory, metric_value, small_request
from tests.api.test_concurrency import LONG_STEP, solve_in_background


def plan_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "repack.plans"]


def test_one_log_line_per_plan_with_request_id_source_and_timings(
    client: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="repack.plans")
    request_id = uuid.uuid4().hex
    body = small_request("obs", 3)
    first = client.post("/v1/plans", json=body, headers={"X-Request-ID": request_id})
    assert first.status_code == 200
    assert first.headers["x-request-id"] == request_id
    client.post("/v1/plans", json=body)
    solved, replayed = plan_records(caplog)
    assert solved.__dict__["request_id"] == request_id
    assert replayed.__dict__["request_id"] not in (request_id, None)
    plan = first.json()
    for record, source in ((solved, "solved"), (replayed, "cached")):
        fields = record.__dict__
        assert (fields["job_id"], fields["step"], fields["plan_id"]) == ("obs", 3, plan["plan_id"])
        assert fields["source"] == source
        assert fields["status"] == plan["status"]
        assert fields["solve_ms"] == plan["metrics"]["solve_ms"]
    assert solved.__dict__["queue_wait_ms"] >= 0
    assert replayed.__dict__["queue_wait_ms"] == 0


def test_histograms_process_metrics_and_reason_labels(client: httpx.Client) -> None:
    for step in range(3):
        assert client.post("/v1/plans", json=small_request("hist", step)).status_code == 200
    client.post("/v1/plans", json=small_request("hist", 0))  # a replay is not a solve
    text = client.get("/metrics").text
    assert metric_value(text, "repack_solve_seconds_count") == 3
    assert metric_value(text, "repack_queue_wait_seconds_count") == 3
    assert metric_value(text, "repack_solve_seconds_sum") > 0
    assert metric_value(text, "process_resident_memory_bytes") > 10_000_000
    assert metric_value(text, "process_open_fds") > 0
    assert "python_gc_objects_collected_total" in text
    assert "# HELP repack_rejected_total" in text


def test_saturation_is_counted_by_reason_and_logged(
    db_url: str, start_server: ServerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """One worker, no queue: concurrent new keys beyond the first are refused with a reason."""
    server = start_server(db_url, solver_workers=1, queue_limit=0)
    caplog.set_level(logging.WARNING)
    big = {"cluster": {"nodes": 8}, "lengths": [4000 + i for i in range(300)], "deadline_ms": 400}
    with (
        httpx.Client(base_url=server.url, timeout=60) as c,
        ThreadPoolExecutor(6) as pool,
    ):
        codes = list(
            pool.map(
                lambda i: c.post("/v1/plans", json={**big, "job_id": "sat", "step": i}).status_code,
                range(6),
            )
        )
        text = c.get("/metrics").text
    refused = codes.count(429)
    assert refused >= 1 and codes.count(200) >= 1
    counted = metric_value(text, "repack_rejected_total", reason="queue_full") + metric_value(
        text, "repack_rejected_total", reason="deadline"
    )
    assert counted == refused
    logged = [r for r in caplog.records if r.__dict__.get("status") == 429]
    assert len(logged) == refused
    assert {r.__dict__["reason"] for r in logged} <= {"queue_full", "deadline"}


def test_json_log_lines_carry_extra_fields() -> None:
    stream = io.StringIO()
    logger = logging.getLogger("repack.test-json")
    logger.propagate = False
    logger.addHandler(build_handler(stream, "json"))
    logger.setLevel(logging.INFO)
    logger.info("plan answered", extra={"job_id": "j", "step": 1, "source": "solved"})
    line = json.loads(stream.getvalue())
    assert line["message"] == "plan answered"
    assert line["level"] == "INFO" and line["logger"] == "repack.test-json"
    assert (line["job_id"], line["step"], line["source"]) == ("j", 1, "solved")
    assert line["request_id"] == "-"  # outside a request
    assert "time" in line


def test_a_dead_worker_logs_its_replacement_and_the_503(
    tmp_path: Path, start_server: ServerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    server = start_server(f"sqlite:///{tmp_path / 'plans.db'}", solver_workers=1)
    pool = server.server.config.app.state.service.pool
    poster, result = solve_in_background(server, {**LONG_STEP, "job_id": "crash", "step": 0})
    for pid in list(pool._executor._processes):
        os.kill(pid, signal.SIGKILL)
    poster.join()
    assert result[0].status_code == 503
    messages = [(r.name, r.getMessage()) for r in caplog.records]
    assert ("repack.solver_pool", "a solver worker died; the worker pool was replaced") in messages
    answered = [r for r in caplog.records if r.__dict__.get("status") == 503]
    assert len(answered) == 1 and answered[0].__dict__["reason"] == "solver-unavailable"


@pytest.mark.parametrize("job_id", ["obs", 'quo"te', "back\\slash", "ジョブ"])
def test_plan_fields_match_a_full_parse(job_id: str) -> None:
    """The log line's fields come from a scan of the plan's bytes, not a parse of all of it."""
    from solver.plan_builder import canonical_json
    from solver.planner import plan
    from solver.schema import PlanRequest

    result = plan(PlanRequest.model_validate(small_request(job_id, 2)))
    body = canonical_json(result).encode()
    full = json.loads(body)
    assert plan_fields(body) == {k: full[k] for k in ("job_id", "metrics", "plan_id", "status")}
    anonymous = canonical_json(plan(PlanRequest.model_validate({"lengths": [5, 7]}))).encode()
    assert "job_id" not in plan_fields(anonymous)


def test_python_warnings_are_json_log_lines() -> None:
    """A warning (numpy's overflow warnings of a refit, in the 2026-12-07 fuzz) is one JSON
    line of the service's log, not raw text with its source line."""
    code = (
        "import warnings\n"
        "from api.logging_setup import configure_logging\n"
        "configure_logging('json', 'info')\n"
        "warnings.warn('overflow encountered in square', RuntimeWarning)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    record = json.loads(lines[0])
    assert record["logger"] == "py.warnings" and record["level"] == "WARNING"
    assert "overflow encountered in square" in record["message"]
