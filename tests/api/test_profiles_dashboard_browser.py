"""The predicted-vs-measured dashboard page in real headless Chromium."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from api.server import ServerThread
from tests.api.conftest import make_settings, small_request
from tests.api.test_dashboard_browser import browser, page, screenshot

pytestmark = pytest.mark.browser
__all__ = ["browser", "page"]  # fixtures shared with the other dashboard pages

JOB = "measured-job"
STEPS = 12


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[Any]]]:
    """A live server with ``STEPS`` planned and measured steps of an opted-in job."""
    db = tmp_path_factory.mktemp("measured") / "plans.db"
    with ServerThread(make_settings(f"sqlite:///{db}")) as server:
        c = httpx.Client(base_url=server.url, timeout=120)
        r = c.put(
            f"/v1/jobs/{JOB}/feedback", json={"enabled": True, "min_steps": 4, "refit_every": 4}
        )
        assert r.status_code == 200
        answers = []
        for step in range(STEPS):
            lengths = [150000 - 9000 * step, 9000, 30000, 4000, 1200 + 100 * step]
            plan = c.post("/v1/plans", json={**small_request(JOB, step), "lengths": lengths})
            assert plan.status_code == 200, plan.text
            predicted = plan.json()["metrics"]["step_time_ms"]
            body = {"step_time_ms": predicted * (1.3 + 0.02 * (step % 3)), "all_to_all_ms": 50.0}
            answer = c.post(f"/v1/jobs/{JOB}/steps/{step}/measurements", json=body)
            assert answer.status_code == 201, answer.text
            answers.append(answer.json())
        yield server.url, answers


def test_measured_page_plots_predicted_measured_errors_terms_and_constants(
    page: Any, measured: tuple[str, list[Any]]
) -> None:
    url, _ = measured
    page.goto(f"{url}/dashboard/jobs/{JOB}")
    page.click("#measured-link")
    page.wait_for_selector("#plot-constants .main-svg")
    assert page.locator(".plot.js-plotly-plot").count() == 4
    assert page.locator("#plot-predicted-measured .scatterlayer .trace").count() == 2
    assert page.locator("#plot-predicted-measured .scatterlayer .point").count() == 2 * STEPS
    assert page.locator("#plot-error-hist .barlayer .point").count() >= 1
    # compute, intra, inter, latency per call and per peer, overhead
    assert page.locator("#plot-terms .barlayer .trace").count() == 6
    versions = httpx.get(f"{url}/v1/jobs/{JOB}/feedback").json()["versions"]
    assert len(versions) >= 2
    assert page.locator("#plot-constants .scatterlayer .point").count() >= 2 * len(versions)
    assert f"{len(versions)} profile versions" in page.locator("h1").inner_text()
    assert page.errors == []
    screenshot(page, "dashboard-measured.png")


def test_measured_page_of_an_unmeasured_job_is_a_404(measured: tuple[str, list[Any]]) -> None:
    url, _ = measured
    r = httpx.get(f"{url}/dashboard/jobs/nobody/measured")
    assert r.status_code == 404
