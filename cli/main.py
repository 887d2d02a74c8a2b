"""`repack` command line: one subcommand per module, each exposing ``register(subparsers)``."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn

from cli.errors import EXIT_BAD_INPUT, PROG, guarded
from solver.version import package_version

DESCRIPTION = (
    "Layerwise Repacking planner: plan a step, check a plan, replay a trace in several modes, "
    "benchmark the solver, serve the plan API. Bad input exits 2 with one line on stderr."
)

COMMAND_MODULES = (
    "cli.solve",
    "cli.validate",
    "cli.replay",
    "cli.bench",
    "cli.serve",
    "cli.demo",
    "cli.bench_service",
    "cli.token",
    "cli.soak",
    "cli.calibrate",
)
"""Modules that add a subcommand; each defines ``register(subparsers)``."""


class OneLineParser(argparse.ArgumentParser):
    """Usage errors in the same one-line form as input errors (``repack: error: ...``)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{PROG}: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog=PROG, description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"{PROG} {package_version()}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return guarded(args.run)(args)


if __name__ == "__main__":
    sys.exit(main())
