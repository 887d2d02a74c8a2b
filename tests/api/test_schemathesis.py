"""Property-based API tests from the OpenAPI schema (schemathesis), against a real server:
whatever the body, types, sizes or content type, the service never answers 5xx, and its
answers conform to the documented status codes and media types."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import content_type_conformance, status_code_conformance

from api.main import create_app
from api.server import ServerThread
from tests.api.conftest import make_settings

MAX_EXAMPLES = 100
"""Per operation; with positive and negative generation this stays within seconds."""


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    db = tmp_path_factory.mktemp("schemathesis") / "plans.db"
    # A short default deadline keeps generated (possibly large) steps quick.
    # No rate limit: the generated cases should reach the handlers, not the limiter.
    server_settings = make_settings(f"sqlite:///{db}", default_deadline_ms=200, rate_limit=None)
    with ServerThread(server_settings) as server:
        yield server


# The schema comes from the app itself (no server needed to collect); cases go over HTTP.
schema = schemathesis.openapi.from_dict(create_app(make_settings("sqlite://")).openapi())


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_no_request_gets_a_server_error(case: Any, live_server: ServerThread) -> None:
    response = case.call(base_url=live_server.url, timeout=120)
    case.validate_response(
        response,
        checks=[not_a_server_error, status_code_conformance, content_type_conformance],
    )
