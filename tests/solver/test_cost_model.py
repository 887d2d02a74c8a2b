"""The cost model against numbers worked out by hand (docs/design.md section 5)."""

from __future__ import annotations

import json
from itertools import islice
from typing import Any

import numpy as np
import pytest

from solver.child_packer import ChildPacker
from solver.cost_model import (
    CostModel,
    SampleCosts,
    child_layer_seconds,
    mfu,
    parent_seconds,
    unrepacked_parent_seconds,
)
from solver.layout import Child, Layout, Parent, evaluate
from solver.membership import make_cost_fn
from solver.plan_builder import canonical_json
from solver.planner import plan
from solver.problem import Problem
from solver.profiles import DEFAULT_PROFILE, Profile
from solver.schema import ClusterSpec, ModelSpec, PlanRequest
from solver.step_terms import step_terms
from solver.trace import load_trace
from solver.validate import step_seconds, validate_plan
from tests.helpers import example_plan, example_request
from tests.solver.default_profile_golden import GOLDEN, scenario_path
from tests.solver.default_profile_golden import SCENARIOS as GOLDEN_SCENARIOS

# A toy machine where every term is easy to do on paper: 2 nodes x 2 GPUs, 1 and 0.5 GB/s,
# 1 TFLOP/s at 50% (5e11 FLOP/s achieved); 4 layers "FS" (2 full, 2 sparse), 2 heads,
# 1 KV head, head_dim 4, hidden 8, window 10, 100 active MoE parameters, 2-byte dtype.
TOY_CLUSTER = ClusterSpec(
    nodes=2,
    gpus_per_node=2,
    intra_node_gbps=1.0,
    inter_node_gbps=0.5,
    peak_tflops=1.0,
    compute_efficiency=0.5,
    max_tokens_per_rank=1000,
)
TOY_MODEL = ModelSpec(
    layers=4,
    pattern="FS",
    hidden=8,
    heads=2,
    kv_heads=1,
    head_dim=4,
    sparse_window=10,
    moe_active_params=100,
    dtype_bytes=2,
)
TOY_PROFILE = Profile(
    peak_tflops=1.0,
    efficiency_full_attention=0.5,
    efficiency_sparse_attention=0.5,
    efficiency_linear=0.5,
    intra_node_gbps=1.0,
    inter_node_gbps=0.5,
)


@pytest.fixture
def toy() -> CostModel:
    return CostModel.from_specs(TOY_CLUSTER, TOY_MODEL)


def test_flops_terms(toy: CostModel) -> None:
    length = np.array([20.0, 5.0])
    # full: 6 * L^2 * heads * head_dim = 6 * 400 * 8 = 19200; 6 * 25 * 8 = 1200
    assert toy.full_attention_flops(length).tolist() == [19200.0, 1200.0]
    # sparse, L >= w: 12 * 8 * (10 * 20 - 100 / 2) = 14400; L < w falls back to full: 1200
    assert toy.sparse_attention_flops(length).tolist() == [14400.0, 1200.0]
    # projections 8 * (2 + 2) * 4 + 2 * 4 * 8 = 192 params, + 100 MoE, x 6 = 1752 per token
    assert toy.linear_flops_per_token == 1752.0
    assert toy.linear_seconds_per_token == pytest.approx(1752 / 5e11)


def test_all_to_all_terms(toy: CostModel) -> None:
    # group of 4 over 2 nodes: (2*2 + 2*max(1, 4)) heads * 4 dims * 2 bytes * 2 passes = 192 B
    assert toy.a2a_bytes_per_token(4) == 192
    # half goes off-node at 0.5 GB/s: 96 / 0.5e9; a quarter stays on-node at 1 GB/s: 48 / 1e9
    assert toy.a2a_seconds_per_token(4) == pytest.approx(1.92e-7)
    # group of 2 on one node: (4 + 4) * 16 = 128 B, half to the peer at 1 GB/s
    assert toy.a2a_bytes_per_token(2) == 128
    assert toy.a2a_seconds_per_token(2) == pytest.approx(6.4e-8)
    assert toy.a2a_seconds_per_token(1) == 0.0


