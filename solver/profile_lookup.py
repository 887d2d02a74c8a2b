"""The hook through which the service resolves ``profile_name``: the solver never stores
profiles, it plans a request with the profile written into it."""

from __future__ import annotations

from collections.abc import Callable

from solver.errors import PlanningError
from solver.profiles import Profile
from solver.schema import PlanRequest

ProfileLookup = Callable[[str], Profile | None]
"""Name -> the stored profile (its current version), or None when there is none."""


class UnknownProfileError(PlanningError):
    """``profile_name`` names no stored profile."""


def with_named_profile(request: PlanRequest, lookup: ProfileLookup) -> PlanRequest:
    """``request`` with ``profile`` filled from ``lookup(profile_name)``; unchanged when it
    names no profile or already carries one inline. The result keeps ``profile_name``, so a
    stored request says which profile (and version) it was planned with."""
    name = request.profile_name
    if name is None or request.profile is not None:
        return request
    found = lookup(name)
    if found is None:
        raise UnknownProfileError("profile_name", f"no stored profile is named {name!r}")
    if found.name != name:
        found = found.model_copy(update={"name": name})
    return request.model_copy(update={"profile": found})
