"""PUT/GET /v1/profiles/{name} and plan requests that name a stored profile, over real HTTP."""

from __future__ import annotations

import httpx
import pytest

from solver.planner import plan
from solver.profiles import Profile
from solver.schema import Plan, PlanRequest
from tests.api.conftest import small_request

SLOW_NET = {"intra_node_gbps": 40.0, "inter_node_gbps": 4.0, "collective_latency_us": 30.0}


def test_put_get_versions_and_no_op_replays(client: httpx.Client) -> None:
    created = client.put("/v1/profiles/slow-net", json=SLOW_NET)
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["name"] == "slow-net" and body["version"] == 1
    assert body["intra_node_gbps"] == 40.0 and body["peak_tflops"] == Profile().peak_tflops
    same = client.put("/v1/profiles/slow-net", json=SLOW_NET)
    assert same.status_code == 200 and same.json() == body
    changed = client.put("/v1/profiles/slow-net", json={**SLOW_NET, "inter_node_gbps": 2.0})
    assert changed.status_code == 201 and changed.json()["version"] == 2
    assert client.get("/v1/profiles/slow-net").json()["inter_node_gbps"] == 2.0
    first = client.get("/v1/profiles/slow-net", params={"version": 1}).json()
    assert first == body
    missing = client.get("/v1/profiles/nope")
    assert missing.status_code == 404
    assert missing.headers["content-type"] == "application/problem+json"


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/profiles/p", {"efficiency_linear": 2.0}, "efficiency_linear"),
        ("/v1/profiles/p", {"intra_node_gbps": -1}, "intra_node_gbps"),
        ("/v1/profiles/p", {"bogus": 1}, "bogus"),
        ("/v1/profiles/p", {"name": "other"}, "name"),
        ("/v1/profiles/bad%20name", {}, "name"),
    ],
)
def test_bad_profile_is_a_422_naming_the_field(
    client: httpx.Client, path: str, body: dict[str, object], field: str
) -> None:
    r = client.put(path, json=body)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert any(field in e["location"] for e in r.json()["errors"]), r.json()


def test_a_request_naming_a_stored_profile_is_planned_with_it(client: httpx.Client) -> None:
    client.put("/v1/profiles/slow-net", json=SLOW_NET)
    served = client.post("/v1/plans", json=small_request("named", 0, profile_name="slow-net"))
    assert served.status_code == 200, served.text
    inline = PlanRequest.model_validate(
        small_request("named", 0, profile={"name": "slow-net", "version": 1, **SLOW_NET})
    )
    local = plan(inline)
    got = Plan.model_validate_json(served.content)
    assert got.metrics.step_time_ms == local.metrics.step_time_ms
    default = plan(PlanRequest.model_validate(small_request("named", 0)))
    assert got.metrics.step_time_ms > default.metrics.step_time_ms  # slower links, slower step
    unknown = client.post("/v1/plans", json=small_request("named", 1, profile_name="nope"))
    assert unknown.status_code == 422
    assert unknown.json()["errors"][0]["location"] == "body.profile_name"


def test_a_plan_names_the_profile_version_it_was_planned_with(client: httpx.Client) -> None:
    client.put("/v1/profiles/slow-net", json=SLOW_NET)
    client.put("/v1/profiles/slow-net", json={**SLOW_NET, "inter_node_gbps": 2.0})
    served = client.post("/v1/plans", json=small_request("named", 0, profile_name="slow-net"))
    assert served.status_code == 200, served.text
    assert served.json()["profile"] == {"name": "slow-net", "version": 2, "job_version": None}
    plain = client.post("/v1/plans", json=small_request("named", 1))
    assert "profile" not in plain.json()  # no profile asked for: the body is as before


def test_replacing_a_named_profile_does_not_turn_a_retry_into_a_409(
    client: httpx.Client,
) -> None:
    client.put("/v1/profiles/slow-net", json=SLOW_NET)
    body = small_request("named", 0, profile_name="slow-net")
    first = client.post("/v1/plans", json=body)
    assert first.status_code == 200, first.text
    client.put("/v1/profiles/slow-net", json={**SLOW_NET, "inter_node_gbps": 2.0})
    retry = client.post("/v1/plans", json=body)
    assert retry.status_code == 200, retry.text
    assert retry.content == first.content  # the stored plan, replayed byte for byte
    after = client.post("/v1/plans", json=small_request("named", 1, profile_name="slow-net"))
    assert after.json()["profile"]["version"] == 2  # the next step uses the new version


@pytest.mark.parametrize(
    ("fields", "location"),
    [
        ({"profile": {"name": "slow-net", "version": 99}}, "body.profile.version"),
        ({"profile": {"name": "slow-net", "job_version": 5}}, "body.profile.job_version"),
        (
            {"profile": {"name": "slow-net", "peak_tflops": 1.0}, "profile_name": "slow-net"},
            "body.profile_name",
        ),
    ],
)
def test_a_request_cannot_claim_a_stored_profile_it_does_not_use(
    client: httpx.Client, fields: dict[str, object], location: str
) -> None:
    """A plan's ``profile`` block says which stored version priced it: an inline profile that
    carries a version, or that rides along with ``profile_name``, would put the service's name
    on constants it never stored (the inline one won silently before)."""
    client.put("/v1/profiles/slow-net", json=SLOW_NET)
    r = client.post("/v1/plans", json=small_request("forged", 0, **fields))
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert [e["location"] for e in r.json()["errors"]] == [location]
    assert client.get("/v1/plans/forged-0").status_code == 404  # nothing stored