def test_parent_and_child_times(toy: CostModel) -> None:
    costs = SampleCosts.build(toy, [20, 5])
    full_s, sparse_s = float(costs.full_s.sum()), float(costs.sparse_s.sum())
    # unrepacked parent of 4: busiest rank owns ceil(25 / 4) = 7 tokens;
    # full layer: 20400 / 4 / 5e11 + 7 * (3.504e-9 + 1.92e-7) = 1.378728e-6 s
    # sparse layer: 15600 / 4 / 5e11 + 7 * (3.504e-9 + 1.92e-7) = 1.376328e-6 s
    expected = 2 * 1.378728e-6 + 2 * 1.376328e-6
    got = unrepacked_parent_seconds(toy, 4, full_s, sparse_s, 25)
    assert got == pytest.approx(expected, rel=1e-12)
    # child of 1 holding the short sample: 1200 / 5e11 + 5 * 3.504e-9, no all-to-all
    assert child_layer_seconds(toy, 1, 1200 / 5e11, 5) == pytest.approx(2.4e-9 + 1.752e-8)
    assert child_layer_seconds(toy, 2, 0.0, 0) == 0.0
    # repacked: the long sample in a child of 2 (node 0), the short one in a child of 1
    t = parent_seconds(toy, 4, full_s, [(2, 14400 / 5e11, 20), (1, 1200 / 5e11, 5)])
    full = 20400 / 4 / 5e11 + 10 * (3.504e-9 + 1.92e-7)
    sparse = 14400 / 2 / 5e11 + 10 * (3.504e-9 + 6.4e-8)
    assert t == pytest.approx(2 * full + 2 * sparse, rel=1e-12)


def test_mfu(toy: CostModel) -> None:
    costs = SampleCosts.build(toy, [20, 5])
    # 2 full layers x 20400 + 2 sparse x 15600 + 4 layers x 25 tokens x 1752 = 247200 FLOPs
    assert costs.model_flops == 247200.0
    assert mfu(toy, costs.model_flops, 1e-6) == pytest.approx(247200 / (1e-6 * 4 * 1e12))


def test_contract_example_metrics_are_reproduced() -> None:
    """The shared example's metrics come from this cost model with the default profile."""
    req, example = example_request(), example_plan()
    assert validate_plan(req, example) == []
    repacked = plan(req)
    assert repacked.metrics.baseline_step_time_ms == pytest.approx(3498.056, abs=1e-3)
    assert repacked.metrics.step_time_ms <= example.metrics.step_time_ms + 1e-3
    baseline = plan(req.model_copy(update={"mode": "baseline"}))
    assert baseline.metrics.step_time_ms == pytest.approx(3498.056, abs=1e-3)
    assert baseline.metrics.mfu == pytest.approx(example.metrics.baseline_mfu, abs=1e-4)


# --- profiles ----------------------------------------------------------------------------------


def _golden_layout(entry: dict[str, Any]) -> Layout:
    kids: dict[int, list[Child]] = {}
    for c in entry["children"]:
        start, end = c["ranks"]
        kids.setdefault(c["parent"], []).append(Child(start, end - start, tuple(c["samples"])))
    spans = entry["parents"]
    return tuple(Parent(a, b - a, tuple(kids[j])) for j, (a, b) in enumerate(spans))


def _golden_requests() -> dict[tuple[str, int], PlanRequest]:
    out = {}
    for name, steps in GOLDEN_SCENARIOS:
        for i, req in enumerate(islice(load_trace(scenario_path(name)), steps)):
            out[name, i] = req
    return out


def test_default_profile_reproduces_recorded_replays() -> None:
    """Layouts of scenario replays recorded before profiles existed score exactly as then, with
    no profile and with the default profile inline (the numbers in the README stand)."""
    requests = _golden_requests()
    entries = json.loads(GOLDEN.read_text())
    assert len(entries) == 30
    for entry in entries:
        base = requests[entry["scenario"], entry["step"]]
        layout = _golden_layout(entry)
        for req in (base, base.model_copy(update={"profile": DEFAULT_PROFILE})):
            cost = CostModel.from_request(req)
            costs = SampleCosts.build(cost, req.lengths)
            ev = evaluate(layout, cost, costs)
            got = {
                "step_time_ms": float(f"{ev.step_s * 1e3:.10g}"),
                "mfu": float(f"{mfu(cost, costs.model_flops, ev.step_s):.10g}"),
                "inter_node_bytes": round(ev.inter_node_bytes),
            }
            assert got == entry["metrics"], (entry["scenario"], entry["step"], entry["mode"])


def test_default_profile_plans_like_no_profile() -> None:
    req = example_request()
    inline = req.model_copy(update={"profile": DEFAULT_PROFILE})
    plans = [json.loads(canonical_json(plan(r), drop_timing=True)) for r in (req, inline)]
    for p in plans:
        p.pop("plan_id")
    assert "profile" not in plans[0]  # no profile asked for: the body is as before
    assert plans[1].pop("profile") == {"name": "default", "version": None, "job_version": None}
    assert plans[0] == plans[1]


