"""Raw HTTP/1.1 over a socket, for the tests of what uvicorn's parser sees before the app."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit


def connect(url: str, timeout_s: float = 30) -> socket.socket:
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    return socket.create_connection((parts.hostname, parts.port), timeout=timeout_s)


def parse_response(data: bytes) -> tuple[str, dict[str, str], bytes]:
    """The status line, headers (lower-case names) and body of one raw response."""
    head, _, body = data.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines)}
    return status, headers, body


def read_all(s: socket.socket) -> bytes:
    """Everything until the server closes (a reset after its answer counts as closed)."""
    data = b""
    try:
        while chunk := s.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def exchange(url: str, raw: bytes) -> tuple[str, dict[str, str], bytes]:
    """Send ``raw`` as is; the parsed answer."""
    with connect(url) as s:
        s.sendall(raw)
        return parse_response(read_all(s))
