"""Reading requests from files exactly as the API reads them from HTTP (JSON or YAML)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from solver.errors import DocumentError
from solver.schema import PlanRequest


def load_document(path: str | Path) -> Any:
    """The document in ``path`` (YAML by its suffix, else JSON)."""
    return parse_document(Path(path).read_bytes(), yaml_text=str(path).endswith((".yaml", ".yml")))


def parse_document(raw: bytes | str, yaml_text: bool = False) -> Any:
    """One JSON (or YAML) document; input the parsers choke on without a syntax error of their
    own (binary data, nesting past the recursion limit, a 5,000-digit integer) is a
    ``DocumentError`` that says which, never a traceback."""
    try:
        text = raw.decode() if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as exc:
        raise DocumentError(f"not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    try:
        return yaml.safe_load(text) if yaml_text else json.loads(text)
    except RecursionError:
        raise DocumentError("nested too deeply to read") from None
    except (json.JSONDecodeError, yaml.YAMLError):
        raise
    except ValueError as exc:  # e.g. int() of a literal past sys.get_int_max_str_digits()
        raise DocumentError(" ".join(str(exc).split())) from None


def read_request(path: str | Path, mode: str | None = None) -> PlanRequest:
    data = load_document(path)
    if mode is not None and isinstance(data, dict):
        data = {**data, "mode": mode}
    return PlanRequest.model_validate(data)
