"""The server's HTTP/1.1 protocol: uvicorn's, with a bounded request head and problem+json for
what it rejects before the app sees a request.

* uvicorn answers a request it cannot parse (a bad request line, raw control bytes in a
  header, a bad chunk size, ``Content-Length`` beside ``Transfer-Encoding``) itself, with a
  plain-text ``Invalid HTTP request received.`` that no client of this service parses: here
  the same 400 is a problem (``api/problems.py``).
* httptools buffers a request head of any size (one 300 MB header took the service from 167
  to 464 MB of memory, without a body): a head over ``MAX_HEAD_BYTES`` is a 431 problem.
* uvicorn has no timeout for a head that never ends: a connection that sent nothing, or a byte
  of a header every second, was held for good (a few hundred such clients take every file
  descriptor). A head not complete ``head_timeout_s`` after the connection opened (or after
  its first byte, on a kept-alive connection) is a 408 problem (``http_protocol``).

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


DEFAULT_HEAD_TIMEOUT_S = 30.0
"""``Settings.head_timeout_s``'s default (``REPACK_HEAD_TIMEOUT_S``)."""


class ProblemHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol (what its ``auto`` setting picks; httptools is a dependency
    of this project), with the head bounded in bytes and time, and problems for what it
    rejects. ``http_protocol`` sets the time."""

    head_timeout_s = DEFAULT_HEAD_TIMEOUT_S

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._in_head = True  # the first bytes of a connection are a head
        self._head_bytes = 0
        self._head_timer: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._start_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        self._in_head = True
        if self._head_timer is None:  # a kept-alive connection's next request
            self._start_head_timer()
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._in_head, self._head_bytes = False, 0
        self._stop_head_timer()
        super().on_headers_complete()

    def _start_head_timer(self) -> None:
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self._in_head or self.transport.is_closing():
            return
        detail = f"the request head did not arrive within {self.head_timeout_s:g} s"
        self.transport.write(
            _response(self.server_state.default_headers, 408, "request-timeout", detail)
        )
        self.transport.close()

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


def http_protocol(head_timeout_s: float) -> type[ProblemHttpToolsProtocol]:
    """The protocol class for uvicorn's ``http`` setting, with the service's head timeout."""
    return type(
        "ProblemHttpToolsProtocol", (ProblemHttpToolsProtocol,), {"head_timeout_s": head_timeout_s}
    )
