"""Run the real `repack` command line in a subprocess, from the repository root."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.helpers import ROOT, Repack


@pytest.fixture
def repack() -> Repack:
    """``repack(*args)`` runs ``python -m cli.main *args`` and returns the finished process."""

    def run(*args: str | Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "cli.main", *map(str, args)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    return run
