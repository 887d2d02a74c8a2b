"""Reading requests from files exactly as the API reads them from HTTP (JSON or YAML)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

from solver.errors import DocumentError
from solver.schema import PlanRequest

SAFE_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's safe loader where PyYAML was built with it: the pure-Python one took 33 s to read
a 2 MB list of 10^6 integers before the request could be refused (2026-12-07 fuzz)."""


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
        return yaml.load(text, Loader=SAFE_LOADER) if yaml_text else json.loads(text)
    except RecursionError:
        raise DocumentError("nested too deeply to read") from None
    except yaml.YAMLError as exc:
        if "nesting depth" in str(exc):  # libyaml's own limit
            raise DocumentError("nested too deeply to read") from None
        raise
    except json.JSONDecodeError:
        raise
    except ValueError as exc:  # e.g. int() of a literal past sys.get_int_max_str_digits()
        if "digits" in str(exc):
            raise DocumentError(
                f"an integer has more than {sys.get_int_max_str_digits()} digits"
            ) from None
        raise DocumentError(" ".join(str(exc).split())) from None


def read_request(path: str | Path, mode: str | None = None) -> PlanRequest:
    data = load_document(path)
    if mode is not None and isinstance(data, dict):
        data = {**data, "mode": mode}
    return PlanRequest.model_validate(data)
