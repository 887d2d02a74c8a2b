"""HEAD over real HTTP (uvicorn, SQLite): monitoring probes and link checkers send ``HEAD``
to what they would ``GET`` (``curl -I /readyz``). HTTP asks a server to answer it as the
GET, without the body (RFC 9110, 9.3.2); before, every route answered 405."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from api.server import ServerThread
from tests.api.conftest import ServerFactory, small_request


@pytest.fixture
def client(tmp_path: Path, start_server: ServerFactory) -> Iterator[httpx.Client]:
    server: ServerThread = start_server(f"sqlite:///{tmp_path / 'plans.db'}")
    with httpx.Client(base_url=server.url, timeout=60) as c:
        assert c.post("/v1/plans", json=small_request("head-job", 0)).status_code == 200
        yield c


@pytest.mark.parametrize(
    "path", ["/healthz", "/readyz", "/dashboard", "/dashboard/jobs/head-job", "/v1/jobs"]
)
def test_head_answers_as_get_without_a_body(client: httpx.Client, path: str) -> None:
    got, head = client.get(path), client.head(path)
    assert got.status_code == 200 and got.content
    assert head.status_code == 200
    assert head.content == b""
    assert head.headers["content-type"] == got.headers["content-type"]
    assert head.headers["x-content-type-options"] == "nosniff"


def test_head_of_a_missing_resource_is_its_404(client: httpx.Client) -> None:
    path = "/dashboard/jobs/no-such-job"
    got, head = client.get(path), client.head(path)
    assert got.status_code == head.status_code == 404
    assert head.content == b""


def test_head_of_a_post_only_route_is_still_refused(client: httpx.Client) -> None:
    r = client.head("/v1/plans")
    assert r.status_code == 405
    assert "POST" in r.headers["allow"] and "HEAD" not in r.headers["allow"]
