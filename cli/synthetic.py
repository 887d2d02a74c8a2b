"""Synthetic steps for the demo and the service benchmark: long-tailed lengths, made in code."""

from __future__ import annotations

import random
from typing import Any

from solver.profiles import CLUSTER_PROFILES

PARETO_ALPHA = 1.1
"""Tail index of sample lengths: most samples short, a few very long (typical of web text)."""
SCALE_TOKENS = 1500
MIN_TOKENS = 64
MAX_TOKENS = 262_144
FILL = 0.5
"""Share of the cluster's token capacity one step fills."""


def long_tailed_lengths(rng: random.Random, world_size: int, max_tokens_per_rank: int) -> list[int]:
    """Sample lengths until ``FILL`` of the cluster's token capacity is used."""
    budget = FILL * world_size * max_tokens_per_rank
    lengths: list[int] = []
    total = 0
    while True:
        n = int(min(MAX_TOKENS, max(MIN_TOKENS, rng.paretovariate(PARETO_ALPHA) * SCALE_TOKENS)))
        if total + n > budget:
            return lengths or [n]
        lengths.append(n)
        total += n


def synthetic_requests(
    job_id: str, steps: int, nodes: int = 8, seed: int = 0, first_step: int = 0
) -> list[dict[str, Any]]:
    """``steps`` PlanRequest bodies for a job on ``nodes`` x GPUs of the default cluster profile."""
    rng = random.Random(seed)
    profile = CLUSTER_PROFILES["default"]
    gpus, per_rank = profile["gpus_per_node"], profile["max_tokens_per_rank"]
    return [
        {
            "job_id": job_id,
            "step": first_step + i,
            "cluster": {"nodes": nodes},
            "lengths": long_tailed_lengths(rng, nodes * gpus, per_rank),
        }
        for i in range(steps)
    ]
