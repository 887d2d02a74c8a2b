"""Hostile input of the 2026-12-07 hunt, over real HTTP (uvicorn) on SQLite and PostgreSQL.

* A body with hundreds of thousands of bad entries is a small 422 listing the first errors and
  counting the rest (it used to list every one: a 97 MB answer built on the event loop).
* Integer query and path parameters beyond the database's int64 are a 422 naming the parameter
  (``?after=2**63`` on the measurements used to be a 500 on SQLite and a 503 on PostgreSQL).
* Every route that takes a job id refuses control characters in it with a 422 naming
  ``path.job_id`` before the database is asked (a NUL used to reach PostgreSQL from the
  measurement and feedback routes and was taken for a database outage).
* The dashboard's links percent-encode the job id (``a?b#c``, ``50%``).
"""

from __future__ import annotations

import html
import re
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, unquote

import httpx
import pytest

from tests.api.conftest import ServerFactory, small_request

MEASUREMENT = {"step_time_ms": 3500.0, "all_to_all_ms": 350.0, "ranks": 16}
INT64_MAX = 2**63 - 1
SMALL_ANSWER = 64 * 1024
MAX_LISTED_ERRORS = 20
"""A 422 lists this many errors (``api.problems.MAX_LISTED_ERRORS``) and counts the rest."""


@pytest.fixture
def sqlite_client(tmp_path: Path, start_server: ServerFactory) -> Iterator[httpx.Client]:
    """Validation happens before any database is asked: one backend is enough there."""
    server = start_server(f"sqlite:///{tmp_path / 'plans.db'}")
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


def _problem(r: httpx.Response, status: int) -> dict[str, object]:
    assert r.status_code == status, r.text[:2000]
    assert r.headers["content-type"] == "application/problem+json"
    problem: dict[str, object] = r.json()
    return problem


def _locations(problem: dict[str, object]) -> list[str]:
    errors = problem["errors"]
    assert isinstance(errors, list)
    return [e["location"] for e in errors]


# --- A. error amplification ------------------------------------------------------------------


def test_200k_bad_lengths_answer_a_small_422_with_the_count(sqlite_client: httpx.Client) -> None:
    """Past ``solver.input_limits.MANY`` bad entries the schema raises one error that counts
    them (pydantic made one per entry, and FastAPI copied each, on the event loop)."""
    n = 200_000
    body = b'{"cluster": {"nodes": 2}, "lengths": [' + b",".join([b'"x"'] * n) + b"]}"
    started = time.monotonic()
    r = sqlite_client.post("/v1/plans", content=body, headers={"content-type": "application/json"})
    elapsed = time.monotonic() - started
    problem = _problem(r, 422)
    assert len(r.content) < SMALL_ANSWER, len(r.content)
    assert _locations(problem) == ["body.lengths"]
    assert (
        f"lengths[0] = 'x' is not an integer, nor are {n - 1} more"
        in problem["errors"][0]["detail"]
    )
    assert problem["errors_omitted"] == 0
    assert elapsed < 30, elapsed  # absurdly generous: it used to take ~2 s per 100k errors
    assert sqlite_client.get("/healthz").status_code == 200


def test_100k_unknown_keys_are_one_error_that_counts_them(sqlite_client: httpx.Client) -> None:
    n = 100_000
    keys = b",".join(b'"k%d": 1' % i for i in range(n))
    body = b"{" + keys + b', "cluster": {"nodes": 2}, "lengths": [5]}'
    r = sqlite_client.post("/v1/plans", content=body, headers={"content-type": "application/json"})
    problem = _problem(r, 422)
    assert len(r.content) < SMALL_ANSWER, len(r.content)
    assert _locations(problem) == ["body"]
    assert f"{n} unknown fields ('k0', 'k1'" in problem["errors"][0]["detail"]


