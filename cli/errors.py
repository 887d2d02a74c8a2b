"""Bad input becomes one line on stderr and exit code 2, the same for every subcommand.

Bad input is anything the user can fix: a missing file, a file that is not JSON/YAML, a request
or scenario that fails schema validation, a request the planner cannot plan
(``PlanningError``). Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from solver.errors import PlanningError

PROG = "repack"
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141
"""128 + SIGPIPE, what a shell reports for a writer whose reader left (``repack ... | head``)."""


class InputError(Exception):
    """Bad input already described in one line; picklable, so it can leave a worker process
    (``PlanningError`` cannot: its constructor takes two arguments)."""


INPUT_ERRORS = (
    OSError,
    json.JSONDecodeError,
    yaml.YAMLError,
    ValidationError,
    PlanningError,
    InputError,
)
"""Exceptions that mean bad input; any other exception is a bug and keeps its traceback."""

_PYDANTIC_PREFIXES = ("Value error, ", "Assertion failed, ")


def format_loc(loc: Sequence[int | str]) -> str:
    """``("lengths", 3)`` -> ``lengths[3]``; ``("cluster", "nodes")`` -> ``cluster.nodes``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _validation_line(exc: ValidationError) -> str:
    errors = exc.errors(include_url=False)
    first: dict[str, Any] = dict(errors[0])
    loc, msg = format_loc(first["loc"]), str(first["msg"])
    for prefix in _PYDANTIC_PREFIXES:
        msg = msg.removeprefix(prefix)
    if first["type"] == "extra_forbidden":
        msg = "unknown field"
    elif first["type"] == "missing":
        msg = "required field is missing"
    # Validators that name the offending item themselves ("lengths[3] = 0 ...") need no prefix.
    line = msg if not loc or msg.startswith(loc) else f"{loc}: {msg}"
    more = len(errors) - 1
    return line + (f" (and {more} more error{'s' * (more > 1)})" if more else "")


def _os_line(exc: OSError) -> str:
    if exc.filename is not None and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    return str(exc)


def describe(exc: BaseException) -> str:
    """One line that says what is wrong with the input and where."""
    if isinstance(exc, ValidationError):
        line = _validation_line(exc)
    elif isinstance(exc, json.JSONDecodeError):
        line = f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
    elif isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        line = f"invalid YAML at line {mark.line + 1} column {mark.column + 1}: {exc.problem}"
    elif isinstance(exc, yaml.YAMLError):
        line = "invalid YAML: " + " ".join(str(exc).split())
    elif isinstance(exc, OSError):
        line = _os_line(exc)
    else:
        line = " ".join(str(exc).split())
    notes = getattr(exc, "__notes__", [])
    return line + "".join(f" ({note})" for note in notes)


@contextmanager
def reading(path: str | Path) -> Iterator[None]:
    """Name ``path`` in an input error raised inside, unless the error names its file already
    (OS errors, or a note added closer to the file, e.g. by ``load_trace`` in a directory)."""
    try:
        yield
    except INPUT_ERRORS as exc:
        if not isinstance(exc, OSError) and not getattr(exc, "__notes__", None):
            exc.add_note(f"in {path}")
        raise


def fail(message: str) -> int:
    """Print ``repack: error: MESSAGE`` on stderr and return the bad-input exit code."""
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def guarded(run: Callable[[Any], int]) -> Callable[[Any], int]:
    """Wrap a subcommand: bad input -> one line + exit 2; Ctrl-C -> one line + exit 130;
    a closed stdout pipe -> exit 141 without a word."""

    def wrapper(args: Any) -> int:
        try:
            return run(args)
        except BrokenPipeError:
            # The reader closed stdout: stop quietly, and keep Python's exit-time flush of
            # stdout from raising again.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return EXIT_BROKEN_PIPE
        except INPUT_ERRORS as exc:
            return fail(describe(exc))
        except KeyboardInterrupt:
            print(f"{PROG}: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED

    wrapper.__doc__ = run.__doc__
    return wrapper
