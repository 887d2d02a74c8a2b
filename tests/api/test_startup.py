"""Starting against a database that cannot be opened ends with one clear line, no traceback,
and no password in it."""

from __future__ import annotations

import os
import subprocess
import sys

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
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("repack serve: error: ")
    assert "Traceback" not in done.stderr
    assert "s3cret" not in done.stderr
