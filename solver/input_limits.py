"""One error, not a million: hostile bodies made cheap to refuse.

pydantic reports every bad entry of a list and every unknown key, and the service turns each
into an object before it answers: a 4 MB body of a million strings in ``lengths`` held the
event loop 18 s (a hostile-input hunt, 2026-12-07). Past ``MANY`` bad entries these checks run
first and raise one error that counts them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, model_validator

MANY = 20
"""More bad entries than this are one error (fewer keep pydantic's one error each)."""


def integers_only(value: Any, name: str) -> Any:
    """``value`` unchanged unless it is a list with more than ``MANY`` entries that are not
    integers (bools and floats included, as ``StrictInt`` has it): then one ``ValueError``
    naming the first and the count."""
    if not isinstance(value, list):
        return value
    bad = [i for i, x in enumerate(value) if type(x) is not int]
    if len(bad) <= MANY:
        return value
    first = repr(value[bad[0]])
    first = first if len(first) <= 40 else first[:39] + "\u2026"
    raise ValueError(
        f"{name}[{bad[0]}] = {first} is not an integer, nor are {len(bad) - 1} more entries"
    )


def few_unknown_keys(data: Any, known: Iterable[str], where: str = "") -> Any:
    """``data`` unchanged unless it is a dict with more than ``MANY`` keys that are not
    ``known``: then one ``ValueError`` naming a few, the count and ``where`` they are."""
    if not isinstance(data, dict) or len(data) <= MANY:
        return data
    names = set(known)
    unknown = [k for k in data if k not in names]
    if len(unknown) <= MANY:
        return data
    shown = ", ".join(repr(str(k)[:40]) for k in unknown[:5])
    raise ValueError(
        f"{len(unknown)} unknown fields{' in ' + where if where else ''} ({shown}, ...)"
    )


class FewUnknownKeys(BaseModel):
    """A model whose body of more than ``MANY`` unknown keys is one error (the bodies the
    service validates: measurements, profiles, feedback settings; a 15 MB body of 1.3 million
    unknown keys held the event loop 6-8 s on each of those routes)."""

    @model_validator(mode="before")
    @classmethod
    def _few_unknown_keys(cls, data: Any) -> Any:
        return few_unknown_keys(data, cls.model_fields)
