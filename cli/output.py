"""Writing results: atomic files and plain-text tables."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path

WRITE_BITS = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH


def write_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the whole new one.

    The text goes to a temporary file in the same directory (same file system), is flushed to
    disk, then renamed over ``path``; on any error the temporary file is removed. A symlink is
    followed (its target gets the text, the link stays), an existing file keeps its mode and a
    new one gets the umask's, and a path that is not a regular file (a FIFO, ``/dev/stdout``)
    is written in place: renaming over it would replace it, not feed it. A write-protected
    file (no write bit at all, 0444) is refused, left as it was.
    """
    if os.path.exists(path) and not os.path.isfile(path):  # both follow symlinks
        # ``/dev/stdout`` of a pipe resolves to "pipe:[N]", which no path names: open the
        # path given, not its real path
        try:
            with open(path, "w") as f:  # a directory raises IsADirectoryError, naming it
                f.write(text)
        except OSError as exc:  # a full device's ENOSPC named no file
            raise OSError(exc.errno, exc.strerror, str(path)) from None
        return
    path = Path(os.path.realpath(path))
    mode = stat.S_IMODE(path.stat().st_mode) if path.exists() else 0o666 & ~_umask()
    if path.exists() and not mode & WRITE_BITS:
        # Renaming over a file needs only its directory's permission, so a plan someone made
        # read-only would be replaced where `>` would fail: refuse it, as root too.
        raise PermissionError(errno.EACCES, "write-protected file, not replaced", str(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:  # name the file the user asked for, not the temporary one
        why = f"cannot create a file beside it to replace it atomically ({exc.strerror})"
        raise OSError(exc.errno, why, str(path)) from None
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    """The process's umask (reading it means setting it: set it straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]], *, left: int = 1) -> str:
    """A Markdown table (also readable in a terminal); the first ``left`` columns are
    left-aligned, the others (numbers) right-aligned."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        padded = [
            c.ljust(w) if i < left else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "| " + " | ".join(padded) + " |"

    rule = ["-" * (w + 2) if i < left else "-" * (w + 1) + ":" for i, w in enumerate(widths)]
    return "\n".join([line(header), "|" + "|".join(rule) + "|", *map(line, rows)])
