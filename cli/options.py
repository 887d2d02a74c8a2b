"""Argument types and options shared by the subcommands."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import get_args

from solver.schema import MAX_DEADLINE_MS, Mode

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


def bounded_int(low: int, high: int) -> Callable[[str], int]:
    """argparse type: an integer in ``[low, high]`` (an unbounded ``--indent`` grew a plan to
    gigabytes; a ``--deadline-ms`` past the schema's limit bypassed it)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        if value > high:
            raise argparse.ArgumentTypeError(f"must be <= {high}, got {value}")
        return value

    return parse


def output_path(text: str) -> str:
    """argparse type: a file to write; an empty one is refused (it used to mean stdout)."""
    if not text:
        raise argparse.ArgumentTypeError("expected a file path, got an empty string")
    return text


def add_deadline(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--deadline-ms",
        type=bounded_int(1, MAX_DEADLINE_MS),
        default=None,
        metavar="N",
        help="wall-clock budget per solve (default: the request's, else the planner's)",
    )
