"""Fuzz ``plan()`` over random clusters, loaders and length distributions, every mode.

Each request is planned in every mode with the wall clock out of reach (the deterministic work
budget alone decides), and checked: the plan is valid (``validate_plan``), no bound is above
its plan, and the mode order holds (`repack` <= `baseline`, `repack+parent` <= `repack`,
`repack+sizing` <= `repack+parent` and `sizing`, `sizing` <= `baseline`). Clusters of 1-32
GPUs per node and 1-16 nodes (up to 256 GPUs), 8-64 K tokens per rank; lengths from lognormal
bodies with Pareto tails; half packed by a loader to 90-99.9% (loader sizes 1-32), the rest
unpacked at 20-95% fill (such a step can be refused: no uniform upstream parent size holds
it; counted, not a finding). Prints the CPU per plan per mode (percentiles, plans over 1 s) and
writes each request that broke a check to ``--out`` (``<check>-<seed>-<k>.json``), ready for
a test. Too slow for CI: ~150 requests take ~10 minutes on one core.

    PYTHONPATH=. .venv/bin/python bench/fuzz_plan.py --seed 303 --requests 150 --out /tmp/fuzz
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

from solver.errors import InfeasibleRequestError
from solver.planner import plan
from solver.schema import ClusterSpec, ModelSpec, PlanRequest, allowed_parent_sizes
from solver.trace import LengthDistribution, PackedLoader, Scenario, TraceSpec
from solver.validate import validate_plan

MODES = ("baseline", "sizing", "repack", "repack+parent", "repack+sizing")
ORDER = (
    ("repack", "baseline"),
    ("repack+parent", "repack"),
    ("repack+sizing", "repack+parent"),
    ("repack+sizing", "sizing"),
    ("sizing", "baseline"),
)
TOLERANCE = 1e-9
WORK_ONLY_MS = 600_000
"""The wall-clock safety net out of reach: plans depend on the request alone."""


def random_request(rnd: random.Random, max_samples: int) -> PlanRequest | None:
    """One random step, or None when the draw makes no request (no parent size fits, or more
    than ``max_samples`` samples)."""
    gpn = rnd.choice([1, 2, 4, 8, 8, 16, 32])
    nodes = rnd.choice([1, 2, 3, 4, 6, 8, 12, 16])
    while gpn * nodes > 256:
        nodes //= 2
    per_rank = rnd.choice([8192, 16384, 32768, 65536])
    cluster = ClusterSpec(nodes=nodes, gpus_per_node=gpn, max_tokens_per_rank=per_rank)
    allowed = allowed_parent_sizes(cluster, ModelSpec())
    if not allowed:
        return None
    cap = max(allowed) * per_rank
    lengths = LengthDistribution(
        body_median=rnd.choice([300, 1000, 1800, 4000, 8000]),
        body_sigma=rnd.choice([0.5, 1.0, 1.5]),
        tail_prob=rnd.choice([0, 0.001, 0.01, 0.05]),
        tail_min=min(cap, rnd.choice([8192, 32768, 65536])),
        max_length=cap,
        min_length=min(64, cap),
    )
    seed, first = rnd.randrange(10**6), rnd.randrange(1000)
    if rnd.random() < 0.6:
        loader = PackedLoader(
            min_fill=rnd.choice([0.9, 0.97, 0.99, 0.999]),
            min_parent_size=rnd.choice([1, 2, 4, 8, 16, 32]),
            long_sample_share=rnd.choice([0.25, 0.5, 1.0]),
        )
        trace = TraceSpec(seed=seed, steps=1, first_step=first, lengths=lengths, loader=loader)
    else:
        fill = rnd.choice([0.2, 0.5, 0.8, 0.95])
        trace = TraceSpec(seed=seed, steps=1, first_step=first, lengths=lengths, fill=fill)
    request = next(iter(Scenario(job_id="fuzz", cluster=cluster, trace=trace).requests()))
    return request if len(request.lengths) <= max_samples else None


def check(request: PlanRequest) -> tuple[dict[str, float], dict[str, float], list[str]]:
    """Step time and CPU ms per mode, and the names of the checks the request broke."""
    steps: dict[str, float] = {}
    cpu: dict[str, float] = {}
    broken: list[str] = []
    for mode in MODES:
        req = request.model_copy(update={"mode": mode})
        c0 = time.process_time()
        got = plan(req, WORK_ONLY_MS)
        cpu[mode] = (time.process_time() - c0) * 1e3
        steps[mode] = got.metrics.step_time_ms
        if validate_plan(req, got):
            broken.append(f"invalid-{mode}")
        bound = got.metrics.lower_bound_ms
        if bound is not None and bound > got.metrics.step_time_ms * (1 + TOLERANCE):
            broken.append(f"bound-{mode}")
    for faster, slower in ORDER:
        if steps[faster] > steps[slower] * (1 + TOLERANCE):
            broken.append(f"order-{faster}-vs-{slower}")
    return steps, cpu, broken


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--requests", type=int, default=150)
    parser.add_argument("--max-samples", type=int, default=4000)
    parser.add_argument("--out", type=Path, default=Path("fuzz-findings"))
    args = parser.parse_args(argv)
    rnd = random.Random(args.seed)
    cpu: dict[str, list[float]] = {m: [] for m in MODES}
    findings = refused = 0
    for k in range(args.requests):
        request = random_request(rnd, args.max_samples)
        if request is None:
            continue
        try:
            _, times, broken = check(request)
        except InfeasibleRequestError:  # the documented refusal (a 422): no membership fits
            refused += 1
            continue
        except Exception as exc:  # a traceback is a finding
            times, broken = {}, [f"error-{type(exc).__name__}"]
        for mode, ms in times.items():
            cpu[mode].append(ms)
        for name in broken:
            findings += 1
            args.out.mkdir(parents=True, exist_ok=True)
            path = args.out / f"{name}-{args.seed}-{k}.json"
            path.write_text(json.dumps(request.model_dump(mode="json")))
            print(f"{name}: request {k} -> {path}", file=sys.stderr)
    planned = len(cpu["baseline"])
    print(
        f"seed {args.seed}: {planned} requests planned in every mode, {refused} refused as "
        f"infeasible, {findings} findings\n"
    )
    print("| mode | p50 CPU ms | p90 | p99 | max | plans over 1 s |")
    print("|------|-----------:|----:|----:|----:|---------------:|")
    for mode in MODES:
        values = np.array(cpu[mode]) if cpu[mode] else np.zeros(1)
        p50, p90, p99 = (float(np.percentile(values, q)) for q in (50, 90, 99))
        over = int((values > 1000).sum())
        print(f"| {mode} | {p50:.0f} | {p90:.0f} | {p99:.0f} | {values.max():.0f} | {over} |")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
