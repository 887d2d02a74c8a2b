"""`repack replay TRACE [--modes ...] [--json] [--workers N] [--steps N] [--profile FILE]`.

Plans every step of a trace in every mode, in parallel over processes, and prints the
paper-style table (mean predicted step time, change vs baseline, MFU, gap, solve time) over the
steps whose baseline layout has a parent wider than a node and over all steps.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import asdict
from functools import partial
from itertools import islice
from typing import TypeVar

from tqdm import tqdm

from cli.errors import INPUT_ERRORS, InputError, describe, reading
from cli.options import MODES, add_deadline, positive_int
from cli.output import format_table
from cli.profile_option import add_profile, load_profile, with_profile
from cli.replay_measured import add_measurements, describe_fit, measured_profile
from cli.replay_stats import (
    CLASSIFYING_MODE,
    GROUPS,
    ModeSummary,
    StepResult,
    summarize,
    wide_steps,
)
from solver.planner import plan
from solver.schema import PlanRequest
from solver.trace import load_trace

REPLAY_MODES: tuple[str, ...] = ("baseline", "sizing", "repack", "repack+parent", "repack+sizing")
"""Modes a replay runs by default, in table order: sizing alone, repacking alone, both."""

GROUP_LABELS = {"wide": "wide-parent steps", "all": "all steps"}

T = TypeVar("T")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "replay",
        help="plan every step of a trace in several modes and print the summary table",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("trace", help="scenario YAML, directory of request files, or one request")
    p.add_argument(
        "--modes",
        nargs="+",
        choices=MODES,
        default=list(REPLAY_MODES),
        metavar="M",
        help=f"modes to run, in table order (default: {' '.join(REPLAY_MODES)}; "
        f"choices: {', '.join(MODES)})",
    )
    p.add_argument(
        "--steps", type=positive_int, default=None, metavar="N", help="only the first N steps"
    )
    p.add_argument(
        "--workers",
        type=positive_int,
        default=os.cpu_count() or 1,
        metavar="N",
        help="processes (default: all CPUs)",
    )
    add_deadline(p)
    add_profile(p)
    add_measurements(p)
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (drawn only when stderr is a terminal)",
    )
    p.set_defaults(run=run)


def solve_step(index: int, request: PlanRequest, mode: str, deadline_ms: int | None) -> StepResult:
    """Plan step ``index`` of the trace in ``mode`` (runs in a worker process)."""
    where = f"step {request.step if request.step is not None else index}, mode {mode}"
    try:
        update: dict[str, object] = {"mode": mode}
        if deadline_ms is not None:  # the request's deadline: work budget and safety net
            update["deadline_ms"] = deadline_ms
        result = plan(request.model_copy(update=update))
    except INPUT_ERRORS as exc:
        raise InputError(f"{where}: {describe(exc)}") from None
    except Exception as exc:
        exc.add_note(where)
        raise
    return StepResult.from_plan(index, result, request.cluster.gpus_per_node)


def map_progress(
    calls: Sequence[Callable[[], T]], workers: int, *, progress: bool
) -> Iterator[tuple[int, T]]:
    """Run ``calls`` (picklable partials) on ``workers`` forked processes; yield
    ``(index, result)`` as they finish, with a progress bar on stderr."""
    bar = tqdm(total=len(calls), file=sys.stderr, unit="plan", disable=None if progress else True)
    with bar:
        if workers == 1:
            for i, call in enumerate(calls):
                yield i, call()
                bar.update()
            return
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            futures: dict[Future[T], int] = {pool.submit(call): i for i, call in enumerate(calls)}
            try:
                for future in as_completed(futures):
                    yield futures[future], future.result()
                    bar.update()
            except BaseException:
                # Fail fast: without this, leaving the block would run every queued call.
                pool.shutdown(wait=False, cancel_futures=True)
                raise


def replay(
    requests: Sequence[PlanRequest],
    modes: Sequence[str],
    *,
    workers: int,
    deadline_ms: int | None = None,
    progress: bool = False,
) -> list[StepResult]:
    """Every (step, mode) result, in request order then mode order; the baseline, which
    classifies the steps, is solved too when ``modes`` lacks it (and listed first)."""
    solved = list(modes) if CLASSIFYING_MODE in modes else [CLASSIFYING_MODE, *modes]
    calls = [
        partial(solve_step, i, request, mode, deadline_ms)
        for i, request in enumerate(requests)
        for mode in solved
    ]
    results: list[StepResult | None] = [None] * len(calls)
    for k, result in map_progress(calls, min(workers, len(calls)), progress=progress):
        results[k] = result
    return [r for r in results if r is not None]


def run(args: argparse.Namespace) -> int:
    profile = load_profile(args.profile)
    with reading(args.trace):
        requests = [with_profile(r, profile) for r in islice(load_trace(args.trace), args.steps)]
    fitted = None
    if args.measurements:
        requests, fitted = measured_profile(
            requests, args.measurements, args.measured_mode, args.deadline_ms
        )
        print(describe_fit(fitted), file=sys.stderr if args.json else sys.stdout)
    results = replay(
        requests,
        args.modes,
        workers=args.workers,
        deadline_ms=args.deadline_ms,
        progress=not args.no_progress,
    )
    table = summarize(results, args.modes)
    wide = len(wide_steps(results))
    if args.json:
        report = {
            "trace": args.trace,
            "steps": len(requests),
            "wide_steps": wide,
            "modes": list(args.modes),
            "groups": {g: [asdict(row) for row in table[g]] for g in GROUPS},
        }
        if fitted is not None:
            report["measured_profile"] = fitted.constants
        print(json.dumps(report, indent=1))
    else:
        share = wide / len(requests) * 100
        print(
            f"{args.trace}: {len(requests)} steps, {wide} with a parent wider than a node "
            f"({share:.1f}%)\n"
        )
        print(render(table))
    return 0


def _cell(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def render(table: dict[str, list[ModeSummary]]) -> str:
    """The summary as a Markdown table, one row per (group, mode)."""
    header = [
        "steps",
        "mode",
        "n",
        "step time ms",
        "vs baseline",
        "MFU",
        "median gap",
        "p99 solve ms",
    ]
    rows = [
        [
            GROUP_LABELS[group],
            row.mode,
            str(row.steps),
            _cell(row.step_time_ms, ".1f"),
            "-" if row.change_pct is None else f"{row.change_pct:+.1f}%",
            _cell(row.mfu, ".3f"),
            "-" if row.median_gap is None else f"{row.median_gap * 100:.2f}%",
            _cell(row.p99_solve_ms, ".0f"),
        ]
        for group in GROUPS
        for row in table[group]
    ]
    return format_table(header, rows, left=2)
