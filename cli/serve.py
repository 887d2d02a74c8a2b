"""`repack serve [--host H] [--port N] [--database-url URL] [--workers N]`: the plan service.

Settings come from ``REPACK_*`` environment variables (see docs/api.md); flags override them.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the service's stack is imported only when a service command runs
    from api.settings import Settings


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("serve", help="run the plan service (uvicorn)")
    p.add_argument("--host", default=None, help="bind address (REPACK_HOST)")
    p.add_argument("--port", type=int, default=None, help="port (REPACK_PORT)")
    p.add_argument("--database-url", default=None, help="SQLAlchemy URL (REPACK_DATABASE_URL)")
    p.add_argument("--workers", type=int, default=None, help="solver processes")
    p.set_defaults(run=run)


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Environment settings with the flags that were given laid over them."""
    from api.settings import Settings

    overrides: dict[str, Any] = {
        "host": args.host,
        "port": args.port,
        "database_url": args.database_url,
        "solver_workers": args.workers,
    }
    return Settings(**{k: v for k, v in overrides.items() if v is not None})


def run(args: argparse.Namespace) -> int:
    from api.server import serve

    serve(settings_from_args(args))
    return 0
