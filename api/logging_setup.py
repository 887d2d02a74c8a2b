"""Structured service logs: one JSON object per line on stderr, each with the request id.

The request id comes from ``asgi-correlation-id`` (the client's ``X-Request-ID`` when it sends a
valid one, else a fresh UUID, echoed in the response); ``python-json-logger`` formats the record
and every ``extra={...}`` field of a log call becomes a key of the JSON object. uvicorn's own
loggers propagate to the same handler, so an operator's log pipeline sees one format.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

from asgi_correlation_id import correlation_id
from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter

JSON_FIELDS = "{asctime}{levelname}{name}{message}"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"

_MARK = "_repack_handler"


class RequestIdFilter(logging.Filter):
    """Stamps each record with the current request's id (``-`` outside a request), unless the
    log call passed one itself."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = correlation_id.get() or "-"
        return True


def configure_logging(log_format: str, level: str) -> None:
    """Install the service's handler on the root logger (once per process)."""
    root = logging.getLogger()
    if any(getattr(h, _MARK, False) for h in root.handlers):
        return
    handler = build_handler(sys.stderr, log_format)
    setattr(handler, _MARK, True)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # Python warnings (numpy's overflow warnings of a refit, say) as log records: they were
    # printed raw, several lines each, into the JSON log (2026-12-07 fuzz).
    logging.captureWarnings(True)
    logging.getLogger("alembic").setLevel(logging.WARNING)  # one line per migration step


def build_handler(stream: TextIO, log_format: str) -> logging.Handler:
    """A handler writing ``json`` lines (or ``text``) with the request id to ``stream``."""
    handler = logging.StreamHandler(stream)
    handler.addFilter(RequestIdFilter())
    formatter: logging.Formatter
    if log_format == "json":
        formatter = JsonFormatter(
            JSON_FIELDS,
            style="{",
            rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
            reserved_attrs=[*RESERVED_ATTRS, "color_message"],  # uvicorn's ANSI-coloured copy
        )
    else:
        formatter = logging.Formatter(TEXT_FORMAT)
    handler.setFormatter(formatter)
    return handler
