"""Plans for the training loop: fetched from the service, prefetched, with a local fallback,
and agreed on by every rank.

Fetch: ``POST {service_url}/v1/plans`` with the PlanRequest JSON, a per-attempt timeout, and
retries with exponential backoff on transport errors, timeouts, 429 (``Retry-After`` honoured,
capped) and 5xx. When the service cannot deliver, the in-process planner ``solver.planner.plan``
solves the same request: counted in ``stats.fallbacks`` and logged as a warning, never silent.

Agreement (every rank must run the same layout, or the all-to-alls deadlock or corrupt data):

* the same request gives the same layout everywhere: the service keys plans by
  ``(job_id, step)`` and returns the stored plan for a repeated key; the fallback planner is
  deterministic (same request -> same layout in any process);
* that is necessary, not sufficient (a rank could fall back while the service runs a newer
  solver, or a wall-clock deadline could fire on one rank), so ``agree_on_plan`` all-gathers a
  SHA-256 of the plan's *layout* on every step and raises ``PlanMismatchError`` on every rank if
  any differs. Only the layout is hashed (parents, children, tokens, cu_seqlens, split sizes,
  mode): metrics such as ``solve_ms`` and fields a service adds may legitimately differ;
* ``fetch_agreed_plan(strategy="broadcast")`` (default) lets rank 0 fetch and broadcast the plan
  (one request per step instead of one per rank), then still checks the digest;
  ``strategy="verify"`` has every rank fetch (relying on the idempotency key) and checks.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import quote

import httpx
import torch
import torch.distributed as dist

from solver.plan_builder import request_digest
from solver.planner import plan as local_plan
from solver.schema import Plan, PlanRequest

logger = logging.getLogger(__name__)

LAYOUT_FIELDS = ("version", "mode", "parents", "children", "tokens", "cu_seqlens", "all_to_all")
"""Plan fields that decide what every rank does; the agreement digest covers exactly these."""

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
        wait, last = self.config.backoff_s, "no attempt made"
        for attempt in range(1, self.config.retries + 2):
            if attempt > 1:
                with self._lock:
                    self.stats.retries += 1
            try:
                response = self._http.post("/v1/plans", json=body, headers=job_header(request))
            except httpx.TransportError as exc:  # connect errors and every kind of timeout
                last = f"attempt {attempt}: {type(exc).__name__}: {exc}"
            else:
                if response.status_code == 200:
                    return self._parse(request, response, attempt), attempt
                last = f"attempt {attempt}: HTTP {response.status_code}"
                if response.status_code != 429 and response.status_code < 500:
                    # 4xx: the same request would fail again; e.g. 409 = the idempotency key
                    # was used with a different body.
                    raise PlanServiceError(last + f": {response.text[:300]}", attempt)
                wait = _retry_after(response, wait)
            if attempt <= self.config.retries:
                time.sleep(min(wait, self.config.max_backoff_s))
                wait *= 2
        raise PlanServiceError(last, self.config.retries + 1)

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


def _retry_after(response: httpx.Response, default: float) -> float:
    value = response.headers.get("Retry-After")
    try:
        return float(value) if value is not None else default
    except ValueError:
        return default  # an HTTP-date: not worth parsing for sub-second backoffs


def layout_digest(plan: Plan) -> bytes:
    """SHA-256 of the plan's layout fields (see ``LAYOUT_FIELDS``), canonical JSON."""
    data = plan.model_dump(mode="json", include=set(LAYOUT_FIELDS))
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).digest()


