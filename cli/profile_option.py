"""``--profile FILE``: plan with a profile read from a file (what ``repack calibrate`` writes)."""

from __future__ import annotations

import argparse

from cli.errors import reading
from solver.io import load_document
from solver.profiles import Profile
from solver.schema import PlanRequest


def add_profile(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--profile",
        default=None,
        metavar="FILE",
        help="cost-model profile (JSON or YAML; fields left out keep the default profile's "
        "values); replaces every request's profile, profile_name and the cluster's peak, "
        "efficiency and bandwidths",
    )


def load_profile(path: str | None) -> Profile | None:
    """The profile in ``path`` (None without one); bad files raise input errors naming it."""
    if path is None:
        return None
    with reading(path):
        return Profile.model_validate(load_document(path))


def with_profile(request: PlanRequest, profile: Profile | None) -> PlanRequest:
    """``request`` planned with ``profile`` (unchanged without one)."""
    if profile is None:
        return request
    return request.model_copy(update={"profile": profile, "profile_name": None})
