"""Files a hostile-input hunt fed the CLI (2026-12-07): each printed a traceback (binary data,
nesting past the recursion limit, a 5,000-digit integer, plans naming samples that do not
exist), or ``--out`` replaced what it named (a symlink, a FIFO) with a new 0600 file."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.cli.helpers import EXAMPLE_REQUEST, ROOT, Repack, assert_one_line_error


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("binary.json", b"\xff\xfe\x00garbage", "not UTF-8 text"),
        ("deep.json", b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        ("deep.yaml", b"a: " + b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        ("bigint.json", b'{"lengths": [' + b"9" * 5000 + b"]}", "more than 4300 digits"),
    ],
)
def test_unreadable_documents_are_one_line_errors(
    repack: Repack, tmp_path: Path, name: str, content: bytes, expected: str
) -> None:
    bad = tmp_path / name
    bad.write_bytes(content)
    proc = repack("solve", bad)
    assert_one_line_error(proc, expected, str(bad))
    plan = tmp_path / "plan.json"
    assert repack("solve", EXAMPLE_REQUEST, "--out", plan).returncode == 0
    assert_one_line_error(repack("validate", EXAMPLE_REQUEST, bad), expected)


def test_out_through_a_symlink_writes_its_target(repack: Repack, tmp_path: Path) -> None:
    target = tmp_path / "real.json"
    target.write_text("{}")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    assert repack("solve", EXAMPLE_REQUEST, "--out", link).returncode == 0
    assert link.is_symlink()
    assert '"parents"' in target.read_text()


def test_out_to_a_fifo_feeds_it(repack: Repack, tmp_path: Path) -> None:
    fifo = tmp_path / "plan.fifo"
    os.mkfifo(fifo)
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    proc = repack("solve", EXAMPLE_REQUEST, "--out", fifo)
    reader.join(timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    assert got and '"parents"' in got[0]


def test_out_keeps_the_file_mode_or_follows_the_umask(repack: Repack, tmp_path: Path) -> None:
    fresh = tmp_path / "fresh.json"
    old = os.umask(0o022)
    try:
        assert repack("solve", EXAMPLE_REQUEST, "--out", fresh).returncode == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o644
    kept = tmp_path / "kept.json"
    kept.write_text("old")
    kept.chmod(0o640)
    assert repack("solve", EXAMPLE_REQUEST, "--out", kept).returncode == 0
    assert stat.S_IMODE(kept.stat().st_mode) == 0o640


def test_out_onto_a_write_protected_file_is_refused(repack: Repack, tmp_path: Path) -> None:
    """A plan made read-only (0444) is one someone meant to keep: the rename used to replace
    it (renaming needs only the directory's permission), now it is a one-line error that
    leaves it as it was. A file only its owner may write is still replaced."""
    kept = tmp_path / "kept.json"
    kept.write_text("old")
    kept.chmod(0o444)
    proc = repack("solve", EXAMPLE_REQUEST, "--out", kept)
    assert_one_line_error(proc, str(kept), "write-protected")
    assert kept.read_text() == "old" and stat.S_IMODE(kept.stat().st_mode) == 0o444
    assert [p.name for p in tmp_path.iterdir()] == ["kept.json"]  # no temporary file left
    kept.chmod(0o600)
    assert repack("solve", EXAMPLE_REQUEST, "--out", kept).returncode == 0
    assert '"parents"' in kept.read_text()


def test_out_to_a_directory_is_one_line_error(repack: Repack, tmp_path: Path) -> None:
    assert_one_line_error(repack("solve", EXAMPLE_REQUEST, "--out", tmp_path), str(tmp_path))


def test_out_to_dev_stdout_of_a_pipe(tmp_path: Path) -> None:
    """``--out /dev/stdout`` with stdout a pipe failed: the real path of the descriptor is
    ``pipe:[N]``, which no file is (a re-check hunt, 2026-12-07)."""
    proc = subprocess.run(
        [sys.executable, "-m", "cli.main", "solve", str(EXAMPLE_REQUEST), "--out", "/dev/stdout"],
        cwd=ROOT,
        capture_output=True,  # stdout is a pipe
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert '"parents"' in proc.stdout


def test_a_long_yaml_list_is_read_by_libyaml(repack: Repack, tmp_path: Path) -> None:
    """A 2 MB YAML request of 10^6 lengths took 33 s to parse before it was refused (the
    pure-Python loader); libyaml reads it in a few seconds and the refusal is one line."""
    big = tmp_path / "big.yaml"
    big.write_text("lengths: [" + ",".join(["123456"] * 1_000_000) + "]\n")
    proc = repack("solve", big, timeout=30)
    assert_one_line_error(proc, "lengths")
