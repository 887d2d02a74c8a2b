"""The dashboard in real headless Chromium (Debian package driven by Playwright)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.server import ServerThread
from solver.trace import request_bodies
from tests.api.conftest import make_settings
from tests.helpers import ROOT

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOT_ENV = "REPACK_SCREENSHOT_DIR"
"""Set it to a directory to save the pages as PNG (docs/dashboard.png comes from here)."""
JOB = "browser-job"
STEPS = 6
NODES = 8


@pytest.fixture(scope="module")
def posted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[Any]]]:
    """A live server holding ``STEPS`` plans of one job; yields its URL and the plans."""
    db = tmp_path_factory.mktemp("browser") / "plans.db"
    with ServerThread(make_settings(f"sqlite:///{db}")) as server:
        plans = []
        for body in request_bodies(
            ROOT / "solver" / "scenarios" / "gpu64-200steps.yaml", STEPS, job_id=JOB
        ):
            r = httpx.post(f"{server.url}/v1/plans", json=body, timeout=120)
            assert r.status_code == 200
            plans.append(r.json())
        yield server.url, plans


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if shutil.which(CHROMIUM) is None:
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium (make test does)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A page that records console errors and uncaught exceptions in ``page.errors``."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.errors = errors
    yield pg
    context.close()


def screenshot(page: Any, name: str) -> None:
    directory = os.environ.get(SCREENSHOT_ENV)
    if directory:
        page.screenshot(path=str(Path(directory) / name), full_page=True)


def test_jobs_page_lists_the_job(page: Any, posted: tuple[str, list[Any]]) -> None:
    url, _ = posted
    page.goto(f"{url}/dashboard")
    rows = page.locator("tr.job-row")
    assert rows.count() == 1
    assert JOB in rows.first.inner_text()
    assert page.errors == []


def test_job_page_plots_every_step(page: Any, posted: tuple[str, list[Any]]) -> None:
    url, _ = posted
    page.goto(f"{url}/dashboard/jobs/{JOB}")
    page.wait_for_selector("#plot-status .main-svg")
    assert page.locator(".plot.js-plotly-plot").count() == 6
    # Step time: baseline and plan lines, one marker per step each.
    assert page.locator("#plot-step-time .scatterlayer .trace").count() == 2
    assert page.locator("#plot-step-time .scatterlayer .point").count() == 2 * STEPS
    for plot in ("speedup", "mfu", "gap", "solve"):
        assert page.locator(f"#plot-{plot} .scatterlayer .point").count() >= STEPS
    assert page.locator("#plot-status .barlayer .point").count() >= 1
    assert page.errors == []
    screenshot(page, "dashboard-job.png")


def test_plan_page_draws_the_layout(page: Any, posted: tuple[str, list[Any]]) -> None:
    url, plans = posted
    plan = max(plans, key=lambda p: len(p["children"]))
    page.goto(f"{url}/dashboard/plans/{plan['plan_id']}")
    page.wait_for_selector("#layout .parent")
    assert page.locator("#layout .gpu").count() == NODES * 8
    assert page.locator("#layout .parent").count() == len(plan["parents"])
    assert page.locator("#layout .child").count() == len(plan["children"])
    child = next(c for c in plan["children"] if c["samples"])
    page.locator("#layout .child").nth(child["id"]).hover()
    details = page.locator("#details").inner_text()
    assert f"child {child['id']}" in details
    assert f"#{child['samples'][0]}" in details
    assert page.errors == []
    screenshot(page, "dashboard-plan.png")
