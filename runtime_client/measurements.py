"""Report what each step really took: ``POST /v1/jobs/{job}/steps/{step}/measurements``.

Plain HTTP (no torch): any process that knows the times can report them, typically rank 0
after the ranks' times were max-reduced (``runtime_client.step_timer``). Reporting never stops
training: posts run on one background thread, transport errors, 429 and 5xx are retried a few
times with backoff, and what still fails is counted and logged, not raised. The endpoint is
idempotent per ``(job, step)``, so a retried post is harmless. ``write_jsonl`` keeps the same
records in a file for ``repack replay --measurements``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import httpx

from solver.measurement_schema import MeasuredStep, StepMeasurement

logger = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


@dataclass(kw_only=True, frozen=True)
class ReporterConfig:
    """Where and how hard to try."""

    service_url: str
    """Base URL of the plan service."""
    timeout_s: float = 2.0
    """Per attempt."""
    retries: int = 2
    """Extra attempts after the first."""
    backoff_s: float = 0.2
    """First wait between attempts; doubles each time."""
    headers: dict[str, str] = field(default_factory=dict)
    """Sent with every post (e.g. the service's auth header)."""

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.retries < 0 or self.backoff_s < 0:
            raise ValueError(
                f"Expected timeout_s > 0, retries >= 0, backoff_s >= 0, got "
                f"{self.timeout_s}, {self.retries}, {self.backoff_s}."
            )


@dataclass
class ReporterStats:
    posted: int = 0
    failed: int = 0
    retries: int = 0


def measurement_path(job_id: str, step: int) -> str:
    return f"/v1/jobs/{quote(job_id, safe='')}/steps/{step}/measurements"


class MeasurementReporter:
    """Posts step measurements in the background; ``close`` waits for the last ones."""

    def __init__(self, config: ReporterConfig) -> None:
        self.config = config
        self.stats = ReporterStats()
        self._lock = threading.Lock()
        self._http = httpx.Client(
            base_url=config.service_url, timeout=config.timeout_s, headers=config.headers
        )
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="repack-measure")

    def report(self, job_id: str, step: int, measurement: StepMeasurement) -> Future[bool]:
        """Queue one post; the future says whether the service accepted it."""
        return self._pool.submit(self.post, job_id, step, measurement)

    def post(self, job_id: str, step: int, measurement: StepMeasurement) -> bool:
        """Post now (blocking); True when stored (201) or already stored identically (200)."""
        body = measurement.model_dump(exclude_none=True)
        wait = self.config.backoff_s
        for attempt in range(self.config.retries + 1):
            if attempt:
                self._count("retries")
                time.sleep(wait)
                wait *= 2
            try:
                response = self._http.post(measurement_path(job_id, step), json=body)
            except httpx.TransportError as exc:
                logger.warning("measurement of %s step %d: %s", job_id, step, exc)
                continue
            if response.status_code in (200, 201):
                self._count("posted")
                return True
            if response.status_code not in RETRY_STATUSES:
                logger.warning(
                    "measurement of %s step %d refused (%d): %s",
                    job_id,
                    step,
                    response.status_code,
                    response.text[:300],
                )
                break
        self._count("failed")
        return False

    def _count(self, name: str) -> None:
        with self._lock:
            setattr(self.stats, name, getattr(self.stats, name) + 1)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._http.close()


def write_jsonl(path: str | Path, records: list[MeasuredStep]) -> None:
    """One JSON object per line, the format ``repack replay --measurements`` reads."""
    Path(path).write_text(
        "".join(json.dumps(r.model_dump(exclude_none=True)) + "\n" for r in records)
    )
