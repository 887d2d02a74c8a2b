"""Reading requests from files exactly as the API reads them from HTTP (JSON or YAML)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from solver.schema import PlanRequest


def load_document(path: str | Path) -> Any:
    text = Path(path).read_text()
    if str(path).endswith((".yaml", ".yml")):
        return yaml.safe_load(text)
    return json.loads(text)


def read_request(path: str | Path, mode: str | None = None) -> PlanRequest:
    data = load_document(path)
    if mode is not None and isinstance(data, dict):
        data = {**data, "mode": mode}
    return PlanRequest.model_validate(data)
