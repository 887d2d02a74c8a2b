"""Run the app under uvicorn: in the foreground (`repack serve`) or in a thread (demo, tests)."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn

from api.database import open_store
from api.errors import DatabaseUnavailable
from api.main import create_app
from api.settings import Settings, db_timeouts

STARTUP_TIMEOUT_S = 60.0


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def uvicorn_config(settings: Settings) -> uvicorn.Config:
    return uvicorn.Config(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=False,  # one log line per plan request would dominate the service's CPU
    )


def serve(settings: Settings) -> None:
    """Serve until interrupted (uvicorn installs the signal handlers). The database is opened
    and migrated first, so that a wrong URL ends the command with one line, not a traceback."""
    try:
        open_store(settings.database_url, db_timeouts(settings)).close()
    except DatabaseUnavailable as exc:
        raise SystemExit(f"repack serve: error: {exc}") from None
    uvicorn.Server(uvicorn_config(settings)).run()


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
