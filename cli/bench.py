"""`repack bench [--sizes GPUS:SAMPLES ...] [--repeats N] [--profile FILE] [--json]`: latency.

For each problem size, ``--repeats`` generated steps (the default length distribution of
``solver.trace``, with the token budget set so that a step holds about SAMPLES samples) are
planned one after another in this process, by the whole planner (``full``: greedy + CP-SAT)
and by its greedy stages only (``greedy``, ``plan(..., use_cpsat=False)``); the table gives the
wall-clock latency of ``plan()`` (p50/p95/p99), the median gap to the lower bound and how often
the deadline fired.
Latencies are measurements of this machine, printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
from tqdm import tqdm

from cli.errors import InputError
from cli.options import MODES, add_deadline, positive_int
from cli.output import format_table
from cli.profile_option import add_profile, load_profile, with_profile
from solver.planner import plan
from solver.schema import ClusterSpec, ModelSpec, PlanRequest, allowed_parent_sizes
from solver.trace import LengthDistribution, Scenario, TraceSpec

DEFAULT_SIZES = ("16:50", "64:400", "1024:6000")
GPUS_PER_NODE = 8
PERCENTILES = (50, 95, 99)


@dataclass(frozen=True)
class BenchSize:
    gpus: int
    samples: int

    @classmethod
    def parse(cls, text: str) -> BenchSize:
        """``"64:400"`` -> 64 GPUs (nodes of 8), about 400 samples per step."""
        try:
            gpus, samples = (int(part) for part in text.split(":"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected GPUS:SAMPLES, got {text!r}") from None
        if gpus < GPUS_PER_NODE or gpus % GPUS_PER_NODE or samples < 1:
            raise argparse.ArgumentTypeError(
                f"expected GPUS a multiple of {GPUS_PER_NODE} and SAMPLES >= 1, got {text!r}"
            )
        return cls(gpus, samples)

    def scenario(self, steps: int, seed: int) -> Scenario:
        """A trace whose steps hold about ``samples`` samples on ``gpus`` ranks."""
        cluster = ClusterSpec(nodes=self.gpus // GPUS_PER_NODE, gpus_per_node=GPUS_PER_NODE)
        widest = max(allowed_parent_sizes(cluster, ModelSpec()))
        cap = widest * cluster.max_tokens_per_rank
        lengths = LengthDistribution(max_length=min(LengthDistribution().max_length, cap))
        fill = (
            self.samples
            * lengths.mean_length()
            / (cluster.world_size * cluster.max_tokens_per_rank)
        )
        if fill > 1:
            raise InputError(f"--sizes {self.gpus}:{self.samples}: too many samples to fit")
        trace = TraceSpec(seed=seed, steps=steps, fill=fill, lengths=lengths)
        return Scenario(job_id=f"bench-{self.gpus}", cluster=cluster, trace=trace)


SOLVERS = {"full": True, "greedy": False}
"""Row label -> ``plan(..., use_cpsat=...)``: the whole planner, and its greedy stages only."""


@dataclass(frozen=True, kw_only=True)
class BenchRow:
    gpus: int
    solver: str
    """``full`` (greedy + CP-SAT) or ``greedy`` (greedy stages only)."""
    samples: float
    """Mean samples per step."""
    repeats: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    median_gap: float | None
    deadline_hits: int
    """Solves stopped by the wall-clock deadline."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "bench",
        help="solver latency and gap per problem size",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--sizes",
        nargs="+",
        type=BenchSize.parse,
        default=[BenchSize.parse(s) for s in DEFAULT_SIZES],
        metavar="GPUS:SAMPLES",
        help=f"problem sizes (default: {' '.join(DEFAULT_SIZES)})",
    )
    p.add_argument(
        "--repeats", type=positive_int, default=20, metavar="N", help="steps per size (default 20)"
    )
    p.add_argument("--mode", choices=MODES, default="repack+parent", help="default repack+parent")
    p.add_argument("--seed", type=int, default=0, help="trace seed (default 0)")
    add_deadline(p)
    add_profile(p)
    p.add_argument("--no-greedy", action="store_true", help="skip the greedy-only rows")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(run=run)


def bench_size(
    requests: list[PlanRequest],
    gpus: int,
    solver: str,
    deadline_ms: int | None,
    done: Callable[[], object],
) -> BenchRow:
    """Plan each request once with ``solver``, timing the whole ``plan()`` call."""
    latencies, gaps, hits = [], [], 0
    for request in requests:
        t0 = time.perf_counter()
        try:
            result = plan(request, deadline_ms=deadline_ms, use_cpsat=SOLVERS[solver])
        except Exception as exc:
            exc.add_note(f"{gpus} GPUs, step {request.step}, mode {request.mode}, {solver}")
            raise
        latencies.append((time.perf_counter() - t0) * 1e3)
        if result.metrics.gap is not None:
            gaps.append(result.metrics.gap)
        hits += result.metrics.stopped_by == "deadline"
        done()
    p50, p95, p99 = (float(np.percentile(latencies, q)) for q in PERCENTILES)
    return BenchRow(
        gpus=gpus,
        solver=solver,
        samples=float(np.mean([len(r.lengths) for r in requests])),
        repeats=len(requests),
        p50_ms=p50,
        p95_ms=p95,
        p99_ms=p99,
        median_gap=float(np.median(gaps)) if gaps else None,
        deadline_hits=hits,
    )


def run(args: argparse.Namespace) -> int:
    profile = load_profile(args.profile)
    batches = [
        [
            with_profile(r, profile).model_copy(update={"mode": args.mode})
            for r in size.scenario(args.repeats, args.seed).requests()
        ]
        for size in args.sizes
    ]
    solvers = ["full"] if args.no_greedy else list(SOLVERS)
    plan(batches[0][0], deadline_ms=args.deadline_ms)  # warm-up: imports, solver start-up
    total = sum(len(b) for b in batches) * len(solvers)
    with tqdm(total=total, file=sys.stderr, unit="plan", disable=args.no_progress) as bar:
        rows = [
            bench_size(batch, size.gpus, solver, args.deadline_ms, bar.update)
            for size, batch in zip(args.sizes, batches, strict=True)
            for solver in solvers
        ]
    if args.json:
        print(json.dumps({"mode": args.mode, "rows": [asdict(r) for r in rows]}, indent=1))
    else:
        print(f"mode {args.mode}, {args.repeats} steps per size, wall-clock ms per plan()\n")
        print(render(rows))
    return 0


def render(rows: list[BenchRow]) -> str:
    header = ["GPUs", "solver", "samples", "p50 ms", "p95 ms", "p99 ms", "median gap"]
    header.append("deadline hits")
    body = [
        [
            str(r.gpus),
            r.solver,
            f"{r.samples:.0f}",
            f"{r.p50_ms:.1f}",
            f"{r.p95_ms:.1f}",
            f"{r.p99_ms:.1f}",
            "-" if r.median_gap is None else f"{r.median_gap * 100:.2f}%",
            f"{r.deadline_hits}/{r.repeats}",
        ]
        for r in rows
    ]
    return format_table(header, body, left=2)
