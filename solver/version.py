"""The installed package's version, one source for `repack --version` and the OpenAPI document."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

PACKAGE = "repack"


def package_version() -> str:
    """The version pip installed (pyproject's ``version``); ``0+unknown`` when run from a
    source tree that was never installed."""
    try:
        return version(PACKAGE)
    except PackageNotFoundError:
        return "0+unknown"
