"""Hostile input over real HTTP: control characters and '/' in job ids, NUL in every path
parameter (PostgreSQL cannot store NUL), work no deadline can serve, and a 500 that says
``Connection: close`` instead of dropping a keep-alive connection."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI

from api.server import ServerThread
from tests.api.conftest import ServerFactory, small_request

BAD_JOB_IDS = ["a\x00b", "a/b", "tab\there", "new\nline", "del\x7f", "\x1b[31m"]


@pytest.mark.parametrize("job_id", BAD_JOB_IDS)
def test_bad_job_id_is_422_naming_the_field(client: httpx.Client, job_id: str) -> None:
    r = client.post("/v1/plans", json=small_request(job_id, 0))
    assert r.status_code == 422
    assert r.json()["errors"][0]["location"] == "body.job_id"


@pytest.mark.parametrize(
    "path",
    [
        "/v1/plans/a%00b",
        "/v1/plans/%00",
        "/v1/jobs/a%00b/steps",
        "/v1/jobs/%01/steps",
        "/v1/jobs?after=a%00",
        "/dashboard/jobs/a%00b",
        "/dashboard/plans/x%00-1",
    ],
)
def test_nul_in_path_or_query_is_422_not_500(client: httpx.Client, path: str) -> None:
    r = client.get(path)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert client.get("/healthz").status_code == 200


def test_delete_with_nul_is_422(client: httpx.Client) -> None:
    assert client.delete("/v1/jobs/a%00b").status_code == 422


def test_a_million_lengths_is_refused_naming_the_field(client: httpx.Client) -> None:
    r = client.post("/v1/plans", json={"cluster": {"nodes": 4}, "lengths": [1] * 1_000_000})
    assert r.status_code == 422
    problem = r.json()
    assert problem["type"].endswith("request-too-large")
    assert problem["errors"][0]["location"] == "body.lengths"
    assert "REPACK_MAX_SAMPLES" in problem["detail"]


def test_samples_times_ranks_limit(db_url: str, start_server: ServerFactory) -> None:
    server = start_server(db_url, solver_workers=1, max_samples_x_ranks=1000)
    with httpx.Client(base_url=server.url, timeout=60) as c:
        fits = c.post("/v1/plans", json={"cluster": {"nodes": 2}, "lengths": [100] * 60})
        over = c.post("/v1/plans", json={"cluster": {"nodes": 8}, "lengths": [100] * 60})
    assert fits.status_code == 200
    assert over.status_code == 422
    assert "60 samples x 64 ranks" in over.json()["detail"]


def test_a_cluster_of_too_many_ranks_is_refused_naming_the_field(client: httpx.Client) -> None:
    """4,096 nodes of 64 GPUs and one sample passed every limit (a hostile-input hunt,
    2026-12-07): the solve took 21 s and 39 MB, the worker was killed at the hard stop, and
    other callers got 503s meanwhile, on every retry."""
    big = {"cluster": {"nodes": 4096, "gpus_per_node": 64}, "lengths": [1]}
    r = client.post("/v1/plans", json=big)
    assert r.status_code == 422
    problem = r.json()
    assert problem["type"].endswith("request-too-large")
    assert problem["errors"][0]["location"] == "body.cluster"
    assert "262144 ranks" in problem["detail"] and "REPACK_MAX_RANKS" in problem["detail"]
    ok = client.post("/v1/plans", json={"cluster": {"nodes": 2}, "lengths": [100, 200]})
    assert ok.status_code == 200


def test_a_500_says_connection_close_and_the_client_keeps_going(server: ServerThread) -> None:
    app: FastAPI = server.server.config.app

    async def boom() -> None:
        raise RuntimeError("a bug")

    app.add_api_route("/boom", boom)
    with httpx.Client(base_url=server.url, timeout=30) as c:
        r = c.get("/boom")
        assert r.status_code == 500
        assert r.headers["content-type"] == "application/problem+json"
        assert r.headers["connection"] == "close"
        assert c.get("/healthz").status_code == 200  # a fresh connection, not a reset
