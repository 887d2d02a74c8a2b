"""`repack calibrate --name NAME --out PROFILE.json`: measure this cluster, fit a profile.

Launch it like training (``torchrun --nnodes N --nproc-per-node G -m cli.main calibrate ...``,
any backend) or let it start ``--local-ranks N`` gloo processes itself (``fork``; N = nodes x
``--gpus-per-node`` simulated on one machine). Rank 0 fits the constants, prints each term's fit
error and writes the profile file atomically; the other ranks only measure.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from cli.errors import InputError
from cli.options import output_path, positive_int
from cli.output import format_table, write_atomic
from solver.calibration_fit import CalibrationFitError
from solver.calibration_profile import (
    LINKS,
    PARTS,
    STEP_FIT,
    FittedProfile,
    fit_profile,
    fit_steps,
    fitted_profile,
    timed_model_spec,
)
from solver.cost_model import CostModel
from solver.profile_feedback import Observation, Refit
from solver.profiles import Profile
from solver.schema import ClusterSpec, ModelSpec


def _sizes(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if len(values) < 2 or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected >= 2 positive integers, got {text!r}")
    return values


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "calibrate",
        help="measure all-to-all and model parts on this cluster, fit and write a profile",
        description="Measure all-to-all bandwidth and latency for the planner's group sizes "
        "(inside and across nodes) and the per-token time of full attention, sliding-window "
        "attention and the linear/MoE part at several lengths; fit the profile constants by "
        "least squares, print each term's fit error and write a named profile file.",
    )
    p.add_argument("--name", required=True, help="profile name (letters, digits, . _ -)")
    p.add_argument(
        "--out",
        type=output_path,
        required=True,
        metavar="PROFILE.json",
        help="profile file to write",
    )
    p.add_argument(
        "--gpus-per-node",
        type=positive_int,
        default=None,
        metavar="G",
        help="ranks per node (default: LOCAL_WORLD_SIZE, else the world size)",
    )
    p.add_argument(
        "--local-ranks",
        type=positive_int,
        default=None,
        metavar="N",
        help="start N local gloo ranks instead of joining a torchrun job",
    )
    p.add_argument("--backend", default="gloo", help="torch.distributed backend under torchrun")
    p.add_argument(
        "--lengths",
        type=_sizes,
        default=(64, 128, 256, 512),
        help="sample lengths for the model parts (comma-separated)",
    )
    p.add_argument(
        "--payload-tokens",
        type=_sizes,
        default=(256, 1024, 4096),
        help="all-to-all payloads in tokens per rank (comma-separated)",
    )
    p.add_argument("--repeats", type=positive_int, default=5, help="timed repetitions per point")
    p.add_argument(
        "--steps",
        type=int,
        default=24,
        metavar="N",
        help="whole training steps of the timed model to fit the per-collective latency, compute "
        "scale and per-layer time to (gloo ranks; 0 = parts only)",
    )
    p.add_argument(
        "--step-tokens-per-rank",
        type=positive_int,
        default=128,
        metavar="T",
        help="max tokens per rank of those steps",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    # torch is imported here, not at module level: `repack solve` must not pay for it.
    from runtime_client.calibrate import CalibrationConfig, Measurements

    name_ok = args.name.replace(".", "").replace("_", "").replace("-", "")
    if not name_ok.isalnum() or not args.name[0].isalnum() or len(args.name) > 100:
        raise InputError(f"--name: {args.name!r} is not a profile name (letters, digits, . _ -)")
    world = args.local_ranks or int(os.environ.get("WORLD_SIZE", "1"))
    g = args.gpus_per_node or int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    if world % g != 0 and world > g:
        raise InputError(f"--gpus-per-node {g} does not divide the {world} ranks")
    if args.steps < 0 or 0 < args.steps < STEP_FIT.min_steps:
        raise InputError(
            f"--steps: expected 0 (parts only) or >= {STEP_FIT.min_steps} steps to fit, "
            f"got {args.steps}"
        )
    on_cpu = args.local_ranks or args.backend == "gloo"
    if args.steps and not on_cpu:
        print(f"--steps: whole steps run on gloo ranks only; the {args.backend} fit uses parts")
    config = CalibrationConfig(
        gpus_per_node=min(g, world),
        lengths=args.lengths,
        payload_tokens=args.payload_tokens,
        repeats=args.repeats,
        steps=args.steps if on_cpu else 0,
        step_tokens_per_rank=args.step_tokens_per_rank,
    )
    measured: Measurements | None = _measure(args, config, world)
    if measured is None:
        return 0  # not rank 0: rank 0 reports
    fitted = _fit(measured, config)
    print(fit_report(fitted))
    document, step_fit = calibrated_profile(args.name, fitted, measured.steps)
    if step_fit is not None:
        print(step_fit_report(step_fit))
    write_atomic(args.out, json.dumps(document, indent=1) + "\n")
    print(f"profile {args.name!r} written to {args.out}")
    return 0


def _measure(args: argparse.Namespace, config: Any, world: int) -> Any:
    from runtime_client.calibrate import measure_on_local_ranks, measure_under_launcher

    if args.local_ranks:
        return measure_on_local_ranks(config, args.local_ranks)
    return measure_under_launcher(config, args.backend)


def toy_model_spec(config: Any, world: int) -> tuple[ClusterSpec, ModelSpec]:
    """The cluster and model the measurements are interpreted with (the timed model's shapes)."""
    return timed_model_spec(config.model, world, config.gpus_per_node)


def _fit(measured: Any, config: Any) -> FittedProfile:
    cluster, model = toy_model_spec(config, measured.world_size)
    try:
        return fit_profile(
            CostModel.from_specs(cluster, model),
            measured.all_to_all,
            measured.compute,
            peak_tflops=measured.peak_tflops,
        )
    except CalibrationFitError as exc:
        raise InputError(f"the measurements cannot be fitted: {exc}") from exc


def fit_report(fitted: FittedProfile) -> str:
    """One row per term: the fitted constant and how well the fit explains the points."""
    rows = []
    for term in (*PARTS, *LINKS):
        fit = fitted.fits.get(term)
        if fit is None:
            rows.append([term, "not measured", "", "", "", ""])
            continue
        if term in PARTS:
            value = f"{fitted.part_efficiency[term]:.4g} of peak"
        else:
            value = f"{fit.rate / 1e9:.4g} GB/s"
        fixed = f"{fit.intercept_s * 1e6:.1f}"
        per_sample = f"{fit.per_item_s * 1e6:.1f}" if term in PARTS else ""
        errors = [f"{fit.rel_rms_error:.1%}", f"{fit.max_rel_error:.1%}"]
        rows.append([term, value, fixed, per_sample, *errors])
    header = ["term", "fitted", "fixed us", "per sample us", "rms error", "max error"]
    return (
        f"peak {fitted.peak_tflops:.4g} TFLOP/s per rank; per-layer overhead "
        f"{fitted.layer_overhead_s * 1e6:.1f} us\n" + format_table(header, rows)
    )


def profile_document(name: str, fitted: FittedProfile) -> dict[str, Any]:
    """The profile file: the contract's ``Profile`` (what ``--profile FILE`` and
    ``PUT /v1/profiles/{name}`` take)."""
    try:
        return fitted_profile(name, fitted).model_dump(exclude={"version", "job_version"})
    except ValidationError as exc:
        raise InputError(
            f"the fitted constants are not a valid profile: {exc.errors()[0]['msg']} "
            f"({exc.errors()[0]['loc'][0]})"
        ) from exc


def calibrated_profile(
    name: str, fitted: FittedProfile, steps: Sequence[Observation]
) -> tuple[dict[str, Any], Refit | None]:
    """The profile file after the whole-step fit (when steps were timed) and that fit."""
    document = profile_document(name, fitted)
    if not steps:
        return document, None
    try:
        step_fit = fit_steps(Profile.model_validate(document), steps)
    except CalibrationFitError as exc:
        raise InputError(f"the timed steps cannot be fitted: {exc}") from exc
    return {**document, **step_fit.constants}, step_fit


def step_fit_report(fit: Refit) -> str:
    """What the whole-step fit moved and how well the profile predicts those steps."""
    rates = ("compute", "intra", "inter")  # their multipliers scale a rate: time moves by 1/m
    moved = ", ".join(
        f"{term} x{1 / m if term in rates else m:.3g}" for term, m in fit.multipliers.items()
    )
    notes = f"; {'; '.join(fit.notes)}" if fit.notes else ""
    return (
        f"whole steps: {fit.steps} timed; median |error| of the parts' profile "
        f"{fit.median_abs_error_before:.1%}, after the step fit {fit.median_abs_error_after:.1%} "
        f"(time multipliers: {moved}){notes}"
    )
