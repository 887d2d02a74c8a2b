"""Calibration on real gloo ranks (4 = 2 simulated nodes x 2) and the step timer in a real step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from cli.calibrate import calibrated_profile, profile_document, toy_model_spec
from runtime_client.all_to_all import RepackComm
from runtime_client.calibrate import CalibrationConfig, Measurements, run_calibration
from runtime_client.groups import GroupConfig, RepackGroups
from runtime_client.local_launch import pin_to_simulated_node, run_local_ranks
from runtime_client.local_layout import LocalLayout, plan_lengths
from runtime_client.step_timer import StepTimer, TimedAttention
from runtime_client.toy_model import RepackAttention, ToyConfig, ToyModel, synthetic_batch
from solver.calibration_profile import PARTS, fit_profile
from solver.cost_model import CostModel
from solver.measurement_schema import StepMeasurement
from solver.planner import plan
from solver.profiles import Profile
from solver.schema import PlanRequest

ROOT = Path(__file__).resolve().parents[2]
SMALL = CalibrationConfig(
    gpus_per_node=2, lengths=(16, 32, 64), payload_tokens=(16, 128, 512), repeats=2, warmup=1
)


def _calibrate(rank: int, world: int, config: CalibrationConfig) -> Measurements:
    return run_calibration(config)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_calibration_measures_every_group_and_part_and_fits_a_profile() -> None:
    results = run_local_ranks(_calibrate, 4, SMALL, timeout_s=240)
    first = results[0]
    # Every rank holds the same measurements (max / median over ranks).
    assert all(r.all_to_all == first.all_to_all for r in results)
    assert all(r.compute == first.compute for r in results)
    groups = sorted({(p.group, p.link) for p in first.all_to_all})
    assert groups == [(2, "intra"), (4, "inter")]
    assert len(first.all_to_all) == 2 * 3 and all(p.seconds > 0 for p in first.all_to_all)
    singles = {(p.part, p.length) for p in first.compute if p.samples == 1}
    assert singles == {(part, n) for part in PARTS for n in SMALL.lengths}
    packed = {(p.part, p.samples) for p in first.compute if p.samples > 1}  # per-sample costs
    assert packed == {("full_attention", SMALL.pack), ("sparse_attention", SMALL.pack)}
    cluster, model = toy_model_spec(SMALL, 4)
    fitted = fit_profile(
        CostModel.from_specs(cluster, model),
        first.all_to_all,
        first.compute,
        peak_tflops=first.peak_tflops,
    )
    assert set(fitted.fits) == {*PARTS, "intra", "inter"}
    assert all(0 < e <= 1 for e in fitted.part_efficiency.values())
    assert fitted.intra_node_gbps > 0 and fitted.inter_node_gbps > 0
    doc = profile_document("cpu", fitted)
    assert doc["name"] == "cpu" and doc["efficiency_linear"] == fitted.part_efficiency["linear"]
    assert doc["layer_overhead_us"] >= 0 and doc["sample_overhead_us_full"] >= 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_repack_calibrate_writes_a_profile_file(tmp_path: Path) -> None:
    out = tmp_path / "cpu.json"
    cmd = [
        sys.executable, "-m", "cli.main", "calibrate", "--name", "cpu-2x2", "--out", str(out),
        "--local-ranks", "4", "--gpus-per-node", "2", "--lengths", "16,32",
        "--payload-tokens", "16,256", "--repeats", "2", "--steps", "6",
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    for term in (*PARTS, "intra", "inter"):
        assert term in done.stdout  # one fit-error row per term
    assert "rms error" in done.stdout
    assert "whole steps: 6 timed" in done.stdout  # the step fit ran and says what it moved
    profile = json.loads(out.read_text())
    assert profile["name"] == "cpu-2x2" and profile["intra_node_gbps"] > 0
    assert profile["collective_latency_us_per_peer"] > 0  # fitted to the steps


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_calibration_times_whole_steps_of_every_group_size_and_fits_them() -> None:
    config = replace(SMALL, steps=6, step_repeats=1, step_tokens_per_rank=64)
    results = run_local_ranks(_calibrate, 4, config, timeout_s=240)
    steps = results[0].steps
    assert len(steps) == 6
    assert all(r.steps == steps for r in results)  # max over ranks: the same on every rank
    sizes = {p.ranks[1] - p.ranks[0] for o in steps for p in o.plan.parents}
    assert {1, 2, 4} <= sizes  # every group size, so latency per call and per peer separate
    assert all(o.measured_s > 0 and o.all_to_all_s is not None for o in steps)
    wide = [o for o in steps if max(p.ranks[1] - p.ranks[0] for p in o.plan.parents) > 1]
    assert wide and all(o.all_to_all_s and o.all_to_all_s > 0 for o in wide)
    cluster, model = toy_model_spec(config, 4)
    fitted = fit_profile(
        CostModel.from_specs(cluster, model),
        results[0].all_to_all,
        results[0].compute,
        peak_tflops=results[0].peak_tflops,
    )
    document, fit = calibrated_profile("cpu", fitted, steps)
    assert fit is not None and fit.steps == 6
    assert fit.median_abs_error_after <= fit.median_abs_error_before
    Profile.model_validate(document)  # every constant in the contract's range


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        (["--name", "bad name!"], "--name"),
        (["--name", "ok", "--steps", "2"], "--steps"),  # too few steps to fit, said up front
        (["--name", "ok", "--steps", "-1"], "--steps"),
    ],
)
def test_repack_calibrate_refuses_bad_input_in_one_line(
    tmp_path: Path, bad: list[str], field: str
) -> None:
    out = tmp_path / "x.json"
    cmd = [sys.executable, "-m", "cli.main", "calibrate", *bad, "--out", str(out),
           "--local-ranks", "4"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2 and not out.exists()
    assert done.stderr.count("\n") == 1 and field in done.stderr


def _timed_step(rank: int, world: int) -> dict[str, Any]:
    cfg = ToyConfig()
    groups = RepackGroups(GroupConfig(world_size=world, gpus_per_node=2)).setup()
    request = PlanRequest.model_validate(
        {
            "cluster": {"nodes": 2, "gpus_per_node": 2, "max_tokens_per_rank": 64},
            "model": {"heads": 16, "kv_heads": 4, "head_dim": 8, "sparse_window": 16},
            "lengths": [100, 40, 30, 20, 9, 5],
            "parent_sizes": [4],
            "mode": "repack",
        }
    )
    p = plan(request, use_cpsat=False)
    layout = LocalLayout.from_plan(p, rank)
    torch.manual_seed(0)
    model = ToyModel(cfg)
    timer = StepTimer().attach(model.blocks, [cfg.pattern[i % 4] for i in range(cfg.layers)])
    tokens_T, labels_T = synthetic_batch(plan_lengths(p), cfg.vocab, seed=0)
    backend = TimedAttention(RepackAttention(RepackComm(layout, groups)), timer)
    timer.start()
    idx = layout.global_index_N
    loss = F.cross_entropy(model(tokens_T[idx], layout.position_ids_N, backend), labels_T[idx])
    loss.backward()
    m = timer.finish(p.plan_id)
    dist.barrier()
    return {"m": m.model_dump(), "layer_s": dict(timer.layer_s)}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_step_timer_measures_layers_and_all_to_all_the_same_on_every_rank() -> None:
    results = run_local_ranks(_timed_step, 4, timeout_s=240)
    ms = [StepMeasurement.model_validate(r["m"]) for r in results]
    assert all(m == ms[0] for m in ms)  # max-reduced: one measurement for the step
    m = ms[0]
    assert m.layers is not None and m.all_to_all_ms is not None and m.ranks == 4
    assert m.layers.full_ms > 0 and m.layers.sparse_ms > 0 and m.all_to_all_ms > 0
    # Layers (forward and backward) run inside the step: neither kind can exceed it (each is
    # max-reduced on its own, so their sum may come from different ranks).
    assert max(m.layers.full_ms, m.layers.sparse_ms) <= m.step_time_ms * 1.0001
    # The reduced value is the largest rank's own.
    assert m.layers.sparse_ms == pytest.approx(
        max(r["layer_s"]["S"] for r in results) * 1e3, rel=1e-5
    )


def _pinned(rank: int, world: int) -> tuple[int, list[int]]:
    core = pin_to_simulated_node(rank, 2)
    return core, sorted(os.sched_getaffinity(0))


def test_pinning_puts_a_simulated_node_on_one_core_round_robin() -> None:
    cores = sorted(os.sched_getaffinity(0))
    results = run_local_ranks(_pinned, 4)
    for rank, (core, allowed) in enumerate(results):
        assert allowed == [core]  # pinned to exactly one core
        assert core == cores[(rank // 2) % len(cores)]  # node n on the n-th allowed core
    assert results[0][0] == results[1][0] and results[2][0] == results[3][0]
    assert sorted(os.sched_getaffinity(0)) == cores  # the parent is left alone
