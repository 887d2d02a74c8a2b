"""Options and output paths a fuzz of the CLI fed it (2026-12-07, second): each was taken
without a word (``--indent 100000000`` grew to gigabytes, ``--deadline-ms`` past the schema's
limit, ``--out ''`` wrote to stdout) or failed without naming the file it was about."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.cli.helpers import EXAMPLE_REQUEST, Repack, assert_one_line_error


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--indent", "100000000"], "--indent"),
        (["--indent", "17"], "--indent"),
        (["--deadline-ms", "99999999999999999999"], "--deadline-ms"),
        (["--deadline-ms", "600001"], "--deadline-ms"),
        (["--out", ""], "--out"),
    ],
)
def test_out_of_range_options_are_one_line_errors(
    repack: Repack, args: list[str], expected: str
) -> None:
    proc = repack("solve", EXAMPLE_REQUEST, *args, timeout=30)
    assert_one_line_error(proc, expected)
    assert proc.stdout == ""


def test_options_at_their_limits_still_work(repack: Repack, tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    proc = repack(
        "solve", EXAMPLE_REQUEST, "--indent", "16", "--deadline-ms", "600000", "--out", out
    )
    assert proc.returncode == 0, proc.stderr
    assert out.read_text().startswith("{\n" + " " * 16 + '"')


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_a_full_device_is_named(repack: Repack) -> None:
    assert_one_line_error(repack("solve", EXAMPLE_REQUEST, "--out", "/dev/full"), "/dev/full")


def test_a_file_in_a_directory_that_takes_no_new_files_is_named(repack: Repack) -> None:
    """``/proc/self/comm`` exists and may be written, but nothing can be created beside it:
    the error says so instead of 'No such file or directory'. (``/proc/version``, read-only,
    is refused before that as write-protected.)"""
    if not os.path.isfile("/proc/self/comm") or not os.path.isfile("/proc/version"):
        pytest.skip("no /proc")
    proc = repack("solve", EXAMPLE_REQUEST, "--out", "/proc/self/comm")
    assert_one_line_error(proc, "/comm", "beside")
    proc = repack("solve", EXAMPLE_REQUEST, "--out", "/proc/version")
    assert_one_line_error(proc, "/proc/version", "write-protected")
