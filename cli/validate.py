"""`repack validate REQUEST PLAN [--profile FILE]`: exit 0 if the plan is valid, else 1 with one
line per violation."""

from __future__ import annotations

import argparse
import sys

from cli.errors import reading
from cli.profile_option import add_profile, load_profile, with_profile
from solver.io import load_document, read_request
from solver.schema import Plan
from solver.validate import validate_plan

EXIT_INVALID = 1


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "validate",
        help="check a plan against its request (layout rules and metrics)",
        description="Exit 0 if PLAN is a valid plan for REQUEST; else exit 1 and print each "
        "violated rule on its own line (stdout). Unreadable input exits 2.",
    )
    p.add_argument("request", help="PlanRequest file (.json, .yaml or .yml)")
    p.add_argument("plan", help="Plan file (.json)")
    add_profile(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    profile = load_profile(args.profile)
    with reading(args.request):
        request = with_profile(read_request(args.request), profile)
    with reading(args.plan):
        result = Plan.model_validate(load_document(args.plan))
    violations = validate_plan(request, result)
    for line in violations:
        print(line)
    if violations:
        print(f"{args.plan}: {len(violations)} violation(s)", file=sys.stderr)
        return EXIT_INVALID
    print(f"{args.plan}: valid plan for {args.request}", file=sys.stderr)
    return 0
