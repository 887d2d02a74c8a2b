"""Prometheus metrics of one app instance (own registry, so several apps can share a process)."""

from __future__ import annotations

import time
from collections import deque

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from starlette.types import ASGIApp, Message, Receive, Scope, Send

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 5, 10)
"""Seconds; dense around the 5-150 ms targets."""


class ServiceMetrics:
    """Counters, histograms and gauges the service exports at ``/metrics``."""

    def __init__(self, recent_window: int) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.latency = Histogram(
            "repack_http_request_duration_seconds",
            "HTTP request latency by route and status.",
            ["method", "route", "status"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.plans = Counter(
            "repack_plans_total",
            "Plans solved, by status and mode.",
            ["status", "mode"],
            registry=r,
        )
        self.deadline_hits = Counter(
            "repack_deadline_hits_total", "Solves stopped by the wall-clock deadline.", registry=r
        )
        self.late = Counter(
            "repack_deadline_overruns_total",
            "Plan answers sent after the request's deadline.",
            registry=r,
        )
        self.cache_hits = Counter(
            "repack_cache_hits_total",
            "Plan requests answered without solving, by source.",
            ["source"],
            registry=r,
        )
        self.rejected = Counter(
            "repack_rejected_total",
            "Requests answered 429, by reason (queue_full, deadline, rate_limit).",
            ["reason"],
            registry=r,
        )
        self.solve_time = Histogram(
            "repack_solve_seconds",
            "Wall time of plan() for fresh solves (the plan's metrics.solve_ms).",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "repack_queue_wait_seconds",
            "Admission to answer of fresh solves, minus the solve (queue, IPC, store).",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        # Process and runtime metrics (process_*, python_gc_*), as the default registry has.
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        self.queue = Gauge("repack_solver_pending", "Solves running or queued.", registry=r)
        self.recent_gap = Gauge(
            "repack_recent_gap", "Gap to the lower bound over recent plans.", ["stat"], registry=r
        )
        self.recent_speedup = Gauge(
            "repack_recent_speedup",
            "Speed-up over the baseline of recent plans.",
            ["stat"],
            registry=r,
        )
        self._gaps: deque[float] = deque(maxlen=recent_window)
        self._speedups: deque[float] = deque(maxlen=recent_window)

    def observe_plan(
        self, status: str, mode: str, stopped_by: str | None, gap: float | None, speedup: float
    ) -> None:
        """Count one solved plan and fold its quality into the recent gauges."""
        self.plans.labels(status=status, mode=mode).inc()
        if stopped_by == "deadline":
            self.deadline_hits.inc()
        if gap is not None:
            self._gaps.append(gap)
            self.recent_gap.labels(stat="mean").set(sum(self._gaps) / len(self._gaps))
            self.recent_gap.labels(stat="max").set(max(self._gaps))
        self._speedups.append(speedup)
        self.recent_speedup.labels(stat="mean").set(sum(self._speedups) / len(self._speedups))
        self.recent_speedup.labels(stat="min").set(min(self._speedups))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class LatencyMiddleware:
    """Pure ASGI middleware timing every HTTP request by its route template."""

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            name = getattr(route, "path", None) or "unmatched"
            self.metrics.latency.labels(
                method=scope["method"], route=name, status=str(status)
            ).observe(time.perf_counter() - start)
