"""Bodies the service cannot read, over real HTTP (uvicorn, SQLite), from the 2026-12-07 fuzz:
each answer says what is wrong with the body, and a client that stops sending one is cut off.

Before: invalid JSON was "JSON decode error" at ``body[17]`` (a character offset made to look
like an index), a wrong Content-Type "Input should be a valid dictionary", nesting past the
parser's depth or a 5,000-digit integer "There was an error parsing the body", and a body that
stopped after 2 of its 100 declared bytes held its connection open for good.
"""

from __future__ import annotations

import gzip
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from api.server import ServerThread
from tests.api.conftest import ServerFactory, small_request

BODY_TIMEOUT_S = 1.0


@pytest.fixture
def server(tmp_path: Path, start_server: ServerFactory) -> ServerThread:
    return start_server(f"sqlite:///{tmp_path / 'plans.db'}", body_timeout_s=BODY_TIMEOUT_S)


@pytest.fixture
def client(server: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def _problem(r: httpx.Response, status: int) -> dict[str, object]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    body: dict[str, object] = r.json()
    return body


def _post(client: httpx.Client, content: bytes, **headers: str) -> httpx.Response:
    return client.post(
        "/v1/plans", content=content, headers={"content-type": "application/json", **headers}
    )


def test_invalid_json_says_where_and_why(client: httpx.Client) -> None:
    problem = _problem(_post(client, b'{"lengths": [1, 2],}'), 422)
    [error] = problem["errors"]  # type: ignore[misc]
    assert error["location"] == "body" and error["type"] == "json_invalid"
    assert "invalid JSON at character 19" in error["detail"], error
    assert "Expecting" in error["detail"], error  # the parser's reason


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded"])
def test_a_body_that_is_not_sent_as_json_says_so(client: httpx.Client, content_type: str) -> None:
    body = json.dumps(small_request("ctype", 0)).encode()
    problem = _problem(_post(client, body, **{"content-type": content_type}), 422)
    [error] = problem["errors"]  # type: ignore[misc]
    assert error["location"] == "body"
    assert "application/json" in error["detail"] and content_type in error["detail"], error


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"lengths": ' + b"[" * 5000 + b"]" * 5000 + b"}", "nested too deeply"),
        (b'{"lengths": [' + b"9" * 5000 + b"]}", "digits"),
        (b'{"lengths": [1], "x": "\xc0\xaf"}', "UTF-8"),
    ],
)
def test_an_undecodable_body_says_why(client: httpx.Client, body: bytes, expected: str) -> None:
    problem = _problem(_post(client, body), 400)
    [error] = problem["errors"]  # type: ignore[misc]
    assert error["location"] == "body"
    assert expected in error["detail"], error


def test_a_compressed_body_is_named_as_such(client: httpx.Client) -> None:
    body = gzip.compress(json.dumps(small_request("gz", 0)).encode())
    problem = _problem(_post(client, body, **{"content-encoding": "gzip"}), 400)
    [error] = problem["errors"]  # type: ignore[misc]
    assert "Content-Encoding" in error["detail"] and "gzip" in error["detail"], error


def test_a_body_that_stops_arriving_is_cut_off(server: ServerThread) -> None:
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(
            b"POST /v1/plans HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"'
        )
        started = time.monotonic()
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = s.recv(65536)
            if not chunk:
                break
            answer += chunk
        waited = time.monotonic() - started
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), answer
    assert b"application/problem+json" in head.lower()
    assert json.loads(body)["type"].endswith("request-timeout")
    assert BODY_TIMEOUT_S * 0.9 <= waited < BODY_TIMEOUT_S + 20


def test_a_slow_but_steady_body_is_read(server: ServerThread) -> None:
    """The limit is on silence, not on the whole body: chunks every half the limit get in."""
    body = json.dumps(small_request("steady", 0)).encode()
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(
            b"POST /v1/plans HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        )
        for i in range(0, len(body), len(body) // 3 + 1):
            s.sendall(body[i : i + len(body) // 3 + 1])
            time.sleep(BODY_TIMEOUT_S / 2)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
