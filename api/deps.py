"""Dependencies as ``Annotated`` aliases; the objects live on ``app.state`` (built in main)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from api.database import Database
from api.metrics import ServiceMetrics
from api.plan_service import PlanService
from api.settings import Settings
from api.solver_pool import SolverPool


def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def _service(request: Request) -> PlanService:
    service: PlanService = request.app.state.service
    return service


def _database(request: Request) -> Database:
    return _service(request).db


def _pool(request: Request) -> SolverPool:
    return _service(request).pool


def _metrics(request: Request) -> ServiceMetrics:
    metrics: ServiceMetrics = request.app.state.metrics
    return metrics


SettingsDep = Annotated[Settings, Depends(_settings)]
ServiceDep = Annotated[PlanService, Depends(_service)]
DatabaseDep = Annotated[Database, Depends(_database)]
StoreDep = DatabaseDep
"""Older name of ``DatabaseDep`` (the time-bounded store)."""
PoolDep = Annotated[SolverPool, Depends(_pool)]
MetricsDep = Annotated[ServiceMetrics, Depends(_metrics)]
