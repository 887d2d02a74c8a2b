"""Starting against a database that cannot be opened ends with one clear line, no traceback,
and no password in it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from api.server import free_port


@pytest.mark.parametrize(
    "url",
    [
        "postgresql+psycopg://repack:s3cret@127.0.0.1:{port}/test",
        "nosuchdb://repack:s3cret@host/db",
        "postgresql+psycopg://repack:s3cret@[bad",
    ],
)
def test_serve_with_an_unusable_database_prints_one_line(url: str) -> None:
    db_url = url.format(port=free_port())
    cmd = [sys.executable, "-m", "cli.main", "serve", "--database-url", db_url,
           "--port", str(free_port())]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=os.environ)
    assert done.returncode == 2  # bad input, as every other command's (1 is an internal error)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("repack serve: error: ")
    assert "Traceback" not in done.stderr
    assert "s3cret" not in done.stderr


def test_serve_on_a_port_in_use_prints_one_line(tmp_path: Path) -> None:
    """uvicorn started the app, then logged the bind error among six other lines and exited 3
    (2026-12-07 fuzz): the port is now bound before anything starts."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cmd = [sys.executable, "-m", "cli.main", "serve", "--port", str(port),
               "--database-url", f"sqlite:///{tmp_path / 'plans.db'}"]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=os.environ)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("repack serve: error: ")
    assert f"127.0.0.1:{port}" in lines[0] and "in use" in lines[0], lines[0]
