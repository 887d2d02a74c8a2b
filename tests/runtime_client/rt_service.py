"""A tiny real plan service for the runtime client's tests: stdlib HTTP on 127.0.0.1, in a
thread, answering ``POST /v1/plans`` with ``solver.planner.plan``. Behaviour knobs make it fail
(HTTP status for the first N requests), stall (delay) or answer for the wrong step, so retries,
timeouts and the fallback are exercised over real sockets, not mocks."""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from solver.planner import plan
from solver.schema import PlanRequest

TOY_CLUSTER = {"nodes": 2, "gpus_per_node": 8, "max_tokens_per_rank": 64}
TOY_MODEL = {"heads": 16, "kv_heads": 4, "head_dim": 8, "sparse_window": 16}


def toy_request(step: int, *, job_id: str = "job", mode: str = "repack+parent") -> PlanRequest:
    """A small request whose lengths depend on the step (deterministically)."""
    lengths = [(step * 37 + i * 53) % 90 + 3 for i in range(6 + step % 5)]
    return PlanRequest.model_validate(
        {
            "job_id": job_id,
            "step": step,
            "cluster": TOY_CLUSTER,
            "model": TOY_MODEL,
            "lengths": lengths,
            "parent_sizes": [16],
            "mode": mode,
            # The planner's wall-clock deadline is a safety net; on a host shared by many jobs
            # the default 1 s fired in one process and not in another (a make-test run saw
            # ranks disagree). These tests are about agreement, so give it room.
            "deadline_ms": 30_000,
        }
    )


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that gave up (the timeout tests) leaves the answer's write to a closed
        socket: expected, not worth a traceback in the test output. Anything else is printed."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


@dataclass
class ServiceBehaviour:
    fail_first: int = 0
    """Answer the first N requests with ``fail_status``."""
    fail_status: int = 503
    retry_after: str | None = None
    delay_s: float = 0.0
    """Sleep before answering every request (exceeding the client's timeout = a timeout)."""
    wrong_step: bool = False
    """Answer with the plan of step + 1 (a mixed-up response)."""
    seen: list[tuple[float, str | None, int | None]] = field(default_factory=list)
    """(time, job_id, step) of every request received."""


class PlanService:
    """The server; ``url`` to point a client at, ``behaviour`` to change it between calls."""

    def __init__(self, behaviour: ServiceBehaviour) -> None:
        self.behaviour = behaviour
        self._plans: dict[tuple[str | None, int | None], str] = {}
        self._lock = threading.Lock()
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                service._answer(self)

            def log_message(self, *args: object) -> None:
                pass

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _answer(self, h: BaseHTTPRequestHandler) -> None:
        b = self.behaviour
        body = h.rfile.read(int(h.headers["Content-Length"]))
        request = PlanRequest.model_validate_json(body)
        with self._lock:
            b.seen.append((time.monotonic(), request.job_id, request.step))
            failing = len(b.seen) <= b.fail_first
        time.sleep(b.delay_s)
        if h.path != "/v1/plans":
            return self._send(h, 404, b"{}")
        if failing:
            extra = {"Retry-After": b.retry_after} if b.retry_after else {}
            return self._send(h, b.fail_status, b'{"title": "failing on purpose"}', extra)
        if b.wrong_step and request.step is not None:
            request = request.model_copy(update={"step": request.step + 1})
        key = (request.job_id, request.step)
        with self._lock:  # idempotency key: a repeated (job_id, step) gets the stored plan
            if key not in self._plans or key == (None, None):
                self._plans[key] = plan(request).model_dump_json()
            text = self._plans[key]
        self._send(h, 200, text.encode())

    @staticmethod
    def _send(
        h: BaseHTTPRequestHandler, status: int, body: bytes, headers: dict[str, str] | None = None
    ) -> None:
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(body)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
