"""Fixtures for the service tests: real databases (SQLite file, PostgreSQL schema) and real
uvicorn servers on free loopback ports."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, text

from api.server import ServerThread, free_port
from api.settings import Settings

POSTGRES_ENV = "REPACK_TEST_POSTGRES_URL"

SMALL_REQUEST: dict[str, Any] = {
    "cluster": {"nodes": 2},
    "lengths": [150000, 9000, 30000, 4000, 4000, 1200, 800, 52000],
}
"""The contract example's step (2 nodes x 8 GPUs); solves in a few milliseconds."""


def small_request(job_id: str, step: int, **extra: Any) -> dict[str, Any]:
    return {**SMALL_REQUEST, "job_id": job_id, "step": step, **extra}


@pytest.fixture(scope="session")
def postgres_url() -> str:
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        pytest.skip(f"{POSTGRES_ENV} is not set (make test sets it; see the Makefile)")
    return url


def _postgres_schema(base_url: str) -> Iterator[str]:
    """A fresh schema per use, dropped afterwards, so reruns start clean."""
    schema = f"repack_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base_url)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    sep = "&" if "?" in base_url else "?"
    try:
        yield f"{base_url}{sep}options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database URL for each backend: an SQLite file and a PostgreSQL schema."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'plans.db'}"
        return
    yield from _postgres_schema(request.getfixturevalue("postgres_url"))


def make_settings(db_url: str, **overrides: Any) -> Settings:
    return Settings(database_url=db_url, port=free_port(), log_level="warning", **overrides)


ServerFactory = Callable[..., ServerThread]


@pytest.fixture
def start_server() -> Iterator[ServerFactory]:
    """Start real uvicorn servers (``start_server(db_url, **settings)``); all stop at teardown."""
    servers: list[ServerThread] = []

    def start(db_url: str, **overrides: Any) -> ServerThread:
        server = ServerThread(make_settings(db_url, **overrides)).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def server(db_url: str, start_server: ServerFactory) -> ServerThread:
    return start_server(db_url)


@pytest.fixture
def client(server: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def metric_value(exposition: str, name: str, **labels: str) -> float:
    """Sum of the samples called ``name`` whose labels include ``labels`` (0 if none)."""
    total = 0.0
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                total += sample.value
    return total