def test_a_misspelled_key_still_goes_first_among_many_errors(sqlite_client: httpx.Client) -> None:
    """The typo is listed first even when it is the last error pydantic reports, and errors
    past the first 20 are counted."""
    bad_cluster = {"nodes": "a", "gpus_per_node": "b", "max_tokens_per_rank": "c"}
    body = {"cluster": bad_cluster, "lengths": ["x"] * 20, "lenghts_": [1]}
    problem = _problem(sqlite_client.post("/v1/plans", json=body), 422)
    assert _locations(problem)[0] == "body.lenghts_"
    assert len(problem["errors"]) == MAX_LISTED_ERRORS
    assert problem["errors_omitted"] == 1 + 3 + 20 - MAX_LISTED_ERRORS


def test_a_huge_unknown_key_is_clipped_in_the_answer(sqlite_client: httpx.Client) -> None:
    body = {"cluster": {"nodes": 2}, "lengths": [5], "k" * 1_000_000: 1}
    r = sqlite_client.post("/v1/plans", json=body)
    problem = _problem(r, 422)
    assert len(r.content) < SMALL_ANSWER, len(r.content)
    assert _locations(problem)[0].startswith("body.kkkk")
    assert problem["errors_omitted"] == 0


def test_a_few_errors_are_listed_in_full(sqlite_client: httpx.Client) -> None:
    body = {"cluster": {"nodes": "eight"}, "lengths": [1, "x"], "mode": "fast"}
    problem = _problem(sqlite_client.post("/v1/plans", json=body), 422)
    assert set(_locations(problem)) == {"body.cluster.nodes", "body.lengths[1]", "body.mode"}
    assert problem["errors_omitted"] == 0
    assert "more" not in str(problem["detail"])


# --- B. integers beyond int64 ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "url", "location"),
    [
        ("GET", f"/v1/jobs/j/measurements?after={INT64_MAX + 1}", "query.after"),
        ("GET", f"/v1/jobs/j/measurements?after={10**23}", "query.after"),
        ("GET", f"/v1/jobs/j/measurements?after={-(2**63) - 1}", "query.after"),
        ("GET", f"/v1/jobs/j/measurements?limit={2**64}", "query.limit"),
        ("GET", f"/v1/jobs/j/steps?after={INT64_MAX + 1}", "query.after"),
        ("GET", f"/v1/jobs/j/steps?limit={2**64}", "query.limit"),
        ("GET", f"/v1/jobs?limit={2**64}", "query.limit"),
        ("GET", f"/v1/profiles/p?version={INT64_MAX + 1}", "query.version"),
        ("POST", f"/v1/jobs/j/steps/{INT64_MAX + 1}/measurements", "path.step"),
        ("POST", f"/v1/jobs/j/steps/{10**40}/measurements", "path.step"),
    ],
)
def test_integers_beyond_int64_are_422_naming_the_parameter(
    client: httpx.Client, method: str, url: str, location: str
) -> None:
    r = client.request(method, url, json=MEASUREMENT if method == "POST" else None)
    assert _locations(_problem(r, 422)) == [location]
    # The database was not asked, so it is not in an "outage": honest requests go through.
    assert client.post("/v1/plans", json=small_request("after-ok", 0)).status_code == 200
    assert client.get("/readyz").status_code == 200


def test_after_at_int64_max_is_an_empty_page(client: httpx.Client) -> None:
    assert client.post("/v1/plans", json=small_request("edge", 0)).status_code == 200
    assert client.post("/v1/jobs/edge/steps/0/measurements", json=MEASUREMENT).status_code == 201
    r = client.get(f"/v1/jobs/edge/measurements?after={INT64_MAX}")
    assert r.status_code == 200, r.text
    assert r.json()["steps"] == []


# --- C. job ids with characters the API refuses ----------------------------------------------

BAD_JOB_IDS = ["a\x00b", "\x00", "\x01", "tab\there", "new\nline", "del\x7f", "\x1b[31m"]
JOB_ROUTES = [
    ("GET", "/v1/jobs/{}/steps", None),
    ("DELETE", "/v1/jobs/{}", None),
    ("POST", "/v1/jobs/{}/steps/0/measurements", MEASUREMENT),
    ("GET", "/v1/jobs/{}/measurements", None),
    ("PUT", "/v1/jobs/{}/feedback", {"enabled": True}),
    ("GET", "/v1/jobs/{}/feedback", None),
    ("GET", "/dashboard/jobs/{}", None),
    ("GET", "/dashboard/jobs/{}/measured", None),
]


