"""A 400 problem+json for requests uvicorn's HTTP parser rejects before the app sees them.

uvicorn answers a request it cannot parse (a bad request line, raw control bytes in a header,
a bad chunk size, ``Content-Length`` beside ``Transfer-Encoding``) itself, with a plain-text
``Invalid HTTP request received.`` that no client of this service parses. The protocol classes
here keep uvicorn's parsing and only replace that answer with the same problem details as
every other error (``api/problems.py``); the connection still closes after it.
"""

from __future__ import annotations

import json
from http import HTTPStatus

from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from api.problems import PROBLEM_MEDIA_TYPE, PROBLEM_TYPE_PREFIX

SLUG = "malformed-http"


def problem_bytes(message: str) -> bytes:
    """The problem body for uvicorn's ``message`` (the request never reached a route, so the
    instance is unknown)."""
    body = {
        "type": PROBLEM_TYPE_PREFIX + SLUG,
        "title": HTTPStatus.BAD_REQUEST.phrase,
        "status": 400,
        "detail": f"{message.rstrip('.')}: the request is not valid HTTP/1.1",
        "instance": "",
        "errors": [],
        "errors_omitted": 0,
    }
    return json.dumps(body).encode()


def _response(default_headers: list[tuple[bytes, bytes]], message: str) -> bytes:
    body = problem_bytes(message)
    lines = [b"HTTP/1.1 400 Bad Request"]
    lines += [name + b": " + value for name, value in default_headers]
    lines += [
        b"content-type: " + PROBLEM_MEDIA_TYPE.encode(),
        b"content-length: " + str(len(body)).encode(),
        b"connection: close",
    ]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


class ProblemH11Protocol(H11Protocol):
    """uvicorn's pure-Python HTTP/1.1 protocol, answering unparsable requests with a problem."""

    def send_400_response(self, msg: str) -> None:
        self.transport.write(_response(self.server_state.default_headers, msg))
        self.transport.close()


class ProblemHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol (what its ``auto`` setting picks; httptools is a dependency
    of this project), answering unparsable requests with a problem."""

    def send_400_response(self, msg: str) -> None:
        self.transport.write(_response(self.server_state.default_headers, msg))
        self.transport.close()
