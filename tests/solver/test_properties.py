"""Property tests: plans for random requests always validate and keep the modes ordered."""

from __future__ import annotations

import os
import random
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from solver.planner import plan
from solver.schema import ClusterSpec, ModelSpec, PlanRequest, allowed_parent_sizes
from solver.validate import validate_plan

MODES = ("baseline", "sizing", "repack", "repack+parent", "repack+sizing")
MAX_TOKENS = 32768
WIDEST = 32  # the default model's 32 heads cap parent sizes at 32


def buddy_tiling(rng: random.Random, world: int) -> list[int]:
    """Aligned power-of-two parent sizes in rank order, by splitting blocks in halves."""
    top = min(WIDEST, world & -world)  # the largest power of two dividing the world
    blocks = [top] * (world // top)
    for _ in range(rng.randint(0, 6)):
        i = rng.randrange(len(blocks))
        if blocks[i] > 1:
            blocks[i : i + 1] = [blocks[i] // 2] * 2
    return blocks


def first_fit(lengths: list[int], sizes: list[int]) -> list[int] | None:
    """An upstream membership: samples in arrival order into the first parent with room."""
    room = [s * MAX_TOKENS for s in sizes]
    parent_of = []
    for n in lengths:
        j = next((j for j, r in enumerate(room) if r >= n), None)
        if j is None:
            return None
        room[j] -= n
        parent_of.append(j)
    return parent_of


@st.composite
def requests(draw: st.DrawFn) -> PlanRequest:
    nodes = draw(st.integers(1, 64))
    gpus = draw(st.sampled_from([2, 4, 8]))
    world = nodes * gpus
    n = draw(st.integers(1, 3000))
    seed = draw(st.integers(0, 2**32 - 1))
    fill = draw(st.floats(0.05, 0.45))
    given_sizes = draw(st.booleans())
    rng = random.Random(seed)
    sizes = buddy_tiling(rng, world) if given_sizes else None
    cluster = ClusterSpec(nodes=nodes, gpus_per_node=gpus)
    widest = max(sizes) if sizes else max(allowed_parent_sizes(cluster, ModelSpec()))
    longest = max(1, int(0.9 * widest * MAX_TOKENS))
    budget = int(fill * world * MAX_TOKENS)
    raw = [rng.lognormvariate(0, 1.5) for _ in range(n)]
    scale = budget / sum(raw)
    lengths = [max(1, min(longest, int(x * scale))) for x in raw]
    data: dict[str, Any] = {
        "cluster": {"nodes": nodes, "gpus_per_node": gpus},
        "lengths": lengths,
        "deadline_ms": 600_000,
    }
    if sizes is not None:
        data["parent_sizes"] = sizes
        if draw(st.booleans()):
            data["parent_of"] = first_fit(lengths, sizes)
    return PlanRequest.model_validate(data)


@settings(
    max_examples=int(os.environ.get("REPACK_PROPERTY_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
)
@given(requests())
def test_plans_validate_and_modes_are_ordered(req: PlanRequest) -> None:
    t = {}
    for mode in MODES:
        p = plan(req.model_copy(update={"mode": mode}))
        assert validate_plan(req, p) == [], mode
        assert p.metrics.lower_bound_ms is not None and p.metrics.gap is not None
        assert 0.0 <= p.metrics.gap <= 1.0
        t[mode] = p.metrics.step_time_ms + 1e-6  # tolerance for the 6-decimal rounding
    assert t["baseline"] >= t["repack"] - 2e-6 and t["repack"] >= t["repack+parent"] - 2e-6
    assert t["repack+parent"] >= t["repack+sizing"] - 2e-6
    assert t["baseline"] >= t["sizing"] - 2e-6 and t["sizing"] >= t["repack+sizing"] - 2e-6
