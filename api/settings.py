"""Service settings: one pydantic-settings class, read from ``REPACK_*`` environment variables."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from api.hosts import is_loopback
from api.http_protocol import DEFAULT_HEAD_TIMEOUT_S
from api.storage import DbTimeouts

DEFAULT_DATA_DIR = Path("repack-data")
"""Where the embedded SQLite database lives when no URL is given (relative to the cwd)."""


def _default_workers() -> int:
    return max(1, os.cpu_count() or 1)


class Settings(BaseSettings):
    """Everything the service reads from its environment (prefix ``REPACK_``)."""

    model_config = SettingsConfigDict(env_prefix="REPACK_", extra="ignore")

    database_url: str = Field(
        default_factory=lambda: f"sqlite:///{DEFAULT_DATA_DIR / 'repack.db'}",
        description="SQLAlchemy URL; SQLite file by default, e.g. postgresql+psycopg://...",
    )
    host: str = Field("127.0.0.1", description="Address `repack serve` binds to.")
    port: int = Field(8000, ge=0, le=65535, description="Port `repack serve` listens on.")
    default_deadline_ms: int = Field(
        1000, gt=0, le=600_000, description="Deadline of a request that sets none."
    )
    deadline_margin_ms: float = Field(
        10.0,
        ge=0,
        description="Milliseconds of the deadline kept for IPC, storage and the response.",
    )
    min_solve_budget_ms: float = Field(
        1.0, gt=0, description="Smallest budget handed to the solver, even when late."
    )
    solver_workers: int = Field(
        default_factory=_default_workers, ge=1, description="Solver processes (default: cores)."
    )
    queue_limit: int = Field(
        16, ge=0, description="Solves that may wait for a worker; beyond it the service says 429."
    )
    retry_after_s: int = Field(1, ge=1, description="Least Retry-After of a 429 answer.")
    max_body_bytes: int = Field(
        16 * 1024 * 1024, ge=1024, description="Largest request body; larger ones get 413."
    )
    body_timeout_s: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="Longest silence while a request body arrives; then 408 (api/body_timeout.py).",
    )
    head_timeout_s: float = Field(
        DEFAULT_HEAD_TIMEOUT_S,
        gt=0,
        le=3600,
        description="Longest time a request head (request line and headers) may take from the "
        "connection (or its first byte); then 408 (api/http_protocol.py).",
    )
    plan_cache_size: int = Field(
        1024, ge=0, description="Plans kept in memory for idempotent replays."
    )
    recent_window: int = Field(
        100, ge=1, description="Plans behind the 'recent' gap and speed-up gauges."
    )
    page_limit: int = Field(100, ge=1, le=10_000, description="Default page size of listings.")
    log_level: str = Field("info", description="uvicorn log level.")

    # Operations (issue 10): authentication, rate limit, logs.
    tokens_file: Path | None = Field(
        None, description="YAML/JSON file of token hashes and their job scopes (api/auth.py)."
    )
    allow_anonymous: bool | None = Field(
        None,
        description="Serve requests without a token; default: only on a loopback bind "
        "without a tokens file.",
    )
    rate_limit: str | None = Field(
        "1200/minute",
        description="Requests per client (token, else address), e.g. 600/minute; empty = off.",
    )
    log_format: Literal["json", "text"] = Field("json", description="Service log format.")

    @property
    def anonymous_allowed(self) -> bool:
        if self.allow_anonymous is not None:
            return self.allow_anonymous
        return self.tokens_file is None and is_loopback(self.host)

    @model_validator(mode="after")
    def _someone_can_call(self) -> Settings:
        if self.tokens_file is None and not self.anonymous_allowed:
            raise ValueError(
                f"host {self.host} is not loopback and no REPACK_TOKENS_FILE is set: "
                "configure tokens, or set REPACK_ALLOW_ANONYMOUS=true to serve anyone"
            )
        return self

    # Database faults: every wait is bounded, and shorter than a request's deadline.
    db_timeout_ms: int = Field(
        500,
        ge=10,
        le=60_000,
        description="Longest wait for one database call (statement, lock, free connection); "
        "past it the answer is 503 + Retry-After.",
    )
    db_connect_timeout_s: float = Field(
        2.0, ge=1, le=60, description="Opening a PostgreSQL connection (libpq: at least 2 s)."
    )
    ready_timeout_ms: int = Field(
        1000, ge=10, le=60_000, description="/readyz answers within this, database or not."
    )
    retention_days: float = Field(
        0, ge=0, description="Delete plans older than this many days (0: keep forever)."
    )
    retention_interval_s: float = Field(
        3600, gt=0, description="How often the retention sweep runs."
    )

    # Work per request and per solver worker.
    max_samples: int = Field(
        16_384, ge=1, description="Most samples in one request (422 naming body.lengths)."
    )
    max_samples_x_ranks: int = Field(
        2**24, ge=1, description="Most samples x ranks (GPUs) in one request (422)."
    )
    max_ranks: int = Field(
        16_384, ge=1, description="Most ranks (nodes x GPUs) in one request (422 naming cluster)."
    )
    hard_stop_factor: float = Field(
        5.0, ge=1, description="A solve running this many times its deadline is killed."
    )
    hard_stop_min_ms: float = Field(
        2000, ge=0, description="A solve is never killed sooner than this."
    )
    worker_memory_mb: int = Field(
        4096, ge=0, description="Address-space limit of a solver worker (0: none)."
    )
    worker_max_tasks: int = Field(
        1000, ge=0, description="Solves after which a worker is replaced (0: never)."
    )


def db_timeouts(settings: Settings) -> DbTimeouts:
    """The storage layer's limits from the settings (every one within ``db_timeout_ms``)."""
    return DbTimeouts(
        connect_s=settings.db_connect_timeout_s,
        statement_ms=settings.db_timeout_ms,
        pool_s=settings.db_timeout_ms / 1e3,
    )


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read once from the environment."""
    return Settings()
