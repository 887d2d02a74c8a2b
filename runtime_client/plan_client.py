"""Plans over HTTP: fetched from the service, prefetched, with a local fallback. No torch.

A data-loader worker (or any process without torch) can import this module: it needs httpx,
tenacity and ``solver`` only; a test imports it with torch blocked. Making every rank of a
process group hold the same plan is ``runtime_client.agreement`` (torch.distributed).

Fetch: ``POST {service_url}/v1/plans`` with the PlanRequest JSON, a per-attempt timeout, and
retries (tenacity) with exponential backoff on transport errors, timeouts, 429 (``Retry-After``
honoured, capped) and 5xx; other 4xx are final (the same request would fail again). When the
service cannot deliver, the in-process planner ``solver.planner.plan`` solves the same request:
counted in ``stats.fallbacks`` and logged as a warning, never silent.

``layout_digest`` (SHA-256 of the fields that decide what every rank does) lives here too, so
a process without torch can compare plans the way the agreement does.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import quote

import httpx
from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt

from solver.plan_builder import request_digest
from solver.planner import plan as local_plan
from solver.schema import Plan, PlanRequest

logger = logging.getLogger(__name__)

Source = Literal["service", "fallback", "broadcast"]


TOKEN_ENV = "REPACK_TOKEN"
JOB_HEADER = "X-Repack-Job"
"""Carries the job id so that a balancer can route all of a job's steps to one replica
(deploy/nginx.conf hashes on it) without reading the body; percent-encoded, so any job id
fits in a header."""


def job_header(request: PlanRequest) -> dict[str, str]:
    return {JOB_HEADER: quote(request.job_id, safe="")} if request.job_id else {}


class PlanServiceError(RuntimeError):
    """The service gave no usable plan after every attempt."""

    def __init__(self, message: str, attempts: int) -> None:
        super().__init__(message)
        self.attempts = attempts
        """HTTP attempts made before giving up."""


class PlanMismatchError(RuntimeError):
    """Ranks hold different plan layouts for the same step."""


@dataclass(kw_only=True, frozen=True)
class PlanClientConfig:
    """Where plans come from and how hard to try."""

    service_url: str = "http://127.0.0.1:8000"
    """Base URL of the plan service."""

    timeout_s: float = 5.0
    """Timeout of one HTTP attempt (connect, read, write and pool)."""

    retries: int = 3
    """Attempts after the first one before falling back."""

    backoff_s: float = 0.2
    """Wait before the first retry; doubles each retry."""

    max_backoff_s: float = 2.0
    """Cap on any wait, including a server's ``Retry-After``."""

    prefetch_workers: int = 2
    """Background threads fetching plans of future steps."""

    fallback: bool = True
    """Solve locally when the service fails; False raises ``PlanServiceError`` instead."""

    fallback_deadline_ms: int | None = None
    """Deadline for the local planner; None = the request's (or the planner's default)."""

    token: str | None = field(default_factory=lambda: os.environ.get(TOKEN_ENV), repr=False)
    """Bearer token for the service (default: ``REPACK_TOKEN``); kept out of ``repr``."""

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ValueError(f"Expected timeout_s > 0, got {self.timeout_s}.")
        if self.retries < 0:
            raise ValueError(f"Expected retries >= 0, got {self.retries}.")
        if self.prefetch_workers < 1:
            raise ValueError(f"Expected prefetch_workers >= 1, got {self.prefetch_workers}.")


@dataclass(frozen=True)
class FetchedPlan:
    """A plan and how it was obtained."""

    plan: Plan
    source: Source
    attempts: int
    """HTTP attempts made (0 when the plan came by broadcast)."""

    seconds: float
    """Wall time from the start of the fetch to the plan (includes fallback solving)."""

    error: str | None = None
    """Why the service failed, when ``source == "fallback"``."""


@dataclass
class PlanClientStats:
    """Counters over the client's lifetime (read them to log or export)."""

    service_plans: int = 0
    fallbacks: int = 0
    retries: int = 0
    prefetch_hits: int = 0
    prefetch_misses: int = 0


def request_key(request: PlanRequest) -> str:
    """Cache key: the idempotency key when present, else the request's content digest."""
    if request.job_id is not None and request.step is not None:
        return f"{request.job_id}/{request.step}"
    return request_digest(request)


