"""`repack bench [--sizes GPUS:SAMPLES ...] [--deadlines MS,...] [--profile FILE] [--json]`.

For each problem size, ``--repeats`` generated steps (the default length distribution of
``solver.trace``, with the token budget set so that a step holds about SAMPLES samples) are
planned one after another in this process, by the whole planner (``full``: greedy + CP-SAT)
and by its greedy stages only (``greedy``, ``plan(..., use_cpsat=False)``); the table gives the
wall-clock latency of ``plan()`` (p50/p95/p99), the median gap to the lower bound, the mean
predicted step time vs the baseline, and how often the wall-clock deadline fired.

``--deadlines 50,200,1000`` runs every size once per deadline (written into each request, so
that it sets the deterministic work budget as well as the safety net) and adds the quality vs
deadline: each step's predicted step time relative to the same step at the longest deadline.
With ``--work-only`` the wall-clock safety net is set out of reach (10 minutes), so the quality
columns show what each deadline's deterministic work budget gives, the same on any machine;
without it they show what this machine delivered, safety net included.
Latencies are measurements of this machine, printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import cast

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


def deadline_list(text: str) -> list[int]:
    """argparse type: ``"50,200,1000"`` -> ``[50, 200, 1000]`` (each >= 1)."""
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MS[,MS...], got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"every deadline must be >= 1 ms, got {text!r}")
    return values


WORK_ONLY_SAFETY_NET_MS = 600_000
"""``--work-only``: a wall-clock safety net no bench solve reaches."""

SOLVERS = {"full": True, "greedy": False}
"""Row label -> ``plan(..., use_cpsat=...)``: the whole planner, and its greedy stages only."""


@dataclass(frozen=True, kw_only=True)
class BenchRow:
    gpus: int
    solver: str
    """``full`` (greedy + CP-SAT) or ``greedy`` (greedy stages only)."""
    deadline_ms: int | None
    """The requests' deadline (None: the planner's default)."""
    samples: float
    """Mean samples per step."""
    repeats: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    p99_cpu_ms: float
    """CPU time of this process per plan(): what the solve costs on a quiet machine, whatever
    else shares the cores (wall-clock percentiles grow with the load, this does not)."""
    median_gap: float | None
    deadline_hits: int
    """Solves stopped by the wall-clock deadline."""
    change_pct: float
    """Mean predicted step time vs the baseline, in percent (negative = faster)."""
    vs_longest_pct: float | None = None
    """Mean predicted step time vs the same steps at the longest deadline, in percent."""
    step_times_ms: tuple[float, ...] = ()
    """Predicted step time of each request, in order (for the comparison across deadlines)."""


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
    deadlines = p.add_mutually_exclusive_group()
    add_deadline(cast(argparse.ArgumentParser, deadlines))  # a group takes arguments alike
    deadlines.add_argument(
        "--deadlines",
        type=deadline_list,
        default=None,
        metavar="MS,MS,...",
        help="run every size at each of these request deadlines and report quality vs deadline",
    )
    p.add_argument(
        "--work-only",
        action="store_true",
        help="keep the wall-clock safety net out of reach: quality of the work budget alone",
    )
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
    safety_net_ms: int | None = None,
) -> BenchRow:
    """Plan each request once with ``solver``, timing the whole ``plan()`` call."""
    latencies, cpu, gaps, hits, times, changes = [], [], [], 0, [], []
    for request in requests:
        if deadline_ms is not None:
            request = request.model_copy(update={"deadline_ms": deadline_ms})
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            result = plan(request, safety_net_ms, use_cpsat=SOLVERS[solver])
        except Exception as exc:
            exc.add_note(f"{gpus} GPUs, step {request.step}, mode {request.mode}, {solver}")
            raise
        latencies.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.process_time() - c0) * 1e3)
        if result.metrics.gap is not None:
            gaps.append(result.metrics.gap)
        hits += result.metrics.stopped_by == "deadline"
        times.append(result.metrics.step_time_ms)
        changes.append(result.metrics.step_time_ms / result.metrics.baseline_step_time_ms - 1)
        done()
    p50, p95, p99 = (float(np.percentile(latencies, q)) for q in PERCENTILES)
    return BenchRow(
        gpus=gpus,
        solver=solver,
        deadline_ms=deadline_ms,
        samples=float(np.mean([len(r.lengths) for r in requests])),
        repeats=len(requests),
        p50_ms=p50,
        p95_ms=p95,
        p99_ms=p99,
        p99_cpu_ms=float(np.percentile(cpu, 99)),
        median_gap=float(np.median(gaps)) if gaps else None,
        deadline_hits=hits,
        change_pct=float(np.mean(changes)) * 100,
        step_times_ms=tuple(times),
    )


def compare_to_longest(rows: list[BenchRow]) -> list[BenchRow]:
    """Fill ``vs_longest_pct``: each row's step times against the row of the same size and
    solver at the longest deadline (same requests, same order)."""
    longest: dict[tuple[int, str], BenchRow] = {}
    for r in rows:
        key = (r.gpus, r.solver)
        if key not in longest or (r.deadline_ms or 0) > (longest[key].deadline_ms or 0):
            longest[key] = r
    out = []
    for r in rows:
        ref = longest[r.gpus, r.solver].step_times_ms
        ratios = [t / t0 - 1 for t, t0 in zip(r.step_times_ms, ref, strict=True)]
        out.append(replace(r, vs_longest_pct=float(np.mean(ratios)) * 100))
    return out


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
    deadlines: list[int | None] = list(args.deadlines or [args.deadline_ms])
    safety_net = WORK_ONLY_SAFETY_NET_MS if args.work_only else None
    plan(batches[0][0])  # warm-up: imports, solver start-up
    total = sum(len(b) for b in batches) * len(solvers) * len(deadlines)
    with tqdm(total=total, file=sys.stderr, unit="plan", disable=args.no_progress) as bar:
        rows = [
            bench_size(batch, size.gpus, solver, deadline, bar.update, safety_net)
            for size, batch in zip(args.sizes, batches, strict=True)
            for solver in solvers
            for deadline in deadlines
        ]
    compared = args.deadlines is not None
    if compared:
        rows = compare_to_longest(rows)
    if args.json:
        out = [{k: v for k, v in asdict(r).items() if k != "step_times_ms"} for r in rows]
        print(json.dumps({"mode": args.mode, "rows": out}, indent=1))
    else:
        print(f"mode {args.mode}, {args.repeats} steps per size, wall-clock ms per plan()\n")
        print(render(rows, compared))
    return 0


def render(rows: list[BenchRow], compared: bool = False) -> str:
    header = ["GPUs", "solver", "samples", "p50 ms", "p95 ms", "p99 ms", "p99 CPU ms"]
    header.append("median gap")
    header += ["vs baseline", "deadline hits"]
    if compared:
        header[2:2] = ["deadline ms"]
        header.append("vs longest deadline")
    body = []
    for r in rows:
        line = [
            str(r.gpus),
            r.solver,
            f"{r.samples:.0f}",
            f"{r.p50_ms:.1f}",
            f"{r.p95_ms:.1f}",
            f"{r.p99_ms:.1f}",
            f"{r.p99_cpu_ms:.1f}",
            "-" if r.median_gap is None else f"{r.median_gap * 100:.2f}%",
            f"{r.change_pct:+.2f}%",
            f"{r.deadline_hits}/{r.repeats}",
        ]
        if compared:
            line[2:2] = [str(r.deadline_ms)]
            line.append("-" if r.vs_longest_pct is None else f"{r.vs_longest_pct:+.2f}%")
        body.append(line)
    return format_table(header, body, left=2)