@pytest.mark.parametrize(("method", "route", "body"), JOB_ROUTES)
def test_bad_job_id_on_every_job_route_is_422_and_the_database_stays_healthy(
    client: httpx.Client, method: str, route: str, body: dict[str, object] | None
) -> None:
    for job_id in BAD_JOB_IDS:
        r = client.request(method, route.format(quote(job_id, safe="")), json=body)
        problem = _problem(r, 422)
        assert _locations(problem) == ["path.job_id"], (job_id, problem)
    # Nothing reached the database, so it was not taken for down: the next honest requests of
    # the same kinds answer at once.
    assert client.get("/readyz").status_code == 200
    assert client.post("/v1/plans", json=small_request("healthy", 0)).status_code == 200
    r = client.post("/v1/jobs/healthy/steps/0/measurements", json=MEASUREMENT)
    assert r.status_code == 201, r.text
    assert client.get("/v1/jobs/healthy/measurements").status_code == 200
    assert client.put("/v1/jobs/healthy/feedback", json={"enabled": False}).status_code == 200
    assert client.get("/v1/jobs/healthy/steps").status_code == 200


def test_openapi_gives_every_job_id_the_same_pattern(client: httpx.Client) -> None:
    spec = client.get("/openapi.json").json()
    patterns = set()
    for path, operations in spec["paths"].items():
        for operation in operations.values():
            for param in operation.get("parameters", []):
                if param["name"] == "job_id" and param["in"] == "path":
                    patterns.add((param["schema"].get("pattern"), param["schema"].get("maxLength")))
                    assert "pattern" in param["schema"], path
    assert len(patterns) == 1, patterns


# --- D. dashboard links ----------------------------------------------------------------------

ODD_JOB_IDS = ["a?b#c", "50%", '<x>"&y', "sp ace", "ü-job", "x;y=1"]
HREF = re.compile(r'href="(/dashboard/jobs/[^"]*)"')
ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def _job_links(page: str) -> list[str]:
    return [html.unescape(h) for h in HREF.findall(page)]


@pytest.mark.parametrize("job_id", ODD_JOB_IDS)
def test_dashboard_links_percent_encode_the_job_id(client: httpx.Client, job_id: str) -> None:
    assert client.post("/v1/plans", json=small_request(job_id, 0)).status_code == 200
    r = client.post(f"/v1/jobs/{quote(job_id, safe='')}/steps/0/measurements", json=MEASUREMENT)
    assert r.status_code == 201, r.text
    job_page = client.get(f"/dashboard/jobs/{quote(job_id, safe='')}")
    assert job_page.status_code == 200, job_page.text
    measured_page = client.get(f"/dashboard/jobs/{quote(job_id, safe='')}/measured")
    assert measured_page.status_code == 200, measured_page.text
    encoded = quote(job_id, safe="")
    links = {
        "job": _job_links(job_page.text),
        "measured": _job_links(measured_page.text),
        "jobs": _job_links(client.get("/dashboard").text),
    }
    assert f"/dashboard/jobs/{encoded}/measured" in links["job"], links
    assert f"/dashboard/jobs/{encoded}" in links["measured"], links
    assert f"/dashboard/jobs/{encoded}" in links["jobs"], links
    for href in [h for hs in links.values() for h in hs]:
        assert "?" not in href and "#" not in href and " " not in href, href
        assert not ESCAPE.search(href), href  # every % starts an escape
        segment = href.removeprefix("/dashboard/jobs/").removesuffix("/measured")
        assert "/" not in segment, href
        if unquote(segment) == job_id:
            assert client.get(href).status_code == 200, href  # the link leads to the page
    plan_page = client.get(f"/dashboard/plans/{quote(job_id + '-0', safe='')}")
    assert plan_page.status_code == 200
    assert f"/dashboard/jobs/{encoded}" in _job_links(plan_page.text)
