"""Run the app under uvicorn: in the foreground (`repack serve`) or in a thread (demo, tests)."""

from __future__ import annotations

import errno
import socket
import sys
import threading
import time
from typing import Any, NoReturn

import uvicorn

from api.auth import load_tokens
from api.database import open_store
from api.errors import DatabaseUnavailable
from api.http_protocol import http_protocol
from api.logging_setup import configure_logging
from api.main import create_app
from api.settings import Settings, db_timeouts

STARTUP_TIMEOUT_S = 60.0


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def uvicorn_config(settings: Settings, *, own_logging: bool = False) -> uvicorn.Config:
    """``own_logging``: uvicorn's loggers propagate to the service's JSON handler instead of
    getting uvicorn's text handlers (for ``repack serve``; tests keep uvicorn's)."""
    extra: dict[str, Any] = {"log_config": None} if own_logging else {}
    return uvicorn.Config(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=False,  # the per-plan line (api/plan_log.py) says more at a fraction of it
        http=http_protocol(settings.head_timeout_s),  # bounded heads, problems (http_protocol.py)
        **extra,
    )


def serve(settings: Settings) -> None:
    """Serve until interrupted (uvicorn installs the signal handlers), logging JSON lines.
    The database is opened and migrated first, so that a wrong URL ends the command with one
    line, not a traceback."""
    if settings.tokens_file is not None:
        load_tokens(settings.tokens_file)  # a bad tokens file is one line, before anything runs
    configure_logging(settings.log_format, settings.log_level)
    try:
        open_store(settings.database_url, db_timeouts(settings)).close()
    except DatabaseUnavailable as exc:
        _refuse(str(exc))
    listener = _bound(settings.host, settings.port)
    uvicorn.Server(uvicorn_config(settings, own_logging=True)).run(sockets=[listener])


def _refuse(message: str) -> NoReturn:
    """One line and exit 2, like any command's bad input."""
    print(f"repack serve: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _bound(host: str, port: int) -> socket.socket:
    """The listening address, bound before anything starts: uvicorn bound it after the app's
    startup and logged a taken port among six other lines, exit 3 (2026-12-07 fuzz)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        listener = socket.socket(family, kind, proto)
    except OSError as exc:
        _refuse(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
        listener.bind(address)
    except OSError as exc:
        listener.close()
        why = "address already in use" if exc.errno == errno.EADDRINUSE else exc.strerror
        _refuse(f"cannot listen on {host}:{port}: {why}")
    return listener


class ServerThread:
    """A real uvicorn server on a background thread; ``url`` is its base URL once started."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.server = uvicorn.Server(uvicorn_config(settings))
        self._thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.settings.host}:{self.settings.port}"

    def start(self) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn did not start on {self.url}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=STARTUP_TIMEOUT_S)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()