@dataclass
class PlanClient:
    """Fetches plans over HTTP with retries, prefetch and a local fallback planner."""

    config: PlanClientConfig = field(default_factory=PlanClientConfig)
    stats: PlanClientStats = field(default_factory=PlanClientStats)

    def __post_init__(self) -> None:
        auth = {"Authorization": f"Bearer {self.config.token}"} if self.config.token else {}
        self._http = httpx.Client(
            base_url=self.config.service_url, timeout=self.config.timeout_s, headers=auth
        )
        self._pool = ThreadPoolExecutor(self.config.prefetch_workers, "plan-prefetch")
        self._pending: dict[str, Future[FetchedPlan]] = {}
        self._lock = threading.Lock()

    def prefetch(self, request: PlanRequest) -> None:
        """Start fetching ``request``'s plan in the background (no-op if already started)."""
        key = request_key(request)
        with self._lock:
            if key not in self._pending:
                self._pending[key] = self._pool.submit(self.fetch, request)

    def get(self, request: PlanRequest) -> FetchedPlan:
        """The plan for ``request``: the prefetched one if started, else fetched now."""
        with self._lock:
            future = self._pending.pop(request_key(request), None)
        with self._lock:  # counters are updated from the prefetch threads too
            if future is None:
                self.stats.prefetch_misses += 1
            else:
                self.stats.prefetch_hits += 1
        return self.fetch(request) if future is None else future.result()

    def fetch(self, request: PlanRequest) -> FetchedPlan:
        """Service with retries, then the local planner (unless ``fallback`` is off)."""
        t0 = time.perf_counter()
        attempts = 0
        try:
            plan, attempts = self._fetch_service(request)
        except PlanServiceError as exc:
            attempts = exc.attempts
            if not self.config.fallback:
                raise
            with self._lock:
                self.stats.fallbacks += 1
                count = self.stats.fallbacks
            logger.warning(
                "plan service failed for %s (%s); using the local planner (fallback #%d)",
                request_key(request),
                exc,
                count,
            )
            plan = local_plan(request, deadline_ms=self.config.fallback_deadline_ms)
            return FetchedPlan(plan, "fallback", attempts, time.perf_counter() - t0, str(exc))
        with self._lock:
            self.stats.service_plans += 1
        return FetchedPlan(plan, "service", attempts, time.perf_counter() - t0)

    def _fetch_service(self, request: PlanRequest) -> tuple[Plan, int]:
        body = request.model_dump(mode="json", exclude_none=True)
        cfg, attempts = self.config, 0

        def attempt() -> Plan:
            nonlocal attempts
            attempts += 1
            if attempts > 1:
                with self._lock:
                    self.stats.retries += 1
            return self._post_once(request, body, attempts)

        retrying = Retrying(
            stop=stop_after_attempt(cfg.retries + 1),
            wait=_Backoff(cfg.backoff_s, cfg.max_backoff_s),
            retry=retry_if_exception_type(_Retryable),
            reraise=True,
        )
        try:
            return retrying(attempt), attempts
        except _Retryable as exc:
            raise PlanServiceError(str(exc), attempts) from exc

    def _post_once(self, request: PlanRequest, body: dict[str, Any], attempt: int) -> Plan:
        """One HTTP attempt: the plan, ``_Retryable`` (try again) or ``PlanServiceError``."""
        try:
            response = self._http.post("/v1/plans", json=body, headers=job_header(request))
        except httpx.TransportError as exc:  # connect errors and every kind of timeout
            raise _Retryable(f"attempt {attempt}: {type(exc).__name__}: {exc}") from exc
        if response.status_code == 200:
            return self._parse(request, response, attempt)
        message = f"attempt {attempt}: HTTP {response.status_code}"
        if response.status_code == 429 or response.status_code >= 500:
            raise _Retryable(message, _retry_after(response))
        # Other 4xx: the same request would fail again; e.g. 409 = the idempotency key was
        # used with a different body.
        raise PlanServiceError(message + f": {response.text[:300]}", attempt)

    @staticmethod
    def _parse(request: PlanRequest, response: httpx.Response, attempt: int) -> Plan:
        try:
            plan = Plan.model_validate_json(response.content)
        except ValueError as exc:
            raise PlanServiceError(f"invalid plan JSON: {exc}", attempt) from exc
        if (plan.job_id, plan.step) != (request.job_id, request.step):
            raise PlanServiceError(
                f"plan is for job {plan.job_id!r} step {plan.step}, "
                f"asked for {request.job_id!r} step {request.step}",
                attempt,
            )
        return plan

    def close(self) -> None:
        """Stop background fetches and close the HTTP connection pool."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._http.close()

    def __enter__(self) -> PlanClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Retryable(Exception):
    """An attempt that may succeed if repeated (transport error, 429, 5xx)."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        """The server's ``Retry-After`` in seconds, when it sent one."""


@dataclass(frozen=True)
class _Backoff:
    """Tenacity wait: the server's ``Retry-After`` if given, else ``base * 2**(n-1)``; capped."""

    base_s: float
    cap_s: float

    def __call__(self, state: RetryCallState) -> float:
        outcome = state.outcome
        exc = outcome.exception() if outcome is not None else None
        if isinstance(exc, _Retryable) and exc.retry_after_s is not None:
            return min(exc.retry_after_s, self.cap_s)
        return min(self.base_s * 2 ** (state.attempt_number - 1), self.cap_s)


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None  # an HTTP-date: not worth parsing for sub-second backoffs


LAYOUT_FIELDS = ("version", "mode", "parents", "children", "tokens", "cu_seqlens", "all_to_all")
"""Plan fields that decide what every rank does; the agreement digest covers exactly these."""


def layout_digest(plan: Plan) -> bytes:
    """SHA-256 of the plan's layout fields (see ``LAYOUT_FIELDS``), canonical JSON."""
    data = plan.model_dump(mode="json", include=set(LAYOUT_FIELDS))
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).digest()


_MOVED_TO_AGREEMENT = ("NO_PLAN", "agree_on_plan", "broadcast_plan", "fetch_agreed_plan")


def __getattr__(name: str) -> Any:
    """Old import path of the torch.distributed agreement (now ``runtime_client.agreement``);
    resolved lazily, so importing this module never imports torch."""
    if name in _MOVED_TO_AGREEMENT:
        from runtime_client import agreement

        return getattr(agreement, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
