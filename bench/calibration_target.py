"""Calibrated prediction vs measured step time of the toy model (gloo, local ranks).

    .venv/bin/python bench/calibration_target.py --ranks 4 --gpus-per-node 2 --steps 30

Calibrates on N forked gloo ranks (``runtime_client.calibrate``), fits the profile, then trains
the toy 1F3S model for ``--steps`` steps with plans from the in-process planner priced with that
profile, timing every step (forward + backward + optimizer; planning excluded) and comparing it
with the plan's predicted step time. Prints the error distribution (a benchmark: no asserts).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Any

import torch

from cli.calibrate import (
    calibrated_profile,
    fit_report,
    profile_document,
    step_fit_report,
    toy_model_spec,
)
from runtime_client.calibrate import CalibrationConfig, run_calibration
from runtime_client.calibration_steps import run_toy_step
from runtime_client.groups import GroupConfig, RepackGroups
from runtime_client.local_launch import pin_to_simulated_node, run_local_ranks
from runtime_client.step_timer import StepTimer
from runtime_client.toy_model import ToyConfig, ToyModel
from solver.calibration_profile import fit_profile
from solver.cost_model import CostModel, SampleCosts
from solver.planner import plan as solve
from solver.profile_feedback import FeedbackConfig, Observation, constants_of, refit, with_constants
from solver.profiles import Profile
from solver.schema import Plan, PlanRequest
from solver.validate import step_seconds

TOY_SIZES = {
    "small": ToyConfig(),
    "medium": ToyConfig(hidden=128, head_dim=16, ffn=256, window=64),
}


def step_lengths(seed: int, step: int, tokens: int, longest: int) -> list[int]:
    """The toy's long-tailed step (as examples/train_toy.py draws it)."""
    rng = random.Random(seed * 100_003 + step)
    lengths: list[int] = []
    while True:
        n = rng.choice([rng.randint(1, 12), rng.randint(12, 60), rng.randint(60, 400)])
        if sum(lengths) + n > tokens:
            return lengths
        lengths.append(min(n, longest))


def _rank(rank: int, world: int, args: argparse.Namespace) -> dict[str, Any]:
    if args.pin:
        pin_to_simulated_node(rank, args.gpus_per_node)
    config = CalibrationConfig(
        model=TOY_SIZES[args.toy],
        gpus_per_node=args.gpus_per_node,
        lengths=tuple(args.lengths),
        payload_tokens=tuple(args.payload_tokens),
        repeats=args.repeats,
        statistic=args.statistic,
        pack=args.pack,
        steps=args.calibration_steps,
        step_tokens_per_rank=args.max_tokens_per_rank,
        step_repeats=args.step_repeats,
    )
    t0 = time.time()
    measured = run_calibration(config)
    calibrate_s = time.time() - t0
    cluster, model = toy_model_spec(config, world)
    cluster = cluster.model_copy(update={"max_tokens_per_rank": args.max_tokens_per_rank})
    fitted = fit_profile(
        CostModel.from_specs(cluster, model),
        measured.all_to_all,
        measured.compute,
        peak_tflops=measured.peak_tflops,
    )
    parts_profile = profile_document("calibrated", fitted)
    profile, step_fit = calibrated_profile("calibrated", fitted, measured.steps)
    groups = RepackGroups(GroupConfig(world_size=world, gpus_per_node=args.gpus_per_node)).setup()
    torch.manual_seed(0)
    toy = ToyModel(config.model)
    optimizer = torch.optim.AdamW(toy.parameters(), lr=1e-3)
    pattern = config.model.pattern
    kinds = [pattern[i % len(pattern)] for i in range(config.model.layers)]
    timer = StepTimer().attach(toy.blocks, kinds)
    rows = []
    for step in range(args.steps):
        lengths = step_lengths(0, step, args.tokens_per_step, world * args.max_tokens_per_rank)
        request = PlanRequest.model_validate(
            {
                "cluster": cluster.model_dump(exclude={"profile"}),
                "model": model.model_dump(exclude={"profile"}),
                "lengths": lengths,
                "mode": args.mode,
            }
        )
        priced = request.model_copy(update={"profile": Profile.model_validate(profile)})
        plan = solve(priced, deadline_ms=10_000, use_cpsat=False)
        m = run_toy_step(toy, plan, rank, groups, timer, seed=step, repeats=args.step_repeats)
        optimizer.step()
        parts_priced = request.model_copy(update={"profile": Profile.model_validate(parts_profile)})
        cost = CostModel.from_request(parts_priced)
        parts_ms = step_seconds(parts_priced, plan, cost, SampleCosts.build(cost, lengths)) * 1e3
        rows.append(
            {
                "step": step,
                "predicted_ms": plan.metrics.step_time_ms,
                "parts_predicted_ms": parts_ms,
                **m.model_dump(),
            }
        )
        rows[-1]["request"], rows[-1]["plan"] = priced.model_dump_json(), plan.model_dump_json()
        rows[-1]["layers_sum_ms"] = m.layers.full_ms + m.layers.sparse_ms if m.layers else None
    return {
        "profile": profile,
        "parts_profile": parts_profile,
        "calibration_steps": [
            {
                "request": o.request.model_dump_json(),
                "plan": o.plan.model_dump_json(),
                "measured_s": o.measured_s,
                "all_to_all_s": o.all_to_all_s,
            }
            for o in measured.steps
        ],
        "report": fit_report(fitted) + ("\n" + step_fit_report(step_fit) if step_fit else ""),
        "rows": rows,
        "calibrate_s": calibrate_s,
        "steps_s": time.time() - t0 - calibrate_s,
    }


