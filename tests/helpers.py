"""Shared test helpers: requests built in code, scenario and example files read in one place."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

from solver.io import load_document
from solver.schema import Plan, PlanRequest

ROOT = Path(__file__).resolve().parent.parent
PROJECT_EXAMPLES = ROOT / "docs" / "contract-examples"
"""The contract examples of docs/design.md section 4, kept in the repository."""


def example_path(name: str) -> Path:
    return PROJECT_EXAMPLES / name


def example_request() -> PlanRequest:
    return PlanRequest.model_validate(load_document(example_path("request-2node.json")))


def example_plan() -> Plan:
    return Plan.model_validate(load_document(example_path("plan-2node.json")))


def request(**fields: Any) -> PlanRequest:
    """A request from keyword fields, validated exactly as the API validates JSON."""
    return PlanRequest.model_validate(fields)


def long_tailed_lengths(
    rng: random.Random, n: int, longest: int, median: float = 4000.0
) -> list[int]:
    """``n`` lengths with a lognormal body, each at most ``longest`` tokens."""
    mu = math.log(median)
    return [max(1, min(longest, int(rng.lognormvariate(mu, 1.2)))) for _ in range(n)]
