"""Requests uvicorn's HTTP parser rejects before the app sees them (a bad request line, raw
control bytes, a bad chunk size, ``Content-Length`` beside ``Transfer-Encoding``) get a 400
problem+json like every other error, not uvicorn's plain-text ``Invalid HTTP request
received.``, over a real socket to a real uvicorn."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import uvicorn

from api.http_protocol import ProblemH11Protocol
from api.main import create_app
from api.problems import PROBLEM_MEDIA_TYPE
from tests.api.conftest import ServerFactory, make_settings
from tests.api.raw_http import exchange

MALFORMED = {
    "garbage request line": b"GARBAGE\r\n\r\n",
    "control byte in a header": b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: a\x01b\r\n\r\n",
    "bad chunk size": (
        b"POST /v1/plans HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        b"content-type: application/json\r\n\r\nzz\r\n{}\r\n0\r\n\r\n"
    ),
    "length and chunked": (
        b"POST /v1/plans HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"
    ),
}


@pytest.mark.parametrize("raw", list(MALFORMED.values()), ids=list(MALFORMED))
def test_malformed_http_is_a_400_problem(
    raw: bytes, tmp_path: Path, start_server: ServerFactory
) -> None:
    server = start_server(f"sqlite:///{tmp_path / 'plans.db'}")
    status, headers, body = exchange(server.url, raw)
    assert status.startswith("HTTP/1.1 400"), status
    assert headers["content-type"] == PROBLEM_MEDIA_TYPE
    assert int(headers["content-length"]) == len(body)
    problem = json.loads(body)
    assert problem["status"] == 400
    assert problem["title"] == "Bad Request"
    assert problem["type"] == "urn:repack:problem:malformed-http"
    assert "HTTP" in problem["detail"]
    # the server is still healthy for the next caller
    status, _, _ = exchange(
        server.url, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    assert status.startswith("HTTP/1.1 200"), status


def test_the_pure_python_protocol_answers_the_same(tmp_path: Path) -> None:
    """Where uvicorn runs its h11 protocol instead (no httptools), the answer is the same."""
    settings = make_settings(f"sqlite:///{tmp_path / 'plans.db'}")
    config = uvicorn.Config(
        create_app(settings), host=settings.host, port=settings.port, http=ProblemH11Protocol
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline
            time.sleep(0.02)
        status, headers, body = exchange(
            f"http://{settings.host}:{settings.port}", b"GARBAGE\r\n\r\n"
        )
    finally:
        server.should_exit = True
        thread.join(timeout=60)
    assert status.startswith("HTTP/1.1 400"), status
    assert headers["content-type"] == PROBLEM_MEDIA_TYPE
    assert json.loads(body)["type"] == "urn:repack:problem:malformed-http"
