"""`repack` command line: one subcommand per module, each exposing ``register(subparsers)``."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

COMMAND_MODULES = ("cli.solve", "cli.serve", "cli.demo", "cli.bench_service")
"""Modules that add a subcommand; each defines ``register(subparsers)``."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="repack", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
