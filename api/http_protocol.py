"""The server's HTTP/1.1 protocol: uvicorn's, with a bounded request head and problem+json for
what it rejects before the app sees a request.

* uvicorn answers a request it cannot parse (a bad request line, raw control bytes in a
  header, a bad chunk size, ``Content-Length`` beside ``Transfer-Encoding``) itself, with a
  plain-text ``Invalid HTTP request received.`` that no client of this service parses: here
  the same 400 is a problem (``api/problems.py``).
* httptools buffers a request head of any size (one 300 MB header took the service from 167
  to 464 MB of memory, without a body): a head over ``MAX_HEAD_BYTES`` is a 431 problem.

Both close the connection. The parsing itself stays uvicorn's.
"""

from __future__ import annotations

import asyncio
import json
from http import HTTPStatus

from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from api.problems import PROBLEM_MEDIA_TYPE, PROBLEM_TYPE_PREFIX

MAX_HEAD_BYTES = 64 * 1024
"""Most bytes of a request head (request line and headers) before its end is seen: 8x
nginx's default header buffer, 4x h11's limit; this service's own headers (a bearer token, an
idempotency key) are well under 1 KB. Counted per read of the socket, so a head is refused
within one read (at most 256 KB) past the limit."""


def problem_bytes(status: int, slug: str, detail: str) -> bytes:
    """The problem body (the request never reached a route, so its instance is unknown)."""
    body = {
        "type": PROBLEM_TYPE_PREFIX + slug,
        "title": HTTPStatus(status).phrase,
        "status": status,
        "detail": detail,
        "instance": "",
        "errors": [],
        "errors_omitted": 0,
    }
    return json.dumps(body).encode()


def _response(
    default_headers: list[tuple[bytes, bytes]], status: int, slug: str, detail: str
) -> bytes:
    body = problem_bytes(status, slug, detail)
    lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}".encode()]
    lines += [name + b": " + value for name, value in default_headers]
    lines += [
        b"content-type: " + PROBLEM_MEDIA_TYPE.encode(),
        b"content-length: " + str(len(body)).encode(),
        b"connection: close",
    ]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def _malformed(default_headers: list[tuple[bytes, bytes]], message: str) -> bytes:
    detail = f"{message.rstrip('.')}: the request is not valid HTTP/1.1"
    return _response(default_headers, 400, "malformed-http", detail)


class ProblemH11Protocol(H11Protocol):
    """uvicorn's pure-Python protocol (h11 bounds the head itself, at 16 KB: a 400)."""

    def send_400_response(self, msg: str) -> None:
        self.transport.write(_malformed(self.server_state.default_headers, msg))
        self.transport.close()


class ProblemHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol (what its ``auto`` setting picks; httptools is a dependency
    of this project), with the head bounded and problems for what it rejects."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._in_head = True  # the first bytes of a connection are a head
        self._head_bytes = 0
        super().connection_made(transport)

    def on_message_begin(self) -> None:
        self._in_head = True
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._in_head, self._head_bytes = False, 0
        super().on_headers_complete()

    def data_received(self, data: bytes) -> None:
        # Fed first: a read that ends the head (and may carry the body's start) is the
        # parser's, and only reads that leave the head unfinished count.
        super().data_received(data)
        if not self._in_head or self.transport.is_closing():
            return
        self._head_bytes += len(data)
        if self._head_bytes > MAX_HEAD_BYTES:
            detail = f"the request head (request line and headers) exceeds {MAX_HEAD_BYTES} bytes"
            self.transport.write(
                _response(self.server_state.default_headers, 431, "headers-too-large", detail)
            )
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        self.transport.write(_malformed(self.server_state.default_headers, msg))
        self.transport.close()
