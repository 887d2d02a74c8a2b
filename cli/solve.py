"""`repack solve REQUEST [--mode M] [--deadline-ms N] [--out PLAN.json]`."""

from __future__ import annotations

import argparse
import sys

from solver.io import read_request
from solver.planner import plan


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("solve", help="plan one step from a request file (JSON or YAML)")
    p.add_argument("request")
    p.add_argument("--mode", default=None)
    p.add_argument("--deadline-ms", type=int, default=None)
    p.add_argument("--out", default=None)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    request = read_request(args.request, mode=args.mode)
    result = plan(request, deadline_ms=args.deadline_ms)
    text = result.model_dump_json(indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text + "\n")
    return 0
