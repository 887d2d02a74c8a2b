"""The measurement reporter against the real plan service (uvicorn on loopback)."""

from __future__ import annotations

from pathlib import Path

import httpx

from api.server import ServerThread, free_port
from api.settings import Settings
from cli.replay_measured import read_measurements
from runtime_client.measurements import MeasurementReporter, ReporterConfig, write_jsonl
from solver.measurement_schema import LayerTimes, MeasuredStep, StepMeasurement

STEP = StepMeasurement(
    step_time_ms=120.0, layers=LayerTimes(full_ms=30.0, sparse_ms=70.0), all_to_all_ms=12.0
)


def test_reporter_posts_idempotently_and_counts_refusals(tmp_path: Path) -> None:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'p.db'}", port=free_port(), log_level="warning"
    )
    with ServerThread(settings) as server:
        reporter = MeasurementReporter(ReporterConfig(service_url=server.url, backoff_s=0.01))
        try:
            assert reporter.report("job with space", 3, STEP).result(timeout=30)
            assert reporter.post("job with space", 3, STEP)  # the same again: a 200 replay
            other = STEP.model_copy(update={"step_time_ms": 5.0})
            assert not reporter.post("job with space", 3, other)  # 409: refused, not retried
        finally:
            reporter.close()
        assert (reporter.stats.posted, reporter.stats.failed, reporter.stats.retries) == (2, 1, 0)
        listed = httpx.get(f"{server.url}/v1/jobs/job%20with%20space/measurements").json()
        assert [s["measured_ms"] for s in listed["steps"]] == [120.0]


def test_reporter_gives_up_quietly_when_the_service_is_gone() -> None:
    reporter = MeasurementReporter(
        ReporterConfig(service_url=f"http://127.0.0.1:{free_port()}", retries=2, backoff_s=0.01)
    )
    try:
        assert not reporter.report("j", 0, STEP).result(timeout=30)
    finally:
        reporter.close()
    assert (reporter.stats.failed, reporter.stats.retries) == (1, 2)


def test_jsonl_round_trip(tmp_path: Path) -> None:
    records = [MeasuredStep(job_id="j", step=i, **STEP.model_dump()) for i in range(3)]
    write_jsonl(tmp_path / "m.jsonl", records)
    assert read_measurements(tmp_path / "m.jsonl") == records
