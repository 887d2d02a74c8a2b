"""POST/GET /v1/plans over real HTTP against SQLite and PostgreSQL: idempotency, 409, restart."""

from __future__ import annotations

import json

import httpx

from solver.plan_builder import canonical_json, plan_id_for
from solver.planner import plan
from solver.schema import Plan, PlanRequest
from tests.api.conftest import ServerFactory, small_request


def test_post_returns_valid_plan_and_replays_identical_bytes(client: httpx.Client) -> None:
    body = small_request("job-a", 0)
    first = client.post("/v1/plans", json=body)
    assert first.status_code == 200, first.text
    assert first.headers["content-type"] == "application/json"
    assert first.headers["x-repack-plan-source"] == "solved"
    plan_ = Plan.model_validate_json(first.content)
    assert (plan_.plan_id, plan_.job_id, plan_.step) == ("job-a-0", "job-a", 0)
    # The same key and body, with another deadline, is a replay of the stored bytes.
    again = client.post("/v1/plans", json={**body, "deadline_ms": 5000})
    assert again.status_code == 200
    assert again.content == first.content
    assert again.headers["x-repack-plan-source"] in {"memory", "database"}
    stored = client.get("/v1/plans/job-a-0")
    assert stored.status_code == 200
    assert stored.content == first.content


def test_plan_matches_the_in_process_solver(client: httpx.Client) -> None:
    body = small_request("job-b", 3)
    served = client.post("/v1/plans", json=body)
    local = plan(PlanRequest.model_validate(body))
    assert json.loads(
        canonical_json(Plan.model_validate_json(served.content), drop_timing=True)
    ) == (json.loads(canonical_json(local, drop_timing=True)))


def test_same_key_different_body_is_409(client: httpx.Client) -> None:
    body = small_request("job-c", 1)
    assert client.post("/v1/plans", json=body).status_code == 200
    other = client.post("/v1/plans", json={**body, "lengths": [1000, 2000]})
    assert other.status_code == 409
    assert other.headers["content-type"] == "application/problem+json"
    problem = other.json()
    assert problem["status"] == 409
    assert problem["instance"] == "/v1/plans"
    assert "job-c-1" in problem["detail"]


def test_anonymous_requests_get_a_content_addressed_plan(client: httpx.Client) -> None:
    body = {k: v for k, v in small_request("x", 0).items() if k not in ("job_id", "step")}
    first = client.post("/v1/plans", json=body)
    second = client.post("/v1/plans", json=body)
    assert first.status_code == second.status_code == 200
    assert first.content == second.content
    assert second.headers["x-repack-plan-source"] == "memory"
    plan_id = first.json()["plan_id"]
    request = PlanRequest.model_validate(body)
    assert plan_id == plan_id_for(request, request.resolved_mode)
    assert client.get(f"/v1/plans/{plan_id}").content == first.content


def test_unknown_plan_is_404_problem(client: httpx.Client) -> None:
    missing = client.get("/v1/plans/no-such-plan")
    assert missing.status_code == 404
    assert missing.headers["content-type"] == "application/problem+json"
    assert missing.json()["instance"] == "/v1/plans/no-such-plan"


def test_accepted_plans_survive_a_restart(db_url: str, start_server: ServerFactory) -> None:
    body = small_request("job-restart", 7)
    first_server = start_server(db_url)
    first = httpx.post(f"{first_server.url}/v1/plans", json=body, timeout=60)
    assert first.status_code == 200
    first_server.stop()

    second_server = start_server(db_url)
    replay = httpx.post(f"{second_server.url}/v1/plans", json=body, timeout=60)
    stored = httpx.get(f"{second_server.url}/v1/plans/job-restart-7", timeout=60)
    assert stored.content == first.content
    assert replay.content == first.content
    assert replay.headers["x-repack-plan-source"] == "database"
    conflict = httpx.post(
        f"{second_server.url}/v1/plans", json={**body, "mode": "baseline"}, timeout=60
    )
    assert conflict.status_code == 409
