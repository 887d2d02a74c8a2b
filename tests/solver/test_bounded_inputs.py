"""Every physical parameter has a plausible range, and every request inside the ranges plans.

The reported defects first (each used to end in a traceback), then a property test over the
whole accepted range: no overflow, no division by zero, no exception, and a valid plan.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from solver.errors import InfeasibleRequestError
from solver.packing_search import search_packing
from solver.planner import plan
from solver.problem import Problem
from solver.profiles import (
    BANDWIDTH_GBPS_RANGE,
    EFFICIENCY_RANGE,
    LATENCY_US_RANGE,
    MAX_TOKENS_PER_RANK_LIMIT,
    PEAK_TFLOPS_RANGE,
    Profile,
)
from solver.schema import (
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_HIDDEN,
    MAX_LAYERS,
    MAX_MOE_ACTIVE_PARAMS,
    MAX_WINDOW,
    PlanRequest,
    allowed_parent_sizes,
)
from solver.validate import validate_plan
from tests.solver.test_schema import assert_error

MODES = ("baseline", "sizing", "repack", "repack+parent", "repack+sizing")
PROPERTY_EXAMPLES = 25
"""Modest, so that `make test` stays quick; each example is one real plan() at the extremes."""


@pytest.mark.parametrize(
    ("cluster", "field", "fragment"),
    [
        ({"peak_tflops": 1e308}, "cluster.peak_tflops", "less than or equal to 1000000"),
        ({"peak_tflops": 5e-5}, "cluster.peak_tflops", "greater than or equal to 0.0001"),
        ({"compute_efficiency": 1e-300}, "cluster.compute_efficiency", "greater than 0.01"),
        ({"compute_efficiency": 0.01}, "cluster.compute_efficiency", "greater than 0.01"),
        ({"inter_node_gbps": 1e-308}, "cluster.inter_node_gbps", "greater than or equal to 0.01"),
        ({"intra_node_gbps": 1e300}, "cluster.intra_node_gbps", "less than or equal to 100000"),
        (
            {"max_tokens_per_rank": (1 << 24) + 1},
            "cluster.max_tokens_per_rank",
            "less than or equal to 16777216",
        ),
    ],
)
def test_reported_cluster_values_are_rejected_at_their_field(
    cluster: dict[str, Any], field: str, fragment: str
) -> None:
    assert_error({"cluster": cluster, "lengths": [1]}, field, fragment)


@pytest.mark.parametrize(
    ("model", "field"),
    [
        ({"hidden": 10**400}, "model.hidden"),
        ({"heads": 1 << 13, "kv_heads": 1}, "model.heads"),
        ({"head_dim": 1 << 13}, "model.head_dim"),
        ({"sparse_window": (1 << 24) + 1}, "model.sparse_window"),
        ({"moe_active_params": 1e300}, "model.moe_active_params"),
    ],
)
def test_model_sizes_are_bounded(model: dict[str, Any], field: str) -> None:
    assert_error({"model": model, "lengths": [1]}, field, "less than or equal to")


@pytest.mark.parametrize(
    ("profile", "field"),
    [
        ({"efficiency_full_attention": 1e-300}, "profile.efficiency_full_attention"),
        ({"efficiency_linear": 1.5}, "profile.efficiency_linear"),
        ({"peak_tflops": 1e308}, "profile.peak_tflops"),
        ({"inter_node_gbps": 1e-308}, "profile.inter_node_gbps"),
        ({"collective_latency_us": -1}, "profile.collective_latency_us"),
        ({"collective_latency_us": float("inf")}, "profile.collective_latency_us"),
    ],
)
def test_profile_values_are_bounded(profile: dict[str, Any], field: str) -> None:
    assert_error({"profile": profile, "lengths": [1]}, field, "")


def _spread(lo: float, hi: float, *, open_low: bool = False) -> st.SearchStrategy[float]:
    """Both ends of a range (the lower one only when accepted) and values log-uniform inside."""
    ends = [hi] if open_low else [lo, hi]
    low = math.log10(lo if lo > 0 else 1e-3)
    inside = st.floats(low, math.log10(hi)).map(lambda e: min(hi, max(lo, 10.0**e)))
    if open_low:
        inside = inside.filter(lambda x: x > lo)
    return st.one_of(st.sampled_from(ends), inside)


def _power_of_two(limit: int) -> st.SearchStrategy[int]:
    return st.integers(0, limit.bit_length() - 1).map(lambda e: 1 << e)


@st.composite
def extreme_requests(draw: st.DrawFn) -> PlanRequest:
    """Any accepted request on a small cluster, with physical constants anywhere in range."""
    eff = _spread(*EFFICIENCY_RANGE, open_low=True)
    overhead = st.sampled_from([0.0, 0.0, 50.0, LATENCY_US_RANGE[1]])
    profile = Profile(
        peak_tflops=draw(_spread(*PEAK_TFLOPS_RANGE)),
        efficiency_full_attention=draw(eff),
        efficiency_sparse_attention=draw(eff),
        efficiency_linear=draw(eff),
        intra_node_gbps=draw(_spread(*BANDWIDTH_GBPS_RANGE)),
        inter_node_gbps=draw(_spread(*BANDWIDTH_GBPS_RANGE)),
        collective_latency_us=draw(st.sampled_from([0.0, LATENCY_US_RANGE[1], 1.0])),
        # per-sample overheads make short samples dearer per token than long ones, which the
        # memory bounds' fillers assumed away (test_sample_overhead_bounds.py)
        collective_latency_us_per_peer=draw(overhead),
        layer_overhead_us=draw(overhead),
        sample_overhead_us_full=draw(overhead),
        sample_overhead_us_sparse=draw(overhead),
    )
    heads = draw(_power_of_two(MAX_HEADS))
    model = {
        "layers": draw(st.sampled_from([1, 4, 48, MAX_LAYERS])),
        "pattern": draw(st.sampled_from(["F", "S", "FSSS", "SF"])),
        "hidden": draw(st.sampled_from([1, 4096, MAX_HIDDEN])),
        "heads": heads,
        "kv_heads": draw(st.sampled_from([1, heads])),
        "head_dim": draw(st.sampled_from([1, 128, MAX_HEAD_DIM])),
        "sparse_window": draw(st.sampled_from([1, 4096, MAX_WINDOW])),
        "moe_active_params": draw(st.sampled_from([0.0, 151e6, MAX_MOE_ACTIVE_PARAMS])),
        "dtype_bytes": draw(st.sampled_from([1, 2, 8])),
    }
    cluster = {
        "nodes": draw(st.integers(1, 2)),
        "gpus_per_node": draw(st.sampled_from([1, 2, 8, 64])),
        "max_tokens_per_rank": draw(
            st.one_of(
                st.sampled_from([1, MAX_TOKENS_PER_RANK_LIMIT]),
                _spread(1, MAX_TOKENS_PER_RANK_LIMIT).map(int),
            )
        ),
    }
    request = PlanRequest.model_validate({"cluster": cluster, "model": model, "lengths": [1]})
    widest = max(allowed_parent_sizes(request.cluster, request.model))
    per_rank = request.cluster.max_tokens_per_rank
    room = request.cluster.world_size * per_rank
    n = draw(st.integers(1, min(12, room)))
    shares = draw(st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n))
    first = room / n
    if draw(st.booleans()):
        first = min(widest * per_rank, room - (n - 1))  # the longest sample allowed
    rest = (room - first) / max(n - 1, 1)
    lengths = [
        max(1, min(widest * per_rank, int(f * (first if i == 0 else rest))))
        for i, f in enumerate(shares)
    ]
    if first != room / n:
        lengths[0] = int(first)
    data: dict[str, Any] = {
        "model": model,
        "lengths": lengths,
        "mode": draw(st.sampled_from(MODES)),
    }
    if draw(st.booleans()):
        data["cluster"], data["profile"] = cluster, profile.model_dump()
    else:  # the same constants as the cluster's own fields (one efficiency for every part)
        data["cluster"] = {
            **cluster,
            "peak_tflops": profile.peak_tflops,
            "compute_efficiency": profile.efficiency_linear,
            "intra_node_gbps": profile.intra_node_gbps,
            "inter_node_gbps": profile.inter_node_gbps,
        }
    return PlanRequest.model_validate(data)


@settings(
    max_examples=PROPERTY_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(extreme_requests())
def test_every_accepted_request_plans(request: PlanRequest) -> None:
    """No overflow, division by zero or exception anywhere in plan(); the plan is valid and
    its metrics are finite. The schema checks each sample against the widest parent and the
    total against the cluster, not the bin packing: a request whose samples fit no parents
    at all is refused with ``InfeasibleRequestError`` on ``lengths``, and only then."""
    try:
        result = plan(request)
    except InfeasibleRequestError as err:
        assert err.field == "lengths"
        assert not fits_widest_parents(request), f"refused a request that fits: {err}"
        return
    m = result.metrics
    for value in (m.step_time_ms, m.baseline_step_time_ms, m.speedup, m.mfu, m.baseline_mfu):
        assert math.isfinite(value) and value > 0, m
    assert m.lower_bound_ms is not None and 0 <= m.lower_bound_ms <= m.step_time_ms
    assert m.step_time_ms <= m.baseline_step_time_ms
    assert validate_plan(request, result) == []


def fits_widest_parents(request: PlanRequest) -> bool:
    """Whether the samples fit the widest uniform parents (any aligned tiling's parents merge
    into those, so no layout holds samples these cannot), by CP-SAT, else not proven."""
    problem = Problem.from_request(request)
    widest = max(allowed_parent_sizes(request.cluster, request.model))
    capacities = [problem.capacity(widest)] * (request.cluster.world_size // widest)
    return not search_packing(problem, range(problem.num_samples), capacities).proven_infeasible


def test_samples_that_fit_no_parents_are_refused_on_lengths() -> None:
    """Found by the property test: 5 samples of 12 tokens on 64 ranks of 1 token, parents of
    at most 16 ranks (16 heads): each parent holds one, four parents for five samples."""
    request = PlanRequest.model_validate(
        {
            "cluster": {"nodes": 1, "gpus_per_node": 64, "max_tokens_per_rank": 1},
            "model": {"heads": 16, "kv_heads": 1},
            "lengths": [12] * 5,
            "mode": "baseline",
        }
    )
    assert not fits_widest_parents(request)
    with pytest.raises(InfeasibleRequestError) as err:
        plan(request)
    assert err.value.field == "lengths"
    fitting = request.model_copy(update={"lengths": [12] * 4})
    assert fits_widest_parents(fitting) and plan(fitting).metrics.step_time_ms > 0


def test_idle_ranks_of_wide_nodes_become_allowed_children() -> None:
    """Found by the property test: on a node of 64 GPUs the idle ranks of a repacked parent
    were handed out as one empty child of 16 ranks, which no layout rule allows."""
    request = PlanRequest.model_validate(
        {
            "cluster": {"nodes": 1, "gpus_per_node": 64, "max_tokens_per_rank": 1},
            "model": {"layers": 1, "pattern": "S", "hidden": 1, "kv_heads": 1, "head_dim": 1},
            "lengths": [1, 32],
        }
    )
    for mode in MODES:
        result = plan(request.model_copy(update={"mode": mode}))
        assert validate_plan(request, result) == [], mode
