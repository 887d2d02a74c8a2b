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

from solver.errors import DocumentError, PlanningError

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
    DocumentError,
    InputError,
)
"""Exceptions that mean bad input; any other exception is a bug and keeps its traceback."""

_PYDANTIC_PREFIXES = ("Value error, ", "Assertion failed, ")

EXTRA_OF_MODULE = {
    **dict.fromkeys(
        (
            "fastapi",
            "starlette",
            "uvicorn",
            "jinja2",
            "sqlalchemy",
            "psycopg",
            "pydantic_settings",
            "prometheus_client",
            "plotly",
            "httpx",
            "asgi_correlation_id",
            "pythonjsonlogger",
            "limits",
            "swagger_ui_bundle",
            "alembic",
            "cachetools",
        ),
        "api",
    ),
    "torch": "runtime",
}
"""Third-party modules that only an optional extra installs, and which extra that is."""


def missing_extra(exc: ModuleNotFoundError) -> str | None:
    """The extra to install when ``exc`` is a module of an optional extra, else None."""
    top = (exc.name or "").split(".")[0]
    return EXTRA_OF_MODULE.get(top)


def format_loc(loc: Sequence[int | str]) -> str:
    """``("lengths", 3)`` -> ``lengths[3]``; ``("cluster", "nodes")`` -> ``cluster.nodes``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _validation_line(exc: ValidationError) -> str:
    errors = exc.errors(include_url=False)
    unknown = [format_loc(e["loc"]) for e in errors if e["type"] == "extra_forbidden"]
    others = [e for e in errors if e["type"] != "extra_forbidden"]
    if not unknown:
        count = len(others) - 1
        return _one_error(others[0]) + (
            f" (and {count} more error{'s' * (count > 1)})" * (count > 0)
        )
    # A misspelled key ("lenghts") also makes the real one missing: name the typo first.
    line = f"unknown field{'s' * (len(unknown) > 1)} {', '.join(unknown)}"
    if others:
        n = len(others)
        line += f" (and {n} more error{'s' * (n > 1)}: {_one_error(others[0])})"
    return line


def _one_error(error: Any) -> str:
    first: dict[str, Any] = dict(error)
    loc, msg = format_loc(first["loc"]), str(first["msg"])
    for prefix in _PYDANTIC_PREFIXES:
        msg = msg.removeprefix(prefix)
    if first["type"] == "extra_forbidden":
        return f"unknown field {loc}"
    if first["type"] == "missing":
        msg = "required field is missing"
    # Validators that name the offending item themselves ("lengths[3] = 0 ...") need no prefix.
    return msg if not loc or msg.startswith(loc) else f"{loc}: {msg}"


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
        except ModuleNotFoundError as exc:
            extra = missing_extra(exc)
            if extra is None:
                raise
            return fail(
                f"this command needs the {extra} extra: pip install 'repack[{extra}]' "
                f"(module {exc.name} is missing)"
            )
        except KeyboardInterrupt:
            print(f"{PROG}: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED

    wrapper.__doc__ = run.__doc__
    return wrapper
