"""Job history endpoints and the Prometheus exposition, over real HTTP."""

from __future__ import annotations

import httpx

from tests.api.conftest import metric_value, small_request


def test_jobs_and_steps_are_paginated(client: httpx.Client) -> None:
    for job in ("j2", "j1"):
        for step in (2, 0, 1):
            assert client.post("/v1/plans", json=small_request(job, step)).status_code == 200
    first = client.get("/v1/jobs", params={"limit": 1}).json()
    assert [j["job_id"] for j in first["items"]] == ["j1"]
    assert first["items"][0]["steps"] == 3
    second = client.get("/v1/jobs", params={"limit": 1, "after": first["next_after"]}).json()
    assert [j["job_id"] for j in second["items"]] == ["j2"]

    page = client.get("/v1/jobs/j1/steps", params={"limit": 2}).json()
    assert [s["step"] for s in page["items"]] == [0, 1]
    assert page["next_after"] == 1
    rest = client.get("/v1/jobs/j1/steps", params={"after": 1, "limit": 2}).json()
    assert [s["step"] for s in rest["items"]] == [2]
    assert rest["next_after"] is None
    step = page["items"][0]
    plan = client.get(f"/v1/plans/{step['plan_id']}").json()
    assert step["metrics"]["speedup"] == plan["metrics"]["speedup"]
    assert step["metrics"]["stopped_by"] == plan["metrics"]["stopped_by"]
    assert step["created_at"].endswith("Z") or "+00:00" in step["created_at"]


def test_metrics_count_plans_replays_and_latency(client: httpx.Client) -> None:
    body = small_request("m", 0)
    plan = client.post("/v1/plans", json=body).json()
    client.post("/v1/plans", json=body)
    client.post("/v1/plans", json={"lengths": []})
    text = client.get("/metrics").text
    assert metric_value(text, "repack_plans_total", status=plan["status"], mode=plan["mode"]) == 1
    assert metric_value(text, "repack_cache_hits_total", source="memory") == 1
    assert (
        metric_value(
            text, "repack_http_request_duration_seconds_count", route="/v1/plans", status="200"
        )
        == 2
    )
    assert (
        metric_value(
            text, "repack_http_request_duration_seconds_count", route="/v1/plans", status="422"
        )
        == 1
    )
    assert metric_value(text, "repack_recent_speedup", stat="mean") == plan["metrics"]["speedup"]
    assert metric_value(text, "repack_recent_gap", stat="max") == plan["metrics"]["gap"]
    assert metric_value(text, "repack_rejected_total") == 0


def test_tiny_deadline_still_gives_a_valid_plan_and_counts_a_deadline_hit(
    client: httpx.Client,
) -> None:
    response = client.post("/v1/plans", json=small_request("late", 0, deadline_ms=1))
    assert response.status_code == 200
    plan = response.json()
    assert plan["tokens"] and plan["children"]
    hits = metric_value(client.get("/metrics").text, "repack_deadline_hits_total")
    assert hits == (1 if plan["metrics"]["stopped_by"] == "deadline" else 0)


def test_health_and_readiness(client: httpx.Client) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {"status": "ready", "database": "ok", "solver": "ok"}


def test_a_job_listed_with_only_stepless_plans_has_an_empty_steps_page(
    client: httpx.Client,
) -> None:
    """A plan with a job id but no step is listed under its job; the job's steps route and
    dashboard page must then answer (with no steps), not 404 a job the list just showed."""
    body = small_request("stepless", 0)
    del body["step"]
    assert client.post("/v1/plans", json=body).status_code == 200
    jobs = client.get("/v1/jobs").json()["items"]
    assert [j["job_id"] for j in jobs] == ["stepless"]
    page = client.get("/v1/jobs/stepless/steps")
    assert page.status_code == 200, page.text
    assert page.json()["items"] == [] and page.json()["next_after"] is None
    listing = client.get("/dashboard")
    assert listing.status_code == 200 and "stepless" in listing.text
    assert "None" not in listing.text  # no step range to show, not "None–None"
    html = client.get("/dashboard/jobs/stepless")
    assert html.status_code == 200, html.text
    assert "0 steps" in html.text
    for missing in ("/v1/jobs/nobody/steps", "/dashboard/jobs/nobody"):
        assert client.get(missing).status_code == 404
