"""A request head (request line and headers) is bounded like a body: uvicorn's httptools parser
buffered a single header of any size (300 MB took the service's memory from 167 to 464 MB), so
one client could exhaust the service's memory without sending a body. Over ``MAX_HEAD_BYTES``
the answer is a 431 problem+json and the connection closes; ordinary heads and large bodies are
untouched. Real uvicorn, raw sockets."""

from __future__ import annotations

import json
import select
from pathlib import Path

import pytest

from api.http_protocol import MAX_HEAD_BYTES
from api.problems import PROBLEM_MEDIA_TYPE
from api.server import ServerThread
from tests.api.conftest import ServerFactory, small_request
from tests.api.raw_http import connect, exchange, parse_response, read_all


@pytest.fixture
def server(tmp_path: Path, start_server: ServerFactory) -> ServerThread:
    return start_server(f"sqlite:///{tmp_path / 'plans.db'}")


def _streamed_head(url: str, header_bytes: int) -> tuple[str, dict[str, str], bytes]:
    """One header of ``header_bytes`` sent in 64 KB pieces, stopping when the server closes."""
    with connect(url) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ")
        piece = b"y" * 65536
        try:
            for _ in range(header_bytes // len(piece)):
                if select.select([s], [], [], 0)[0]:
                    break  # answered mid-head: stop sending, as a client reading answers does
                s.sendall(piece)
            else:
                s.sendall(b"\r\n\r\n")
        except OSError:
            pass  # closed by the server mid-head: its answer is already in the buffer
        return parse_response(read_all(s))


def test_an_oversized_head_is_a_431_problem(server: ServerThread) -> None:
    status, headers, body = _streamed_head(server.url, 64 * MAX_HEAD_BYTES)
    assert status.startswith("HTTP/1.1 431"), status
    assert headers["content-type"] == PROBLEM_MEDIA_TYPE
    assert headers["connection"] == "close"
    problem = json.loads(body)
    assert problem["status"] == 431
    assert problem["type"] == "urn:repack:problem:headers-too-large"
    assert str(MAX_HEAD_BYTES) in problem["detail"]
    status, _, _ = exchange(
        server.url, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    assert status.startswith("HTTP/1.1 200"), status


def test_a_head_just_under_the_limit_is_served(server: ServerThread) -> None:
    filler = b"y" * (MAX_HEAD_BYTES - 200)
    raw = (
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Filler: "
        + filler
        + b"\r\nConnection: close\r\n\r\n"
    )
    status, _, body = exchange(server.url, raw)
    assert status.startswith("HTTP/1.1 200"), status
    assert json.loads(body)["status"] == "ok"


def test_a_large_body_sent_with_its_head_in_one_write_is_not_counted(server: ServerThread) -> None:
    """The body follows the head in the same packets; only the head counts. A plan request of
    ~4 times the head limit, written at once on a fresh connection."""
    request = small_request("head-limit", 0)
    request["lengths"] = [1000 + i % 7 for i in range(60_000)]
    request["cluster"] = {"nodes": 64}
    body = json.dumps(request).encode()
    assert len(body) > 4 * MAX_HEAD_BYTES
    raw = (
        b"POST /v1/plans HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
        b"Connection: close\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    status, _, body_out = exchange(server.url, raw)
    assert status.startswith("HTTP/1.1 422"), status  # the body was read, then refused
    assert json.loads(body_out)["errors"][0]["location"].startswith("body")
