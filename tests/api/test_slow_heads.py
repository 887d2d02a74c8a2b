"""A request head that never ends (slowloris) is bounded in time: uvicorn has no timeout for
it, so a connection that sent nothing, or a byte of a header every second, was held for good.
A head not complete ``REPACK_HEAD_TIMEOUT_S`` after the connection opened (or after its first
byte, on a kept-alive connection) is a 408 problem+json and the connection closes. Real
uvicorn, raw sockets, a 1 s limit."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from api.problems import PROBLEM_MEDIA_TYPE
from api.server import ServerThread
from tests.api.conftest import ServerFactory
from tests.api.raw_http import connect, parse_response, read_all

LIMIT_S = 1.0


@pytest.fixture
def server(tmp_path: Path, start_server: ServerFactory) -> ServerThread:
    return start_server(f"sqlite:///{tmp_path / 'plans.db'}", head_timeout_s=LIMIT_S)


def _assert_timeout_problem(status: str, headers: dict[str, str], body: bytes) -> None:
    assert status.startswith("HTTP/1.1 408"), status
    assert headers["content-type"] == PROBLEM_MEDIA_TYPE
    assert headers["connection"] == "close"
    problem = json.loads(body)
    assert problem["type"] == "urn:repack:problem:request-timeout"
    assert "head" in problem["detail"]


def test_a_connection_that_sends_nothing_is_closed_with_a_408(server: ServerThread) -> None:
    with connect(server.url) as s:
        started = time.monotonic()
        answer = parse_response(read_all(s))
        waited = time.monotonic() - started
    _assert_timeout_problem(*answer)
    assert LIMIT_S * 0.9 <= waited < 20


def test_a_head_dribbled_a_byte_at_a_time_is_closed_with_a_408(server: ServerThread) -> None:
    with connect(server.url) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        s.settimeout(0.2)
        data = b""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                s.sendall(b"y")
            except OSError:
                break
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                continue
            if not chunk:
                break
            data += chunk
    _assert_timeout_problem(*parse_response(data))


def test_a_kept_alive_connection_idle_between_requests_is_not_timed_out(
    server: ServerThread,
) -> None:
    """The limit runs while a head arrives, not between requests (uvicorn's keep-alive, 5 s,
    closes idle connections): a second request after 1.5 x the limit is served."""
    with connect(server.url) as s:
        for close in (False, True):
            header = b"Connection: close\r\n" if close else b""
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + header + b"\r\n")
            if not close:
                data = s.recv(65536)
                assert data.startswith(b"HTTP/1.1 200"), data[:100]
                time.sleep(1.5 * LIMIT_S)
        status, _, body = parse_response(read_all(s))
    assert status.startswith("HTTP/1.1 200"), status
    assert json.loads(body)["status"] == "ok"
