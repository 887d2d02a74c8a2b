"""Hunt for requests where a mode's plan is predicted slower than the reference heuristic.

Wider than the property test in ``tests/solver/test_reference.py`` (1-8 nodes of 2/4/8 GPUs,
8,192-40,000 tokens per rank, 16-64 heads, other layer patterns and windows, uniform and mixed
loader parent sizes, half the requests packed to a loader's fill) and too slow for CI. Each
finding is written as a request file for a test: ``fail-<seed>.json`` in ``--out``.

    PYTHONPATH=. .venv/bin/python bench/hunt_reference.py --seeds 700000:700300 --out /tmp/hunt
    PYTHONPATH=. .venv/bin/python bench/hunt_reference.py --family four-parents-8x4 --seeds 0:80
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from solver.planner import plan
from solver.schema import ClusterSpec, ModelSpec, PlanRequest, allowed_parent_sizes
from tests.solver.test_reference import MODES, TOLERANCE, reference_for

NODES = (1, 2, 2, 4, 4, 8)
GPUS = (2, 4, 8)
TOKENS_PER_RANK = (8192, 16384, 32768, 40000)
HEADS = (16, 32, 64)
PATTERNS = ("FSSS", "FS", "FSSSSSS", "FFS")
WINDOWS = (1024, 4096, 8192)
LONG_SHARES = (0.0, 0.3, 0.45, 0.6, 0.8)
FILLS = (0.99, 0.995, 0.6, 0.4)


def _packed(
    rng: random.Random, sizes: list[int], tokens: int, long_share: float, fill: float
) -> tuple[list[int], list[int]]:
    """A loader's step: each parent filled to ``fill`` of its memory in arrival order, parent 0
    opening with one sample of ``long_share`` of its memory."""
    lengths: list[int] = []
    parent_of: list[int] = []
    for j, size in enumerate(sizes):
        cap = size * tokens
        left = int(fill * cap)
        if j == 0 and long_share > 0:
            n = int(long_share * cap)
            lengths.append(n)
            parent_of.append(j)
            left -= n
        while left > 0.01 * cap:
            n = max(16, min(left, int(rng.lognormvariate(7.5, 1.0) * tokens / 32768)))
            lengths.append(n)
            parent_of.append(j)
            left -= n
    return lengths, parent_of


def request_for(seed: int) -> PlanRequest:
    rng = random.Random(seed)
    nodes, gpus = rng.choice(NODES), rng.choice(GPUS)
    tokens = rng.choice(TOKENS_PER_RANK)
    heads = rng.choice(HEADS)
    kv = rng.choice([k for k in (4, 8, 16, heads) if k <= heads])
    model = {
        "heads": heads,
        "kv_heads": kv,
        "pattern": rng.choice(PATTERNS),
        "sparse_window": rng.choice(WINDOWS),
    }
    cluster = {"nodes": nodes, "gpus_per_node": gpus, "max_tokens_per_rank": tokens}
    data: dict[str, Any] = {"cluster": cluster, "model": model}
    world = nodes * gpus
    allowed = [
        s for s in allowed_parent_sizes(ClusterSpec(**cluster), ModelSpec(**model)) if s >= 2
    ]
    if rng.random() < 0.5 and allowed:
        if rng.random() < 0.5:
            size = rng.choice(allowed)
            sizes = [size] * (world // size)
        else:
            sizes, start = [], 0
            while start < world:  # each parent starts at a multiple of its size
                fits = [s for s in allowed if start + s <= world and start % s == 0] or [1]
                sizes.append(rng.choice(fits))
                start += sizes[-1]
        data["lengths"], data["parent_of"] = _packed(
            rng, sizes, tokens, rng.choice(LONG_SHARES), rng.choice(FILLS)
        )
        data["parent_sizes"] = sizes
    else:
        fill = rng.uniform(0.05, 0.6)
        raw = [rng.lognormvariate(0, 1.5) for _ in range(rng.randint(1, 90))]
        scale = fill * world * tokens / sum(raw)
        longest = int(0.9 * max(allowed or [1]) * tokens)
        data["lengths"] = [max(1, min(longest, int(x * scale))) for x in raw]
    return PlanRequest.model_validate(data)


def four_parents_8x4(seed: int) -> PlanRequest:
    """The family of the 2026-12-03 evening hunt: four 8-rank parents on 8 nodes x 4 GPUs
    packed to 90-99% of memory, pattern FFS, 16 heads (2,000-3,000 sample x node pairs)."""
    rng = random.Random(seed)
    sizes = [8] * 4
    fill = rng.choice([0.9, 0.95, 0.99])
    share = rng.choice([0.0, 0.3, 0.45, 0.6, 0.8])
    lengths, parent_of = _packed(rng, sizes, 32768, share, fill)
    return PlanRequest.model_validate(
        {
            "cluster": {"nodes": 8, "gpus_per_node": 4, "max_tokens_per_rank": 32768},
            "model": {"heads": 16, "kv_heads": 16, "pattern": "FFS", "sparse_window": 8192},
            "lengths": lengths,
            "parent_sizes": sizes,
            "parent_of": parent_of,
        }
    )


def wide_packed(nodes: int, gpus: int, sizes: list[int]) -> Callable[[int], PlanRequest]:
    """A family of packed steps on ``nodes x gpus`` GPUs with the loader's ``sizes`` (parents
    of 8-32 ranks at 90-99% of memory: the 2026-12-03 night's last slice, where the hunted
    steps of ``OPEN`` in the tests came from), other patterns, heads and windows per seed."""

    def make(seed: int) -> PlanRequest:
        rng = random.Random(seed)
        heads = rng.choice(HEADS)
        kv = rng.choice([k for k in (8, 16, heads) if k <= heads])
        fill = rng.choice([0.9, 0.95, 0.99])
        share = rng.choice([0.0, 0.3, 0.45, 0.6, 0.8])
        lengths, parent_of = _packed(rng, sizes, 32768, share, fill)
        model = {
            "heads": heads,
            "kv_heads": kv,
            "pattern": rng.choice(PATTERNS),
            "sparse_window": rng.choice(WINDOWS),
        }
        return PlanRequest.model_validate(
            {
                "cluster": {"nodes": nodes, "gpus_per_node": gpus, "max_tokens_per_rank": 32768},
                "model": model,
                "lengths": lengths,
                "parent_sizes": sizes,
                "parent_of": parent_of,
            }
        )

    return make


FAMILIES: dict[str, Callable[[int], PlanRequest]] = {
    "mixed": request_for,
    "four-parents-8x4": four_parents_8x4,
    "two-parents-16-8x4": wide_packed(8, 4, [16, 16]),
    "four-parents-8-16x2": wide_packed(16, 2, [8, 8, 8, 8]),
    "two-parents-16-4x8": wide_packed(4, 8, [16, 16]),
}


def hunt(req: PlanRequest, seed: int, out: Path) -> list[str]:
    """The modes of ``req`` behind the reference by more than the tolerance."""
    base = plan(req.model_copy(update={"mode": "baseline"}))
    behind = []
    for mode in MODES:
        ref = reference_for(req, mode, base)
        if ref is None:
            continue
        got = plan(req.model_copy(update={"mode": mode}), deadline_ms=60_000)
        ratio = got.metrics.step_time_ms / 1e3 / ref
        if ratio > 1 + TOLERANCE:
            behind.append(f"{mode} {100 * (ratio - 1):+.3f}%")
    if behind:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"fail-{seed}.json").write_text(json.dumps(req.model_dump(mode="json")))
    return behind


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0:50", help="first:last (exclusive)")
    parser.add_argument("--out", type=Path, default=Path("hunt-findings"))
    parser.add_argument("--family", choices=sorted(FAMILIES), default="mixed")
    args = parser.parse_args(argv)
    first, last = (int(x) for x in args.seeds.split(":"))
    found = 0
    for seed in range(first, last):
        req = FAMILIES[args.family](seed)
        behind = hunt(req, seed, args.out)
        if behind:
            found += 1
            print(
                f"seed {seed}: {req.cluster.nodes}x{req.cluster.gpus_per_node} GPUs, "
                f"{len(req.lengths)} samples, parents {req.parent_sizes}: {', '.join(behind)}",
                flush=True,
            )
    print(f"{last - first} requests, {found} behind the reference")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
