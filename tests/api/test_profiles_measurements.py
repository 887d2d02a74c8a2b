"""Measurements and the closed loop over real HTTP (uvicorn) on SQLite and PostgreSQL."""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest

from solver.cost_model import CostModel, SampleCosts
from solver.profile_feedback import constants_of, with_constants
from solver.schema import Plan, PlanRequest
from solver.step_terms import step_terms
from solver.validate import step_seconds
from tests.api.conftest import small_request

MEASUREMENT = {
    "step_time_ms": 3500.0,
    "layers": {"full_ms": 900.0, "sparse_ms": 2400.0},
    "all_to_all_ms": 350.0,
    "ranks": 16,
}


def _url(job: str, step: int) -> str:
    return f"/v1/jobs/{job}/steps/{step}/measurements"


def test_measurement_is_stored_beside_the_plan_and_idempotent(client: httpx.Client) -> None:
    planned = client.post("/v1/plans", json=small_request("m-job", 0))
    assert planned.status_code == 200, planned.text
    first = client.post(_url("m-job", 0), json=MEASUREMENT)
    assert first.status_code == 201, first.text
    predicted = Plan.model_validate_json(planned.content).metrics.step_time_ms
    assert first.json()["predicted_ms"] == predicted
    again = client.post(_url("m-job", 0), json=MEASUREMENT)
    assert again.status_code == 200 and again.json() == first.json()
    other = client.post(_url("m-job", 0), json={**MEASUREMENT, "step_time_ms": 1.0})
    assert other.status_code == 409
    assert other.headers["content-type"] == "application/problem+json"
    listed = client.get("/v1/jobs/m-job/measurements").json()["steps"]
    assert len(listed) == 1
    row = listed[0]
    assert row["measured_ms"] == 3500.0 and row["predicted_ms"] == predicted
    assert row["error"] == pytest.approx(predicted / 3500.0 - 1)
    assert sum(row["terms_ms"].values()) == pytest.approx(predicted, rel=1e-6)
    assert row["dominating"] in ("compute", "intra", "inter")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({**MEASUREMENT, "step_time_ms": -1}, "step_time_ms"),
        ({**MEASUREMENT, "step_time_ms": 1e12}, "step_time_ms"),
        ({**MEASUREMENT, "all_to_all_ms": "fast"}, "all_to_all_ms"),
        ({**MEASUREMENT, "layers": {"full_ms": 1.0}}, "sparse_ms"),
        ({**MEASUREMENT, "bogus": 1}, "bogus"),
        ({}, "step_time_ms"),
    ],
)
def test_bad_measurement_is_a_422_problem_naming_the_field(
    client: httpx.Client, body: dict[str, object], field: str
) -> None:
    r = client.post(_url("bad-job", 0), json=body)
    assert r.status_code == 422
    assert r.headers["content-type"] == "application/problem+json"
    assert any(field in e["location"] for e in r.json()["errors"]), r.json()


def test_bad_path_is_a_422(client: httpx.Client) -> None:
    assert client.post(_url("j", -1), json=MEASUREMENT).status_code == 422
    assert client.post(_url("j", 2**63), json=MEASUREMENT).status_code == 422
    assert (
        client.put("/v1/jobs/j/feedback", json={"enabled": True, "max_change": 0.5}).status_code
        == 422
    )


def _request(step: int) -> dict[str, object]:
    """Steps of 2 x 8 ranks; every other one holds a sample wider than a node."""
    rng = np.random.default_rng(step)
    lengths = [int(n) for n in rng.integers(200, 2500, size=int(rng.integers(4, 9)))]
    if step % 2 == 0:
        lengths.append(int(rng.integers(34_000, 50_000)))
    return {
        "job_id": "loop",
        "step": step,
        "cluster": {"nodes": 2, "gpus_per_node": 8, "max_tokens_per_rank": 4096},
        "lengths": lengths,
    }


def test_opted_in_job_refits_its_profile_and_plans_with_it(client: httpx.Client) -> None:
    """Measurements from the cost model with bandwidths x 0.5 (+5% noise): the service's
    refitted versions approach the truth, and later steps are planned with them."""
    r = client.put(
        "/v1/jobs/loop/feedback", json={"enabled": True, "min_steps": 8, "refit_every": 4}
    )
    assert r.status_code == 200 and r.json()["enabled"] is True
    noise = np.random.default_rng(0)
    start = constants_of(PlanRequest.model_validate(_request(0)))
    truth = {
        **start,
        "intra_node_gbps": start["intra_node_gbps"] / 2,
        "inter_node_gbps": start["inter_node_gbps"] / 2,
    }
    for step in range(20):
        planned = client.post("/v1/plans", json=_request(step))
        assert planned.status_code == 200, planned.text
        plan_ = Plan.model_validate_json(planned.content)
        true_req = with_constants(PlanRequest.model_validate(_request(step)), truth)
        cost = CostModel.from_request(true_req)
        t = step_seconds(true_req, plan_, cost, SampleCosts.build(cost, true_req.lengths))
        terms = step_terms(true_req, plan_, cost)
        e = 1 + 0.05 * noise.standard_normal(2)
        body = {
            "step_time_ms": t * 1e3 * e[0],
            "all_to_all_ms": (terms.intra + terms.inter) * 1e3 * e[1],
        }
        assert client.post(_url("loop", step), json=body).status_code == 201
    view = client.get("/v1/jobs/loop/feedback").json()
    versions = view["versions"]
    assert [v["version"] for v in versions] == list(range(1, len(versions) + 1))
    assert len(versions) >= 3
    # Each version applies from the step after the last planned one (never to a planned step).
    assert [v["from_step"] for v in versions] == sorted(v["from_step"] for v in versions)
    last = versions[-1]["constants"]
    for name, want in truth.items():
        assert last[name] == pytest.approx(want, rel=0.10), name
    # The next step is planned with the newest version, and the stored comparison says so.
    planned = client.post("/v1/plans", json=_request(20))
    assert planned.headers["x-repack-job-profile-version"] == str(versions[-1]["version"])
    # ... and so does the plan's body (the header is a convenience, the body is the record).
    assert planned.json()["profile"]["job_version"] == versions[-1]["version"]
    replay = client.post("/v1/plans", json=_request(20))  # a retry: same bytes, same version
    assert replay.content == planned.content
    assert replay.headers["x-repack-job-profile-version"] == str(versions[-1]["version"])
    client.post(_url("loop", 20), json={"step_time_ms": 100.0})
    # The step's request is recorded just after its plan is answered (off the latency path).
    deadline = time.monotonic() + 10
    while True:
        listed = client.get("/v1/jobs/loop/measurements", params={"after": 19}).json()["steps"]
        if listed[0]["profile_version"] is not None or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert listed[0]["profile_version"] == versions[-1]["version"]
