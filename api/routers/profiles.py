"""``/v1/profiles/{name}``: store and read named cost-model profiles (versioned).

A PUT with the constants already stored is a no-op (200); changed constants become the next
version (201). A plan request that names a profile (``profile_name``) is planned with its newest
version, and the stored request keeps the name and version it was planned with.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError

from api.auth import Caller
from api.deps import StoreDep
from api.problems import ProblemError, problem_responses
from api.profile_store import ProfileStore, StoredProfile
from api.routers import plans
from api.routers.params import DecimalInt
from solver.profiles import PROFILE_NAME_PATTERN, Profile

# Authenticated like plans: whatever dependencies guard the plans router guard these routes.
router = APIRouter(
    prefix="/v1/profiles", tags=["profiles"], dependencies=list(plans.router.dependencies)
)

ProfileName = Annotated[str, Path(min_length=1, max_length=100, pattern=PROFILE_NAME_PATTERN)]


def _store(request: Request) -> ProfileStore:
    store: ProfileStore = request.app.state.profiles
    return store


def as_profile(stored: StoredProfile) -> Profile:
    return Profile.model_validate({**stored.body, "name": stored.name, "version": stored.version})


@router.put(
    "/{name}",
    response_model=Profile,
    status_code=201,
    summary="Store a named profile (a new version when its constants changed)",
    responses={
        200: {"model": Profile, "description": "Unchanged: the stored version."},
        **problem_responses(400, 401, 403, 413, 422, 429, 503),
    },
)
async def put_profile(
    name: ProfileName, body: Profile, request: Request, db: StoreDep, caller: Caller
) -> Response:
    caller.require_all()  # a profile prices every job that names it
    if "name" in body.model_fields_set and body.name != name:
        raise RequestValidationError(
            [
                {
                    "loc": ("body", "name"),
                    "msg": f"is {body.name!r}, the path names {name!r}",
                    "type": "value_error",
                }
            ]
        )
    constants = body.model_dump(exclude={"name", "version"})
    stored, created = await db.call(_store(request).put_profile, name, constants)
    return Response(
        as_profile(stored).model_dump_json(),
        status_code=201 if created else 200,
        media_type="application/json",
    )


@router.get(
    "/{name}",
    response_model=Profile,
    summary="A stored profile (its newest version unless one is asked for)",
    responses=problem_responses(401, 403, 404, 422, 429, 503),
)
async def get_profile(
    name: ProfileName,
    request: Request,
    db: StoreDep,
    caller: Caller,
    version: Annotated[DecimalInt | None, Query(ge=1, le=2**31 - 1)] = None,
) -> Profile:
    stored = await db.call(_store(request).get_profile, name, version)
    if stored is None:
        what = f"profile {name!r}" + ("" if version is None else f" version {version}")
        raise ProblemError(404, "profile-not-found", f"no stored {what}")
    return as_profile(stored)
