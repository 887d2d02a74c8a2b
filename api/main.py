"""Builds the FastAPI app: settings, storage, solver pool, routers, error handlers, metrics."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from asgi_correlation_id import CorrelationIdMiddleware
from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool

from api.auth import Authenticator, load_tokens
from api.body_limit import BodyLimitMiddleware
from api.body_timeout import BodyTimeoutMiddleware
from api.database import Database, open_store
from api.head_requests import HeadAsGetMiddleware
from api.metrics import LatencyMiddleware, ServiceMetrics
from api.plan_service import PlanService, WorkLimits
from api.problems import install_problem_handlers
from api.profile_store import ProfileStore
from api.retention import run_retention
from api.routers import dashboard, docs, health, jobs, plans
from api.routers import measurements as measurements_router
from api.routers import profiles as profiles_router
from api.security_headers import SecurityHeadersMiddleware
from api.settings import Settings, db_timeouts, get_settings
from api.solver_pool import SolverPool, WorkerLimits
from solver.version import package_version

STATIC_DIR = Path(__file__).resolve().parent / "static"
log = logging.getLogger("repack.service")


def create_app(settings: Settings | None = None) -> FastAPI:
    """A ready-to-serve app; storage and solver workers start in its lifespan."""
    settings = settings or get_settings()
    metrics = ServiceMetrics(settings.recent_window)
    tokens = load_tokens(settings.tokens_file) if settings.tokens_file else {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = await run_in_threadpool(open_store, settings.database_url, db_timeouts(settings))
        db = Database(store, settings.db_timeout_ms / 1e3)
        # profiles, measurements, job feedback: tables of migration 0005, in the same database
        app.state.profiles = ProfileStore(store.engine)
        pool = SolverPool(
            workers=settings.solver_workers,
            queue_limit=settings.queue_limit,
            retry_after_s=settings.retry_after_s,
            margin_ms=settings.deadline_margin_ms,
            min_budget_ms=settings.min_solve_budget_ms,
            limits=WorkerLimits(
                memory_mb=settings.worker_memory_mb,
                max_tasks=settings.worker_max_tasks,
                hard_stop_factor=settings.hard_stop_factor,
                hard_stop_min_s=settings.hard_stop_min_ms / 1e3,
            ),
        )
        retention: asyncio.Task[None] | None = None
        try:
            await pool.warm_up()
            # Everything imported so far lives as long as the process: keep it out of the
            # garbage collector's full passes, which would otherwise walk it on every one.
            gc.collect()
            gc.freeze()
            app.state.service = PlanService(
                db,
                pool,
                metrics,
                settings.plan_cache_size,
                settings.default_deadline_ms,
                WorkLimits(settings.max_samples, settings.max_samples_x_ranks, settings.max_ranks),
            )
            if settings.anonymous_allowed:
                log.warning(
                    "anonymous access is enabled: anyone who reaches %s:%s can read and post "
                    "plans (set REPACK_TOKENS_FILE to require tokens)",
                    settings.host,
                    settings.port,
                )
            if settings.retention_days > 0:
                retention = asyncio.create_task(
                    run_retention(db, settings.retention_days, settings.retention_interval_s)
                )
            yield
        finally:
            if retention is not None:
                retention.cancel()
            pool.close()
            db.close()

    app = FastAPI(
        title="repack plan service",
        version=package_version(),
        summary="Layerwise Repacking plans for variable-length distributed training (v1).",
        lifespan=lifespan,
        docs_url=None,  # served by api.routers.docs from local files, not a CDN
        redoc_url=None,
    )
    app.state.auth = Authenticator(tokens, settings.anonymous_allowed, settings.rate_limit)
    app.state.settings = settings
    app.state.metrics = metrics
    install_problem_handlers(app)
    app.add_middleware(HeadAsGetMiddleware)  # innermost: see api/head_requests.py
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(BodyTimeoutMiddleware, timeout_s=settings.body_timeout_s)
    app.add_middleware(LatencyMiddleware, metrics=metrics)
    app.add_middleware(SecurityHeadersMiddleware)
    app.add_middleware(CorrelationIdMiddleware, header_name="X-Request-ID")
    for module in (plans, jobs, health, dashboard, docs):
        app.include_router(module.router)
    app.include_router(measurements_router.router)
    app.include_router(profiles_router.router)
    app.mount(docs.ASSETS, docs.assets, name="docs-assets")
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    return app