def test_efficiency_per_part() -> None:
    """Each part of the model runs at its own share of peak."""
    profile = Profile(
        peak_tflops=1.0,
        efficiency_full_attention=0.25,
        efficiency_sparse_attention=0.5,
        efficiency_linear=1.0,
        intra_node_gbps=1.0,
        inter_node_gbps=0.5,
    )
    cost = CostModel.from_specs(TOY_CLUSTER, TOY_MODEL, profile)
    costs = SampleCosts.build(cost, [20])
    assert costs.full_s.tolist() == pytest.approx([19200 / 2.5e11])
    assert costs.sparse_s.tolist() == pytest.approx([14400 / 5e11])
    assert cost.linear_seconds_per_token == pytest.approx(1752 / 1e12)
    assert mfu(cost, 1e12, 1.0) == pytest.approx(1e12 / (4 * 1e12))  # peak, not achieved


def test_collective_latency(toy: CostModel) -> None:
    """Every group of more than one rank pays 4 all-to-all calls per layer (QKV out, O back,
    forward and backward); a rank alone pays none; an empty child runs nothing."""
    profile = TOY_PROFILE.model_copy(update={"collective_latency_us": 3.0})
    slow = CostModel.from_specs(TOY_CLUSTER, TOY_MODEL, profile)
    assert slow.layer_fixed_seconds(2) == pytest.approx(12e-6)
    assert slow.layer_fixed_seconds(1) == 0.0
    for k in (1, 2):
        want = child_layer_seconds(toy, k, 1e-6, 7) + slow.layer_fixed_seconds(k)
        assert child_layer_seconds(slow, k, 1e-6, 7) == pytest.approx(want, rel=1e-12)
    assert child_layer_seconds(slow, 2, 0.0, 0) == 0.0
    children = [(2, 14400 / 5e11, 20), (1, 1200 / 5e11, 5)]
    # full layers: 2 x 12 us for the parent's all-to-all; sparse: the child of 2 is the slowest
    # and pays its 12 us, so 2 x 12 us more there too
    want = parent_seconds(toy, 4, 2e-8, children) + 4 * 12e-6
    assert parent_seconds(slow, 4, 2e-8, children) == pytest.approx(want, rel=1e-12)


def test_collective_latency_per_peer(toy: CostModel) -> None:
    """A call in a group of k ranks costs the per-call latency plus (k - 1) x the per-peer one;
    4 calls a layer; a rank alone pays nothing."""
    profile = TOY_PROFILE.model_copy(
        update={"collective_latency_us": 3.0, "collective_latency_us_per_peer": 2.0}
    )
    slow = CostModel.from_specs(TOY_CLUSTER, TOY_MODEL, profile)
    assert slow.layer_fixed_seconds(1) == 0.0
    for k in (2, 4, 8):
        assert slow.layer_fixed_seconds(k) == pytest.approx(4 * (3e-6 + (k - 1) * 2e-6))
        assert slow.peer_latency_seconds(k) == pytest.approx(4 * (k - 1) * 2e-6)
    assert toy.peer_latency_seconds(8) == 0.0  # 0 by default: the default profile is unchanged


@pytest.mark.parametrize("mode", ["sizing", "repack+sizing"])
def test_per_peer_latency_keeps_plans_valid_terms_exact_and_bounds_true(mode: str) -> None:
    lengths = [30000, 9000, 120, 7, 4000, 2200, 61, 15000, 800, 3]
    cluster = {"nodes": 2, "gpus_per_node": 8, "max_tokens_per_rank": 4096}
    profile = Profile(name="peers", collective_latency_us=5.0, collective_latency_us_per_peer=40.0)
    req = PlanRequest.model_validate(
        {"cluster": cluster, "lengths": lengths, "mode": mode, "profile": profile}
    )
    priced = plan(req, deadline_ms=60_000)
    assert validate_plan(req, priced) == []
    assert priced.metrics.lower_bound_ms is not None
    assert priced.metrics.lower_bound_ms <= priced.metrics.step_time_ms
    cost = CostModel.from_request(req)
    terms = step_terms(req, priced)
    assert terms.total == pytest.approx(
        step_seconds(req, priced, cost, SampleCosts.build(cost, lengths)), rel=1e-12
    )
    widest = max(p.ranks[1] - p.ranks[0] for p in priced.parents)
    assert widest == 1 or terms.peer_latency > 0


