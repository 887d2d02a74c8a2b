"""RFC 9457 problem details: every 4xx/5xx answer is ``application/problem+json``."""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from itertools import islice
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.errors import (
    DatabaseUnavailable,
    IdempotencyConflict,
    JobNotFound,
    PlanNotFound,
    RequestTooLarge,
    Saturated,
    ServiceError,
    SolveElsewhere,
    SolverUnavailable,
)
from solver.errors import PlanningError

PROBLEM_MEDIA_TYPE = "application/problem+json"
PROBLEM_TYPE_PREFIX = "urn:repack:problem:"
MAX_LISTED_ERRORS = 20
"""A 422 lists at most this many bad inputs (the first ones, unknown fields first) and counts
the rest in ``errors_omitted``: a body with a million bad entries gets an answer of a few KB, and
only the listed errors are turned into ``FieldError``s."""
MAX_LOCATION_CHARS = 200
MAX_DETAIL_CHARS = 1000
"""Longer locations and details (an unknown key of a megabyte) are clipped in the answer."""
log = logging.getLogger(__name__)


class FieldError(BaseModel):
    """One bad input, located like ``body.lengths[3]`` or ``query.limit``."""

    location: str
    detail: str
    type: str


class Problem(BaseModel):
    """RFC 9457 problem details with an ``errors`` list (empty unless inputs were bad)."""

    type: str = Field("about:blank", description="Problem type URI.")
    title: str
    status: int
    detail: str
    instance: str = Field(..., description="Path of the request that failed.")
    errors: list[FieldError] = Field(default_factory=list)
    errors_omitted: int = Field(
        0,
        ge=0,
        description=f"Bad inputs not listed in errors (at most {MAX_LISTED_ERRORS} are listed).",
    )


