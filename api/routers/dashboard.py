"""Dashboard pages: jobs, plan quality over a job's steps, the layout of one step.

Pages are server-rendered shells with their data inlined as JSON; ``dashboard.js`` draws the
plots with the plotly.js file bundled in the ``plotly`` Python package (no CDN).
"""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse
from fastapi.templating import Jinja2Templates

from api.auth import BrowserCaller
from api.deps import SettingsDep, StoreDep
from api.feedback import feedback_view
from api.measurement_view import compare_steps
from api.problems import ProblemError
from api.routers.jobs import Step
from api.routers.params import JobIdPath, PlanIdPath

router = APIRouter(include_in_schema=False)
templates = Jinja2Templates(directory=str(Path(__file__).resolve().parent.parent / "templates"))

PLOTLY_JS = Path(str(files("plotly") / "package_data" / "plotly.min.js"))
MAX_PLOTTED_STEPS = 10_000
"""Steps one job page plots (the latest are what matters; older ones are in the API)."""

JobId = JobIdPath
PlanId = PlanIdPath


@router.get("/")
async def root() -> RedirectResponse:
    return RedirectResponse("/dashboard")


@router.get("/dashboard/assets/plotly.min.js")
async def plotly_js() -> FileResponse:
    return FileResponse(
        PLOTLY_JS, media_type="text/javascript", headers={"Cache-Control": "max-age=86400"}
    )


@router.get("/dashboard", response_class=HTMLResponse)
async def jobs_page(
    request: Request, store: StoreDep, settings: SettingsDep, caller: BrowserCaller
) -> HTMLResponse:
    caller.require_all()
    jobs = await store.list_jobs(None, settings.page_limit)
    return templates.TemplateResponse(request, "jobs.html", {"jobs": jobs})


@router.get("/dashboard/jobs/{job_id}", response_class=HTMLResponse)
async def job_page(
    request: Request, job_id: JobId, store: StoreDep, caller: BrowserCaller
) -> HTMLResponse:
    caller.require(job_id)
    rows = await store.list_steps(job_id, None, MAX_PLOTTED_STEPS)
    if not rows and not await store.has_job(job_id):
        raise ProblemError(404, "job-not-found", f"no plans for job {job_id!r}")
    steps = [Step.from_row(r).model_dump(mode="json") for r in rows]
    return templates.TemplateResponse(request, "job.html", {"job_id": job_id, "steps": steps})


@router.get("/dashboard/plans/{plan_id}", response_class=HTMLResponse)
async def plan_page(
    request: Request, plan_id: PlanId, store: StoreDep, caller: BrowserCaller
) -> HTMLResponse:
    row = await store.get_row(plan_id)
    if row is None or not caller.may(row.job_id):
        raise ProblemError(404, "plan-not-found", f"no plan with id {plan_id!r}")
    data: dict[str, Any] = {
        "plan": json.loads(row.body),
        "lengths": json.loads(row.lengths),
        "nodes": row.nodes,
        "gpus_per_node": row.gpus_per_node,
    }
    return templates.TemplateResponse(
        request, "plan.html", {"plan_id": plan_id, "row": row, "data": data}
    )


@router.get("/dashboard/jobs/{job_id}/measured", response_class=HTMLResponse)
async def measured_page(
    request: Request, job_id: JobId, store: StoreDep, caller: BrowserCaller
) -> HTMLResponse:
    """Predicted vs measured step times, error distribution, terms and fitted constants."""
    caller.require(job_id)
    profiles = request.app.state.profiles
    steps = await store.call(compare_steps, profiles, store.store, job_id, MAX_PLOTTED_STEPS, None)
    if not steps:
        raise ProblemError(404, "job-not-found", f"no measurements for job {job_id!r}")
    feedback = await store.call(feedback_view, profiles, job_id)
    data = {"steps": steps, "feedback": feedback}
    return templates.TemplateResponse(
        request,
        "measured.html",
        {"job_id": job_id, "steps": steps, "feedback": feedback, "data": data},
    )
