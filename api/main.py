"""Builds the FastAPI app: settings, storage, solver pool, routers, error handlers, metrics."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool

from api.body_limit import BodyLimitMiddleware
from api.metrics import LatencyMiddleware, ServiceMetrics
from api.plan_service import PlanService
from api.problems import install_problem_handlers
from api.profile_store import ProfileStore
from api.routers import dashboard, health, jobs, plans
from api.routers import measurements as measurements_router
from api.routers import profiles as profiles_router
from api.settings import Settings, get_settings
from api.solver_pool import SolverPool
from api.storage import PlanStore

STATIC_DIR = Path(__file__).resolve().parent / "static"


def create_app(settings: Settings | None = None) -> FastAPI:
    """A ready-to-serve app; storage and solver workers start in its lifespan."""
    settings = settings or get_settings()
    metrics = ServiceMetrics(settings.recent_window)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = PlanStore(settings.database_url)
        await run_in_threadpool(store.create_schema)
        app.state.profiles = ProfileStore(store.engine)  # profiles, measurements, job feedback
        await run_in_threadpool(app.state.profiles.create_schema)
        pool = SolverPool(
            workers=settings.solver_workers,
            queue_limit=settings.queue_limit,
            retry_after_s=settings.retry_after_s,
            margin_ms=settings.deadline_margin_ms,
            min_budget_ms=settings.min_solve_budget_ms,
            database_url=settings.database_url,
        )
        try:
            await pool.warm_up()
            # Everything imported so far lives as long as the process: keep it out of the
            # garbage collector's full passes, which would otherwise walk it on every one.
            gc.collect()
            gc.freeze()
            app.state.service = PlanService(
                store, pool, metrics, settings.plan_cache_size, settings.default_deadline_ms
            )
            yield
        finally:
            pool.close()
            store.close()

    app = FastAPI(
        title="repack plan service",
        version="1.0.0",
        summary="Layerwise Repacking plans for variable-length distributed training (v1).",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.metrics = metrics
    install_problem_handlers(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(LatencyMiddleware, metrics=metrics)
    for module in (plans, jobs, health, dashboard):
        app.include_router(module.router)
    app.include_router(measurements_router.router)
    app.include_router(profiles_router.router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    return app