class ProblemError(StarletteHTTPException):
    """Raised to answer with a problem; ``slug`` names the problem type.

    It is an ``HTTPException`` so that FastAPI passes it through unchanged even when it is
    raised while the body is read (the body-size limit).
    """

    def __init__(
        self, status: int, slug: str, detail: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(status, detail, headers)
        self.slug = slug


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries documenting problem answers for ``statuses``."""
    ref = {"$ref": "#/components/schemas/Problem"}
    return {
        status: {
            "model": Problem,
            "description": HTTPStatus(status).phrase,
            "content": {PROBLEM_MEDIA_TYPE: {"schema": ref}},
        }
        for status in statuses
    }


def format_location(loc: Sequence[int | str]) -> str:
    """``("body", "lengths", 3)`` -> ``body.lengths[3]``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def problem_response(
    request: Request,
    status: int,
    detail: str,
    *,
    slug: str | None = None,
    errors: list[FieldError] | None = None,
    errors_omitted: int = 0,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    body = Problem(
        type=PROBLEM_TYPE_PREFIX + slug if slug else "about:blank",
        title=HTTPStatus(status).phrase,
        status=status,
        detail=detail,
        instance=request.url.path,
        errors=errors or [],
        errors_omitted=errors_omitted,
    )
    return JSONResponse(
        body.model_dump(), status_code=status, headers=headers, media_type=PROBLEM_MEDIA_TYPE
    )


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _first_errors(errors: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The first ``MAX_LISTED_ERRORS`` errors, unknown fields first: a misspelled key
    ("lenghts") also makes the real one missing, and the typo is what to fix. One cheap pass
    over the errors, with no object made for the ones left out."""
    typo = "extra_forbidden"
    listed = [e for e in errors if e.get("type") == typo][:MAX_LISTED_ERRORS]
    if len(listed) < MAX_LISTED_ERRORS:
        others = (e for e in errors if e.get("type") != typo)
        listed += islice(others, MAX_LISTED_ERRORS - len(listed))
    return listed


def _field_error(err: Mapping[str, Any]) -> FieldError:
    return FieldError(
        location=_clip(format_location(err.get("loc", ())), MAX_LOCATION_CHARS),
        detail=_clip(_detail(err), MAX_DETAIL_CHARS),
        type=_clip(str(err.get("type", "value_error")), MAX_LOCATION_CHARS),
    )


def _validation_errors(
    exc: RequestValidationError, content_type: str = ""
) -> tuple[list[FieldError], int]:
    """The listed errors and how many more there were."""
    errors = exc.errors()
    listed = [_field_error(_readable(err, content_type)) for err in _first_errors(errors)]
    return listed, len(errors) - len(listed)


def _detail(err: Mapping[str, Any]) -> str:
    if err.get("type") == "extra_forbidden" and err.get("loc"):
        return f"unknown field {err['loc'][-1]}"
    return str(err.get("msg", "invalid"))


def _readable(err: Mapping[str, Any], content_type: str) -> Mapping[str, Any]:
    """FastAPI's errors about the body as a whole, reworded to say what is wrong: invalid JSON
    was "JSON decode error" at ``body[17]`` (a character offset that reads like an index), and
    a body not sent as JSON "Input should be a valid dictionary"."""
    loc = tuple(err.get("loc", ()))
    if err.get("type") == "json_invalid" and len(loc) == 2 and loc[0] == "body":
        reason = (err.get("ctx") or {}).get("error", "")
        msg = f"invalid JSON at character {loc[1]}" + (f": {reason}" if reason else "")
        return {**err, "loc": ("body",), "msg": msg}
    if loc == ("body",) and isinstance(err.get("input"), bytes | bytearray):
        msg = "the body is read as JSON only with Content-Type application/json, got "
        msg += repr(content_type)
        return {**err, "msg": msg}
    return err


def _unreadable_body(request: Request, exc: StarletteHTTPException) -> str:
    """Why FastAPI could not parse a body (its 400 says only "There was an error parsing the
    body"); a Content-Encoding is named, since bodies are not decompressed."""
    cause = exc.__cause__
    if isinstance(cause, RecursionError):
        why = "the JSON is nested too deeply"
    elif isinstance(cause, UnicodeDecodeError):
        why = "the body is not UTF-8 text"
    elif isinstance(cause, ValueError) and "digits" in str(cause):
        why = f"an integer has more than {sys.get_int_max_str_digits()} digits"
    else:
        why = str(exc.detail)
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        why += f" (Content-Encoding {encoding}: request bodies are not decompressed)"
    return why


async def _on_validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors, omitted = _validation_errors(exc, request.headers.get("content-type", ""))
    where = ", ".join(
        f"unknown field {e.location}" if e.type == "extra_forbidden" else e.location
        for e in errors[:5]
    )
    more = len(errors) - 5 + omitted
    if more > 0:
        where += f" and {more} more"
    return problem_response(
        request,
        422,
        f"invalid request: {where}",
        slug="validation-error",
        errors=errors,
        errors_omitted=omitted,
    )


async def _on_planning(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, PlanningError)
    error = FieldError(location=f"body.{exc.field}", detail=exc.message, type="planning_error")
    return problem_response(request, 422, str(exc), slug="planning-error", errors=[error])


SERVICE_ERRORS: dict[type[ServiceError], tuple[int, str]] = {
    DatabaseUnavailable: (503, "database-unavailable"),
    Saturated: (429, "saturated"),
    SolverUnavailable: (503, "solver-unavailable"),
    SolveElsewhere: (503, "plan-in-progress"),
    IdempotencyConflict: (409, "idempotency-conflict"),
    PlanNotFound: (404, "plan-not-found"),
    JobNotFound: (404, "job-not-found"),
    RequestTooLarge: (422, "request-too-large"),
}
"""The one mapping from the service's domain errors to status codes and problem types."""


async def _on_service_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ServiceError)
    status, slug = SERVICE_ERRORS.get(type(exc), (500, "internal"))
    if status in (429, 503) and not isinstance(exc, DatabaseUnavailable):  # that one: storage
        log.warning(
            "answered %d %s: %s",
            status,
            slug,
            exc.message,
            extra={
                "status": status,
                "reason": getattr(exc, "reason", slug),
                "path": request.url.path,
            },
        )
    headers = None if exc.retry_after_s is None else {"Retry-After": str(exc.retry_after_s)}
    errors = None
    if isinstance(exc, RequestTooLarge):
        location = f"body.{exc.field}"
        errors = [FieldError(location=location, detail=exc.message, type="too_large")]
    return problem_response(request, status, exc.message, slug=slug, errors=errors, headers=headers)


async def _on_problem(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ProblemError)
    if exc.status_code >= 500:
        log.warning(
            "answered %d %s: %s",
            exc.status_code,
            exc.slug,
            exc.detail,
            extra={"status": exc.status_code, "reason": exc.slug, "path": request.url.path},
        )
    return problem_response(
        request, exc.status_code, exc.detail, slug=exc.slug, headers=exc.headers
    )


async def _on_http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    errors = None
    detail = str(exc.detail)
    if exc.status_code == 400:  # FastAPI's answer to a body it cannot decode (e.g. not UTF-8)
        detail = _unreadable_body(request, exc)
        errors = [FieldError(location="body", detail=detail, type="body_unreadable")]
    return problem_response(request, exc.status_code, detail, errors=errors, headers=exc.headers)


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s", request.url.path, exc_info=exc)
    # The server closes the connection after an unhandled error; saying so lets a keep-alive
    # client open a new one instead of failing its next request on a reset.
    return problem_response(
        request,
        500,
        "internal error; see the service log",
        slug="internal",
        headers={"Connection": "close"},
    )


def install_problem_handlers(app: FastAPI) -> None:
    """Route every error the app can raise to a problem+json answer."""
    app.add_exception_handler(RequestValidationError, _on_validation)
    app.add_exception_handler(PlanningError, _on_planning)
    app.add_exception_handler(ServiceError, _on_service_error)
    app.add_exception_handler(ProblemError, _on_problem)
    app.add_exception_handler(StarletteHTTPException, _on_http)
    app.add_exception_handler(Exception, _on_unexpected)
