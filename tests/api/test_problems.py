"""Every 4xx is RFC 9457 problem+json naming the bad fields (in-process TestClient)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from tests.api.conftest import make_settings, small_request

MAX_BODY = 64 * 1024


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    db = tmp_path_factory.mktemp("problems") / "plans.db"
    app = create_app(make_settings(f"sqlite:///{db}", max_body_bytes=MAX_BODY))
    with TestClient(app) as c:
        yield c


def assert_problem(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem: dict[str, Any] = response.json()
    assert {"type", "title", "status", "detail", "instance", "errors"} <= problem.keys()
    assert problem["status"] == status
    return problem


def locations(problem: dict[str, Any]) -> list[str]:
    return [e["location"] for e in problem["errors"]]


def test_wrong_types_name_each_field(client: TestClient) -> None:
    body = {"cluster": {"nodes": "eight"}, "lengths": [1, "x"], "mode": "fast"}
    problem = assert_problem(client.post("/v1/plans", json=body), 422)
    assert set(locations(problem)) == {"body.cluster.nodes", "body.lengths[1]", "body.mode"}
    assert problem["instance"] == "/v1/plans"


def test_schema_rule_names_the_field(client: TestClient) -> None:
    problem = assert_problem(client.post("/v1/plans", json={"lengths": [0, 5]}), 422)
    assert locations(problem) == ["body.lengths"]
    assert "lengths[0]" in problem["errors"][0]["detail"]


def test_missing_field(client: TestClient) -> None:
    problem = assert_problem(client.post("/v1/plans", json={"cluster": {"nodes": 1}}), 422)
    assert locations(problem) == ["body.lengths"]


def test_invalid_json(client: TestClient) -> None:
    response = client.post(
        "/v1/plans", content=b'{"lengths": [1, 2', headers={"content-type": "application/json"}
    )
    problem = assert_problem(response, 422)
    assert problem["errors"][0]["type"] == "json_invalid"


@pytest.mark.parametrize("content_type", ["text/plain", "application/xml", ""])
def test_wrong_content_type(client: TestClient, content_type: str) -> None:
    response = client.post(
        "/v1/plans", content=b'{"lengths": [1]}', headers={"content-type": content_type}
    )
    problem = assert_problem(response, 422)
    assert locations(problem) == ["body"]


def test_body_over_the_limit_is_413(client: TestClient) -> None:
    body = {"lengths": [1000] * (MAX_BODY // 4)}
    problem = assert_problem(client.post("/v1/plans", json=body), 413)
    assert problem["type"].endswith("payload-too-large")


def test_planning_error_names_body_field(client: TestClient) -> None:
    body = {
        "cluster": {"nodes": 1, "max_tokens_per_rank": 100},
        "parent_sizes": [4, 4],
        "lengths": [250, 250, 250],
    }
    problem = assert_problem(client.post("/v1/plans", json=body), 422)
    assert locations(problem) == ["body.lengths"]
    assert problem["type"].endswith("planning-error")


def test_bad_query_and_path(client: TestClient) -> None:
    problem = assert_problem(client.get("/v1/jobs", params={"limit": 0}), 422)
    assert locations(problem) == ["query.limit"]
    for after in ("abc", str(2**63)):
        problem = assert_problem(client.get("/v1/jobs/x/steps", params={"after": after}), 422)
        assert locations(problem) == ["query.after"]


def test_not_found_and_method_not_allowed(client: TestClient) -> None:
    assert assert_problem(client.get("/nowhere"), 404)["instance"] == "/nowhere"
    assert_problem(client.delete("/v1/plans/abc"), 405)
    assert_problem(client.get("/v1/jobs/nobody/steps"), 404)


def test_step_beyond_storage_range_is_422(client: TestClient) -> None:
    problem = assert_problem(client.post("/v1/plans", json=small_request("j", 2**63)), 422)
    assert locations(problem) == ["body.step"]


def test_openapi_documents_problem_answers(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    post = spec["paths"]["/v1/plans"]["post"]
    for status in ("409", "422", "429"):
        assert "application/problem+json" in post["responses"][status]["content"]
    assert post["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Plan"
    }
    docs = client.get("/docs")
    assert docs.status_code == 200
    assert "swagger" in docs.text.lower()


def test_no_static_path_escape(client: TestClient) -> None:
    assert client.get("/static/../main.py").status_code == 404


@pytest.mark.parametrize(
    ("cluster", "location"),
    [
        ({"peak_tflops": 1e308}, "body.cluster.peak_tflops"),
        ({"compute_efficiency": 1e-300}, "body.cluster.compute_efficiency"),
        ({"inter_node_gbps": 1e-308}, "body.cluster.inter_node_gbps"),
    ],
)
def test_implausible_physical_constants_are_422(
    client: TestClient, cluster: dict[str, Any], location: str
) -> None:
    """Values that used to end in a 500 (ZeroDivisionError, CP-SAT overflow) name their field."""
    body = {"cluster": cluster, "lengths": [150000, 9000]}
    problem = assert_problem(client.post("/v1/plans", json=body), 422)
    assert locations(problem) == [location]


def test_unresolved_profile_name_is_422(client: TestClient) -> None:
    body = {"lengths": [150000, 9000], "profile_name": "lab-a"}
    problem = assert_problem(client.post("/v1/plans", json=body), 422)
    assert locations(problem) == ["body.profile_name"]
