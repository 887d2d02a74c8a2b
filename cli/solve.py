"""`repack solve REQUEST [--mode M] [--deadline-ms N] [--profile FILE] [--out PLAN.json]`."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from itertools import groupby

from cli.errors import reading
from cli.options import MODES, add_deadline, bounded_int, output_path
from cli.output import write_atomic
from cli.profile_option import add_profile, load_profile, with_profile
from solver.io import read_request
from solver.planner import plan
from solver.schema import Plan

MAX_INDENT = 16
"""Widest ``--indent``: pretty-printing, not padding."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "solve",
        help="plan one step from a request file (JSON or YAML)",
        description="Plan one step. Without --out the plan JSON goes to stdout and the summary "
        "to stderr; with --out the plan is written atomically and the summary goes to stdout.",
    )
    p.add_argument("request", help="PlanRequest file (.json, .yaml or .yml)")
    p.add_argument("--mode", choices=MODES, default=None, help="override the request's mode")
    add_deadline(p)
    add_profile(p)
    p.add_argument(
        "--out", type=output_path, default=None, metavar="PLAN.json", help="write the plan here"
    )
    p.add_argument(
        "--indent",
        type=bounded_int(0, MAX_INDENT),
        default=None,
        metavar="N",
        help="pretty-print the plan JSON with N spaces (default: compact, as the service sends)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    profile = load_profile(args.profile)
    with reading(args.request):
        request = with_profile(read_request(args.request, mode=args.mode), profile)
    if args.deadline_ms is not None:  # the request's deadline: work budget and safety net
        request = request.model_copy(update={"deadline_ms": args.deadline_ms})
    result = plan(request, deadline_ms=args.deadline_ms)
    text = result.model_dump_json(indent=args.indent) + "\n"
    if args.out is not None:
        write_atomic(args.out, text)
        print(summary(result))
    else:
        sys.stdout.write(text)
        print(summary(result), file=sys.stderr)
    return 0


def _sizes(sizes: list[int]) -> str:
    runs = [(size, len(list(group))) for size, group in groupby(sizes)]
    return ", ".join(f"{n} x {size}" for size, n in runs) + " ranks"


def summary(result: Plan) -> str:
    """A few human-readable lines: layout shape, predicted time vs baseline, gap, status."""
    m = result.metrics
    parents = [p.ranks[1] - p.ranks[0] for p in result.parents]
    per_size = Counter(c.ranks[1] - c.ranks[0] for c in result.children)
    empty = sum(1 for c in result.children if not c.samples)
    children = ", ".join(f"size {k}: {per_size[k]}" for k in sorted(per_size))
    change = (m.step_time_ms / m.baseline_step_time_ms - 1) * 100
    gap = "n/a" if m.gap is None else f"{m.gap * 100:.2f}%"
    solve = "" if m.solve_ms is None else f", solved in {m.solve_ms:.0f} ms"
    return "\n".join(
        [
            f"plan      {result.plan_id} ({result.mode}): {result.status}, "
            f"stopped by {m.stopped_by or 'n/a'}{solve}",
            f"parents   {len(parents)}: {_sizes(parents)}",
            f"children  {len(result.children)} ({empty} empty): {children}",
            f"step time {m.step_time_ms:.1f} ms vs baseline {m.baseline_step_time_ms:.1f} ms: "
            f"speed-up {m.speedup:.3f}x ({change:+.1f}%), MFU {m.mfu:.3f} vs {m.baseline_mfu:.3f}",
            f"gap       {gap} to the lower bound",
        ]
    )
