"""Bearer tokens with per-job scope, and a per-client rate limit.

Tokens are configured in a file (``REPACK_TOKENS_FILE``, YAML or JSON) that holds only their
SHA-256 hashes, so the file can be read by operators and backed up without leaking a token::

    tokens:
      - name: loader-llama          # who holds it: log lines and the rate limit use this name
        sha256: 9f86d081884c7d65...  # sha256 hex of the token (``repack token`` prints both)
        jobs: ["llama-*"]           # job ids it may plan and read (fnmatch patterns, "*" = all)

A request authenticates with ``Authorization: Bearer <token>`` (the dashboard also accepts
HTTP Basic with the token as password, so a browser can log in). Without a token the request is
*anonymous*: allowed everything when anonymous access is enabled (``REPACK_ALLOW_ANONYMOUS``,
the default only for a loopback bind without tokens), else answered 401.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import time
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Annotated

import yaml
from fastapi import Depends, Request
from limits import RateLimitItem, parse
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter
from pydantic import BaseModel, ConfigDict, Field, model_validator

from api.problems import ProblemError

log = logging.getLogger("repack.auth")

ALL_JOBS = "*"


class TokenEntry(BaseModel):
    """One configured token: its holder's name, its hash, the jobs it may touch."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9._@-]+$")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="SHA-256 hex of the token.")
    jobs: list[str] = Field(min_length=1, description="fnmatch patterns of job ids; * = all.")


class TokensFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tokens: list[TokenEntry]

    @model_validator(mode="after")
    def _distinct(self) -> TokensFile:
        if len({t.sha256 for t in self.tokens}) != len(self.tokens):
            raise ValueError("the same token hash is listed twice")
        return self


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def load_tokens(path: Path) -> dict[str, TokenEntry]:
    """Tokens by hash; raises ``OSError``/``ValidationError`` (one-line CLI errors) when bad."""
    data = yaml.safe_load(path.read_text())
    return {entry.sha256: entry for entry in TokensFile.model_validate(data).tokens}


@dataclass(frozen=True)
class Principal:
    """Who is calling: a token's holder, or ``anonymous`` (only where that is enabled)."""

    name: str
    jobs: tuple[str, ...]

    @property
    def all_jobs(self) -> bool:
        return ALL_JOBS in self.jobs

    def may(self, job_id: str | None) -> bool:
        """May this caller plan or read ``job_id``? Plans without a job belong to no one."""
        if job_id is None or self.all_jobs:
            return True
        return any(fnmatchcase(job_id, pattern) for pattern in self.jobs)

    def require(self, job_id: str | None) -> None:
        if not self.may(job_id):
            raise ProblemError(
                403, "forbidden", f"token {self.name!r} is not scoped for job {job_id!r}"
            )

    def require_all(self) -> None:
        """Listings across jobs need a token scoped for every job."""
        if not self.all_jobs:
            raise ProblemError(403, "forbidden", f"token {self.name!r} is not scoped for all jobs")


ANONYMOUS = Principal("anonymous", (ALL_JOBS,))


class Authenticator:
    """Turns a request's credentials into a ``Principal`` and applies the rate limit."""

    def __init__(
        self,
        tokens: dict[str, TokenEntry],
        allow_anonymous: bool,
        rate_limit: str | None,
    ) -> None:
        self.tokens = tokens
        self.allow_anonymous = allow_anonymous
        self._limit: RateLimitItem | None = parse(rate_limit) if rate_limit else None
        self._limiter = MovingWindowRateLimiter(MemoryStorage())

    def authenticate(self, request: Request, *, browser: bool = False) -> Principal:
        token = _presented_token(request)
        if token is None:
            if self.allow_anonymous:
                return ANONYMOUS
            raise _unauthorized("a bearer token is required", browser)
        entry = self.tokens.get(token_hash(token))
        if entry is None:
            log.warning("rejected an unknown token", extra={"reason": "bad_token"})
            raise _unauthorized("unknown token", browser)
        return Principal(entry.name, tuple(entry.jobs))

    def check_rate(self, request: Request, principal: Principal) -> None:
        """At most ``rate_limit`` requests per client (token name, else client address)."""
        if self._limit is None:
            return
        client = principal.name
        if principal is ANONYMOUS:
            client = "ip:" + (request.client.host if request.client else "unknown")
        if self._limiter.hit(self._limit, client):
            return
        reset_at, _remaining = self._limiter.get_window_stats(self._limit, client)
        retry_after = max(1, int(reset_at - time.time()) + 1)
        request.app.state.metrics.rejected.labels(reason="rate_limit").inc()
        log.warning(
            "rate limit exceeded",
            extra={"client": client, "status": 429, "reason": "rate_limit"},
        )
        raise ProblemError(
            429,
            "rate-limited",
            f"more than {self._limit} requests from {client}; retry later",
            headers={"Retry-After": str(retry_after)},
        )


def _presented_token(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    value = value.strip()
    if scheme.lower() == "bearer" and value:
        return value
    if scheme.lower() == "basic" and value:
        try:
            _user, _, password = base64.b64decode(value, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return ""
        return password
    return ""  # some other scheme: a credential that matches no token


def _unauthorized(detail: str, browser: bool) -> ProblemError:
    challenge = 'Basic realm="repack"' if browser else 'Bearer realm="repack"'
    return ProblemError(401, "unauthorized", detail, headers={"WWW-Authenticate": challenge})


def _authenticator(request: Request) -> Authenticator:
    auth: Authenticator = request.app.state.auth
    return auth


def api_caller(request: Request) -> Principal:
    """Dependency of the ``/v1`` routes: authenticate, then count against the rate limit."""
    auth = _authenticator(request)
    principal = auth.authenticate(request)
    auth.check_rate(request, principal)
    request.state.principal = principal.name
    return principal


def browser_caller(request: Request) -> Principal:
    """Dependency of the dashboard pages: as ``api_caller``, with a Basic challenge on 401."""
    auth = _authenticator(request)
    principal = auth.authenticate(request, browser=True)
    auth.check_rate(request, principal)
    request.state.principal = principal.name
    return principal


Caller = Annotated[Principal, Depends(api_caller)]
BrowserCaller = Annotated[Principal, Depends(browser_caller)]
