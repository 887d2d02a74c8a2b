"""Hostile input of the 2026-12-07 fuzz of the service, over real HTTP (uvicorn, SQLite):
the measurement, feedback and listing routes are as strict as the plan schema.

* Measured times are numbers (not ``true`` or ``"5"``) and at least a microsecond where they
  are not zero: ``step_time_ms: 5e-324`` was stored and then overflowed the job's refit (a
  fitted version with a median error of 4e301).
* Feedback settings are a boolean and numbers (``"enabled": "off"`` opted a job *out*).
* Step numbers and ``after``/``limit`` are decimal integers (``/steps/1_0`` was step 10).
* A job id in a path is text: undecodable bytes (``%ff%fe``) were replaced by U+FFFD, so
  different byte strings named one job.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.api.conftest import ServerFactory

MEASUREMENT = {"step_time_ms": 3500.0, "all_to_all_ms": 350.0, "ranks": 16}


@pytest.fixture
def sqlite_client(tmp_path: Path, start_server: ServerFactory) -> Iterator[httpx.Client]:
    server = start_server(f"sqlite:///{tmp_path / 'plans.db'}")
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


def _assert_422(r: httpx.Response, location: str) -> None:
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert location in [e["location"] for e in r.json()["errors"]], r.json()


@pytest.mark.parametrize(
    ("body", "location"),
    [
        ({**MEASUREMENT, "step_time_ms": True}, "body.step_time_ms"),
        ({**MEASUREMENT, "step_time_ms": "5"}, "body.step_time_ms"),
        ({**MEASUREMENT, "step_time_ms": 5e-324}, "body.step_time_ms"),
        ({**MEASUREMENT, "step_time_ms": 1e-300}, "body.step_time_ms"),
        ({**MEASUREMENT, "all_to_all_ms": True}, "body.all_to_all_ms"),
        ({**MEASUREMENT, "all_to_all_ms": 1e-300}, "body.all_to_all_ms"),
        ({**MEASUREMENT, "layers": {"full_ms": "1", "sparse_ms": 2.0}}, "body.layers.full_ms"),
        ({**MEASUREMENT, "layers": {"full_ms": 1.0, "sparse_ms": False}}, "body.layers.sparse_ms"),
    ],
)
def test_a_measurement_is_numbers_of_at_least_a_microsecond(
    sqlite_client: httpx.Client, body: dict[str, object], location: str
) -> None:
    r = sqlite_client.post("/v1/jobs/m/steps/0/measurements", json=body)
    _assert_422(r, location)
    assert sqlite_client.get("/v1/jobs/m/measurements").status_code == 404  # nothing stored


def test_plain_measurements_still_pass(sqlite_client: httpx.Client) -> None:
    ok = {
        **MEASUREMENT,
        "step_time_ms": 1,
        "all_to_all_ms": 0,
        "layers": {"full_ms": 0.001, "sparse_ms": 0},
    }
    r = sqlite_client.post("/v1/jobs/m/steps/0/measurements", json=ok)
    assert r.status_code == 201, r.text
    assert r.json()["measurement"]["step_time_ms"] == 1.0


@pytest.mark.parametrize(
    ("body", "location"),
    [
        ({"enabled": "yes"}, "body.enabled"),
        ({"enabled": "off"}, "body.enabled"),
        ({"enabled": 0}, "body.enabled"),
        ({"enabled": True, "min_steps": "3"}, "body.min_steps"),
        ({"enabled": True, "min_steps": True}, "body.min_steps"),
        ({"enabled": True, "max_change": "2"}, "body.max_change"),
        ({"enabled": True, "window": 20.0}, "body.window"),
    ],
)
def test_feedback_settings_are_typed(
    sqlite_client: httpx.Client, body: dict[str, object], location: str
) -> None:
    _assert_422(sqlite_client.put("/v1/jobs/f/feedback", json=body), location)
    assert sqlite_client.get("/v1/jobs/f/feedback").json()["enabled"] is False


def test_feedback_settings_take_integers_for_floats(sqlite_client: httpx.Client) -> None:
    r = sqlite_client.put("/v1/jobs/f/feedback", json={"enabled": True, "max_change": 2})
    assert r.status_code == 200, r.text
    assert r.json()["enabled"] is True


@pytest.mark.parametrize("step", ["1_0", "+1", "1.0", "%201", "1e1", "0x1"])
def test_a_step_in_a_path_is_a_decimal_integer(sqlite_client: httpx.Client, step: str) -> None:
    r = sqlite_client.post(f"/v1/jobs/m/steps/{step}/measurements", json=MEASUREMENT)
    _assert_422(r, "path.step")


@pytest.mark.parametrize(
    ("url", "location"),
    [
        ("/v1/jobs/s/steps?after=1_000", "query.after"),
        ("/v1/jobs/s/steps?after=%2B1", "query.after"),
        ("/v1/jobs/s/steps?limit=1_0", "query.limit"),
        ("/v1/jobs/s/measurements?after=1_0", "query.after"),
        ("/v1/jobs/s/measurements?limit=+5", "query.limit"),
        ("/v1/jobs?limit=0x10", "query.limit"),
        ("/v1/profiles/p?version=1_0", "query.version"),
    ],
)
def test_integers_in_a_query_are_decimal(
    sqlite_client: httpx.Client, url: str, location: str
) -> None:
    _assert_422(sqlite_client.get(url), location)


@pytest.mark.parametrize(
    "job",
    [
        "%ff%fe",
        "%ED%A0%80",
        "a%C3",
        "%EF%BF%BD",
        "a%E2%80%AEb",  # U+202E, right-to-left override
        "a%E2%80%8Bb",  # U+200B, zero-width space
        "%EF%BB%BFa",  # U+FEFF, a BOM
        "a%C2%85b",  # U+0085, a C1 control
    ],
)
def test_a_job_id_in_a_path_is_text(sqlite_client: httpx.Client, job: str) -> None:
    _assert_422(sqlite_client.get(f"/v1/jobs/{job}/feedback"), "path.job_id")
    _assert_422(sqlite_client.get(f"/v1/jobs/{job}/steps"), "path.job_id")


@pytest.mark.parametrize("job", ["a\u202eb", "a\u200bb", "\ufeffjob", "a\u0085b", "a\u2028b"])
def test_a_job_id_has_no_invisible_characters(sqlite_client: httpx.Client, job: str) -> None:
    """Two ids that read the same on the dashboard would be two jobs (2026-12-07 fuzz)."""
    r = sqlite_client.post("/v1/plans", json={"job_id": job, "step": 0, "lengths": [1000]})
    _assert_422(r, "body.job_id")


def test_a_job_id_may_be_any_visible_text(sqlite_client: httpx.Client) -> None:
    r = sqlite_client.post(
        "/v1/plans", json={"job_id": "日本語-jöb.1", "step": 0, "lengths": [1000]}
    )
    assert r.status_code == 200, r.text
