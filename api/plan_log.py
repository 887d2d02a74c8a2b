"""One structured log line per answered plan, and the solve-time and queue-wait histograms.

The line carries what an operator joins on and alerts on: the request id (added by the log
filter), job, step, plan id, where the answer came from, how long it waited and solved, and the
plan's status. ``queue_wait_ms`` is the admission-to-answer time that ``plan()`` did not spend
(waiting for a worker, the process hop and the store), so it is 0 for replays.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from asgi_correlation_id import correlation_id

from api.metrics import ServiceMetrics
from solver.schema import PlanRequest

log = logging.getLogger("repack.plans")

_FIELDS = re.compile(rb'"(job_id|metrics|plan_id|status)":(\{[^{}]*\}|"(?:[^"\\]|\\.)*")')
"""The plan's flat ``metrics`` object and its ``job_id``, ``plan_id`` and ``status`` strings
(a null ``job_id`` is left out): the schema has
these keys only at the top level, and the metrics hold no nested object, so the log line needs
no parse of the whole (often 20 KB) plan."""

REPLAYED = {"memory": "cached", "database": "cached", "inflight": "joined"}
"""How the service's answer sources read in the log: a solve, a stored plan, a running solve."""


def log_plan(
    metrics: ServiceMetrics, request: PlanRequest, body: bytes, source: str, elapsed_s: float
) -> None:
    """Log the answer to ``request`` and, for a fresh solve, observe its timings."""
    plan = plan_fields(body)
    solve_ms = plan.get("metrics", {}).get("solve_ms")
    queue_wait_ms = 0.0
    if source == "solved" and solve_ms is not None:
        queue_wait_ms = max(0.0, elapsed_s * 1e3 - solve_ms)
        metrics.solve_time.observe(solve_ms / 1e3)
        metrics.queue_wait.observe(queue_wait_ms / 1e3)
    log.info(
        "plan answered",
        extra={
            "request_id": correlation_id.get(),
            "job_id": request.job_id,
            "step": request.step,
            "plan_id": plan.get("plan_id"),
            "source": REPLAYED.get(source, source),
            "queue_wait_ms": round(queue_wait_ms, 2),
            "solve_ms": solve_ms,
            "elapsed_ms": round(elapsed_s * 1e3, 2),
            "status": plan.get("status"),
        },
    )


def plan_fields(body: bytes) -> dict[str, Any]:
    """``job_id``, ``metrics``, ``plan_id`` and ``status`` of a plan's JSON (absent or null
    keys are left out)."""
    return {m[1].decode(): json.loads(m[2]) for m in _FIELDS.finditer(body)}