def _collective_device(group: dist.ProcessGroup | None) -> torch.device:
    """NCCL only moves device tensors; gloo moves host tensors."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


NO_PLAN = bytes(32)
"""Digest a rank contributes when it has no plan (its fetch raised): the others fail too."""


def agree_on_plan(plan: Plan | None, group: dist.ProcessGroup | None = None) -> str:
    """All-gather every rank's layout digest; raise ``PlanMismatchError`` on all ranks if any
    differs. Returns the agreed digest (hex). Collective over ``group`` (default: world).

    A rank whose fetch failed passes None, so that the others raise instead of waiting.
    """
    device = _collective_device(group)
    digest = NO_PLAN if plan is None else layout_digest(plan)
    mine_B = torch.frombuffer(bytearray(digest), dtype=torch.uint8).to(device)
    world = dist.get_world_size(group)
    gathered = [torch.empty_like(mine_B) for _ in range(world)]
    dist.all_gather(gathered, mine_B, group=group)
    # Host sync on GPU backends: 32 bytes per rank, once per step, to compare on the host.
    by_digest: dict[str, list[int]] = {}
    for r, digest_B in enumerate(gathered):
        by_digest.setdefault(digest_B.cpu().numpy().tobytes().hex(), []).append(r)
    if len(by_digest) > 1 or NO_PLAN.hex() in by_digest:
        names = {NO_PLAN.hex(): "no plan"}
        parts = "; ".join(f"{names.get(d, d[:12])}: ranks {rs}" for d, rs in by_digest.items())
        raise PlanMismatchError(f"ranks disagree on the step's plan: {parts}")
    return next(iter(by_digest))


def broadcast_plan(
    plan: Plan | None,
    src: int = 0,
    group: dist.ProcessGroup | None = None,
    *,
    error: str | None = None,
) -> Plan:
    """Send ``src``'s plan to every rank of ``group`` (other ranks pass None).

    If ``src`` has no plan it passes ``error`` instead, and every rank raises
    ``PlanServiceError`` with that message rather than waiting for a plan that never comes.
    """
    is_src = dist.get_rank() == src
    if is_src and (plan is None) == (error is None):
        raise ValueError("the source rank passes exactly one of plan and error")
    device = _collective_device(group)
    if is_src:
        payload = (error or "").encode() if plan is None else plan.model_dump_json().encode()
    else:
        payload = b""
    # Counts before data: receivers size their buffer from the length; negative = an error.
    sign = -1 if is_src and plan is None else 1
    size_1 = torch.tensor([sign * len(payload)], dtype=torch.int64, device=device)
    dist.broadcast(size_1, src=src, group=group)
    size = int(size_1.item())  # host sync on GPU backends
    buffer_B = (
        torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(device)
        if is_src
        else torch.empty(abs(size), dtype=torch.uint8, device=device)
    )
    if size:  # an empty error message needs no second broadcast
        dist.broadcast(buffer_B, src=src, group=group)
    text = buffer_B.cpu().numpy().tobytes()  # host copy on GPU backends
    if size < 0 or (is_src and plan is None):
        raise PlanServiceError(f"rank {src} has no plan: {text.decode()}", 0)
    if is_src and plan is not None:
        return plan
    return Plan.model_validate_json(text)


def fetch_agreed_plan(
    client: PlanClient | None,
    request: PlanRequest,
    *,
    strategy: Literal["broadcast", "verify"] = "broadcast",
    src: int = 0,
    group: dist.ProcessGroup | None = None,
) -> FetchedPlan:
    """The step's plan, identical on every rank of ``group`` (collective; raises on mismatch).

    ``broadcast``: only ``src`` needs a client; ``verify``: every rank fetches with its client.
    A rank whose fetch raises (fallback disabled, planner error) still joins the collective, so
    every rank raises instead of hanging until the group timeout.
    """
    if strategy == "verify":
        if client is None:
            raise ValueError("strategy 'verify' needs a client on every rank")
        try:
            fetched = client.get(request)
        except Exception:
            with contextlib.suppress(PlanMismatchError):  # this rank raises its own error
                agree_on_plan(None, group=group)  # makes the other ranks raise
            raise
    elif dist.get_rank() == src:
        if client is None:
            raise ValueError("the source rank needs a client")
        try:
            fetched = client.get(request)
        except Exception as exc:
            broadcast_plan(None, src=src, group=group, error=f"{type(exc).__name__}: {exc}")
            raise
        broadcast_plan(fetched.plan, src=src, group=group)
    else:
        t0 = time.perf_counter()
        received = broadcast_plan(None, src=src, group=group)
        fetched = FetchedPlan(received, "broadcast", 0, time.perf_counter() - t0)
    agree_on_plan(fetched.plan, group=group)
    return fetched
