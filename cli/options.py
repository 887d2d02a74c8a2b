"""Argument types and options shared by the subcommands."""

from __future__ import annotations

import argparse
from typing import get_args

from solver.schema import Mode

MODES: tuple[str, ...] = get_args(Mode)
"""Every planner mode, in the contract's order."""


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1, with the same wording as the schema's messages."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def add_deadline(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--deadline-ms",
        type=positive_int,
        default=None,
        metavar="N",
        help="wall-clock budget per solve (default: the request's, else the planner's)",
    )