def refit_and_rescore(
    train: list[dict[str, Any]], held_out: list[dict[str, Any]], key: str
) -> tuple[list[float], dict[str, float | str]]:
    """Fit the profile from measured steps (``key`` as the step time), then predict the
    held-out steps' plans with it (the layouts they ran with)."""
    obs = [
        Observation(
            PlanRequest.model_validate_json(r["request"]),
            Plan.model_validate_json(r["plan"]),
            r[key] / 1e3,
            r["all_to_all_ms"] / 1e3,
        )
        for r in train
    ]
    # Bounded like the service's refit: an unbounded one let all-to-all waits (a slow rank's
    # compute, seen by the others as time inside the collective) drive the bandwidths to the
    # floor of their range.
    config = FeedbackConfig(min_steps=2, max_change=2.0, window=len(obs))
    fit = refit(obs, constants_of(obs[0].request), config)
    out = []
    for r in held_out:
        req = with_constants(PlanRequest.model_validate_json(r["request"]), fit.constants)
        cost = CostModel.from_request(req)
        p = Plan.model_validate_json(r["plan"])
        out.append(step_seconds(req, p, cost, SampleCosts.build(cost, req.lengths)) * 1e3)
    return out, {**fit.constants, "notes": "; ".join(fit.notes) or "none"}


def distribution(errors: list[float]) -> str:
    """The whole distribution of (predicted - measured) / measured: share within 20%, p50 and
    p90 of |error|, median signed error, deciles and range."""
    within = sum(abs(e) <= 0.2 for e in errors) / len(errors)
    absolute = [abs(e) for e in errors]
    p50, p90 = (statistics.quantiles(absolute, n=10, method="inclusive")[i] for i in (4, 8))
    q = " ".join(f"{x:+.0%}" for x in statistics.quantiles(errors, n=10, method="inclusive"))
    return (
        f"within 20% {within:.0%} ({sum(abs(e) <= 0.2 for e in errors)}/{len(errors)}), "
        f"|error| p50 {p50:.1%} p90 {p90:.1%}, median {statistics.median(errors):+.1%}, "
        f"deciles {q}, range {min(errors):+.0%} .. {max(errors):+.0%}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--gpus-per-node", type=int, default=2)
    p.add_argument("--steps", type=int, default=30, help="training steps compared")
    p.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="pin each simulated node's ranks to one core (runtime_client.local_launch)",
    )
    p.add_argument(
        "--calibration-steps",
        type=int,
        default=24,
        help="whole steps timed by the calibration itself (its own lengths; 0 = parts only)",
    )
    p.add_argument("--toy", choices=sorted(TOY_SIZES), default="small")
    p.add_argument("--mode", default="repack+sizing")
    p.add_argument("--max-tokens-per-rank", type=int, default=128)
    p.add_argument("--tokens-per-step", type=int, default=400)
    p.add_argument("--lengths", type=int, nargs="+", default=[64, 128, 256, 384])
    p.add_argument("--payload-tokens", type=int, nargs="+", default=[16, 256, 1024, 4096])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", default=None, help="write per-step rows here")
    p.add_argument("--step-repeats", type=int, default=3, help="runs per step (min kept)")
    p.add_argument("--statistic", choices=["median", "min"], default="median")
    p.add_argument("--refit-steps", type=int, default=10, help="steps the online refit uses")
    p.add_argument("--pack", type=int, default=8, help="samples per packed attention point")
    args = p.parse_args()
    t0 = time.time()
    out = run_local_ranks(_rank, args.ranks, args, timeout_s=3600)[0]
    print(out["report"])
    print(json.dumps(out["profile"]))
    print(
        f"{len(out['rows'])} steps, {args.ranks} ranks ({args.gpus_per_node} per node), "
        f"{time.time() - t0:.0f} s wall (calibration {out['calibrate_s']:.0f} s, "
        f"steps {out['steps_s']:.0f} s)"
    )
    rows = out["rows"]
    print(
        "whole step, profile of the parts alone: "
        + distribution([r["parts_predicted_ms"] / r["step_time_ms"] - 1 for r in rows])
    )
    for label, key in (("whole step", "step_time_ms"), ("layers fwd+bwd", "layers_sum_ms")):
        print(label + ": " + distribution([r["predicted_ms"] / r[key] - 1 for r in rows]))
        k = args.refit_steps
        if 2 <= k < len(rows):
            rescored, fit = refit_and_rescore(rows[:k], rows[k:], key)
            print(
                f"  after a refit on steps 0-{k - 1} (held-out steps {k}-{len(rows) - 1}): "
                + distribution([p / r[key] - 1 for p, r in zip(rescored, rows[k:], strict=True)])
            )
            shown = (
                f"{n} {v:.4g}" if isinstance(v, float) else f"{n}: {v}" for n, v in fit.items()
            )
            print("  refit constants: " + ", ".join(shown))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
