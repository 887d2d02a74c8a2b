"""A misspelled field is named in the 422, before the field it leaves missing."""

from __future__ import annotations

import httpx


def test_a_misspelled_field_is_named_first(client: httpx.Client) -> None:
    r = client.post("/v1/plans", json={"cluster": {"nodes": 2}, "lenghts": [100, 200]})
    assert r.status_code == 422
    problem = r.json()
    first, second = problem["errors"]
    assert first == {
        "location": "body.lenghts",
        "detail": "unknown field lenghts",
        "type": "extra_forbidden",
    }
    assert second["location"] == "body.lengths" and second["type"] == "missing"
    assert problem["detail"] == "invalid request: unknown field body.lenghts, body.lengths"


def test_a_nested_unknown_field_is_named(client: httpx.Client) -> None:
    r = client.post("/v1/plans", json={"cluster": {"nodse": 2}, "lengths": [100]})
    assert r.status_code == 422
    assert r.json()["errors"][0]["location"] == "body.cluster.nodse"
    assert r.json()["errors"][0]["detail"] == "unknown field nodse"