def test_plan_with_latency_profile_validates() -> None:
    """The planner and the validator score a plan with the request's profile."""
    req = example_request()
    slow = req.model_copy(
        update={"profile": DEFAULT_PROFILE.model_copy(update={"collective_latency_us": 50.0})}
    )
    fast, latent = plan(req), plan(slow)
    assert validate_plan(slow, latent) == []
    assert latent.metrics.step_time_ms > fast.metrics.step_time_ms
    assert latent.metrics.lower_bound_ms is not None
    assert latent.metrics.lower_bound_ms <= latent.metrics.step_time_ms


def test_membership_estimate_counts_the_collective_latency() -> None:
    """The membership search's unrepacked estimate is the cost model's exact time, latency
    included (a calibrated profile may carry one)."""
    req = example_request().model_copy(
        update={"profile": DEFAULT_PROFILE.model_copy(update={"collective_latency_us": 500.0})}
    )
    problem = Problem.from_request(req)
    estimate = make_cost_fn(problem, "baseline")
    members = list(range(problem.num_samples))
    full = sum(problem.full_s[s] for s in members)
    sparse = sum(problem.sparse_s[s] for s in members)
    tokens = sum(problem.tokens[s] for s in members)
    for size in (1, 4, 16):
        exact = unrepacked_parent_seconds(problem.cost, size, full, sparse, tokens)
        assert estimate(size, full, sparse, tokens, 0.0) == pytest.approx(exact, rel=1e-12)


@pytest.mark.parametrize("mode", ["baseline", "sizing", "repack+parent", "repack+sizing"])
def test_fixed_cost_terms_keep_plans_valid_and_bounds_true(mode: str) -> None:
    """Per-layer and per-sample overheads (new profile terms) enter every planner through the
    cost model's layer and sample times: plans stay valid, their bound below their time, and
    the same layout's step grows by at least the overhead of every layer."""
    lengths = [30000, 9000, 120, 7, 4000, 2200, 61, 15000, 800, 3]
    cluster = {"nodes": 2, "gpus_per_node": 8, "max_tokens_per_rank": 4096}
    base = PlanRequest.model_validate({"cluster": cluster, "lengths": lengths, "mode": mode})
    slow = base.model_copy(
        update={
            "profile": Profile(
                name="fixed-costs",
                layer_overhead_us=400.0,
                sample_overhead_us_full=250.0,
                sample_overhead_us_sparse=40.0,
                collective_latency_us=15.0,
            )
        }
    )
    priced = plan(slow, deadline_ms=60_000)
    assert validate_plan(slow, priced) == []
    assert priced.metrics.lower_bound_ms is not None
    assert priced.metrics.lower_bound_ms <= priced.metrics.step_time_ms
    cost0, cost1 = CostModel.from_request(base), CostModel.from_request(slow)
    t0 = step_seconds(base, priced, cost0, SampleCosts.build(cost0, lengths))
    t1 = step_seconds(slow, priced, cost1, SampleCosts.build(cost1, lengths))
    assert t1 >= t0 + (cost1.full_layers + cost1.sparse_layers) * 400e-6 * 0.999


@pytest.mark.parametrize("latency_us", [0.0, 15.0])
def test_child_packer_times_are_child_layer_seconds_bit_for_bit(latency_us: float) -> None:
    """The child packer's precomputed times (``Problem.alone_s``, vectorised, and
    ``ChildPacker.child_s`` with per-size terms memoised) are ``child_layer_seconds`` to the
    last bit, fixed terms included: its choices compare them, so a last-bit change could
    change a plan."""
    lengths = [30000, 9000, 120, 7, 4000, 2200, 61, 800, 3, 1, 4097, 8191]
    cluster = {"nodes": 2, "gpus_per_node": 8, "max_tokens_per_rank": 4096}
    profile = Profile(
        name="fixed-costs",
        layer_overhead_us=400.0,
        sample_overhead_us_sparse=40.0,
        collective_latency_us=latency_us,
    )
    req = PlanRequest.model_validate({"cluster": cluster, "lengths": lengths, "profile": profile})
    problem = Problem.from_request(req)
    samples = range(problem.num_samples)
    assert set(problem.alone_s) == set(problem.child_sizes)
    for k, times in problem.alone_s.items():
        exact = [
            child_layer_seconds(problem.cost, k, problem.sparse_s[s], problem.tokens[s])
            for s in samples
        ]
        assert list(times) == exact
    packer = ChildPacker(problem, 0, 16, list(samples))
    for k in (1, 2, 4, 8, 16):
        for sparse, tokens in [(0.0, 0), (1e-3, 1), (0.37, 12_345), (2.5e-5, 8_191)]:
            assert packer.child_s(k, sparse, tokens) == child_layer_seconds(
                problem.cost, k, sparse, tokens
            )
