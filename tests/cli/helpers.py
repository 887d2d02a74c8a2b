"""Paths and assertions shared by the CLI tests."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

from tests.helpers import ROOT, example_path

SCENARIOS = ROOT / "solver" / "scenarios"
EXAMPLE_REQUEST = example_path("request-2node.json")
SMALL_TRACE = SCENARIOS / "gpu16-small.yaml"
REQUEST_DIR = SCENARIOS / "gpu16-requests"

Repack = Callable[..., subprocess.CompletedProcess[str]]


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *expected: str) -> None:
    """Exit code 2, no traceback, exactly one stderr line naming the problem."""
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("repack: error: ")
    assert "Traceback" not in proc.stderr
    for text in expected:
        assert text in lines[0], lines[0]
