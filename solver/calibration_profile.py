"""From calibration measurements to profile constants (the fitting half of ``repack calibrate``).

The runtime client's calibrate module times all-to-alls and the model's parts; this
module turns those times into the constants the cost model reads, using the cost model's own
formulas for bytes and FLOPs so that a fitted profile predicts exactly what was measured:

* all-to-all: ``seconds = latency + bytes_out / rate``, where ``bytes_out`` is what one rank
  sends off the node's fast link the way ``CostModel._a2a_formula`` counts it (``(k-1)/k`` of
  the payload inside a node, the inter-node share across nodes);
* compute: ``seconds = flops / (peak x efficiency)`` per part (full attention, sliding-window
  attention, linear/MoE), each part's FLOPs from ``CostModel``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from solver.calibration_fit import (
    LATENCY_ONLY_RATE,
    CalibrationFitError,
    RateFit,
    fit_intercept_at_rate,
    fit_rate,
    fit_rate_per_item,
)
from solver.cost_model import BYTES_PER_GB, FLOPS_PER_TFLOP, CostModel
from solver.profile_feedback import (
    CONSTANTS_OF_TERM,
    FITTED,
    FeedbackConfig,
    Observation,
    Refit,
    refit,
)
from solver.profiles import BANDWIDTH_GBPS_RANGE, EFFICIENCY_RANGE, Profile
from solver.schema import ClusterSpec, ModelSpec

PARTS = ("full_attention", "sparse_attention", "linear")
LINKS = ("intra", "inter")


@dataclass(frozen=True, kw_only=True)
class AllToAllPoint:
    """One timed ``all_to_all_single``: every group of ``group`` ranks exchanged at once."""

    group: int
    gpus_per_node: int
    bytes_per_rank: float
    """Payload each rank sends (its own slice included)."""
    seconds: float
    """Per call, slowest rank."""

    @property
    def link(self) -> str:
        return "inter" if self.group > self.gpus_per_node else "intra"

    @property
    def bytes_out(self) -> float:
        """Bytes the cost model charges to the link that prices this group."""
        g, k = self.gpus_per_node, self.group
        if k > g:
            return self.bytes_per_rank * (k - g) / k
        return self.bytes_per_rank * (k - 1) / k


@dataclass(frozen=True, kw_only=True)
class ComputePoint:
    """Forward + backward wall time of one part of one layer on ``length`` tokens of a sample."""

    part: str
    length: int
    """Tokens of each sample."""
    seconds: float
    samples: int = 1
    """Samples of ``length`` packed into the timed call (their fixed costs add up)."""

    def __post_init__(self) -> None:
        if self.part not in PARTS:
            raise ValueError(f"Expected part in {PARTS}, got {self.part!r}.")


@dataclass(frozen=True, kw_only=True)
class FittedProfile:
    """The fitted constants and each term's fit."""

    peak_tflops: float
    part_efficiency: dict[str, float]
    """Achieved share of peak per part."""
    compute_efficiency: float
    """One efficiency for all parts (what a single-rate cost model uses): the FLOP-weighted
    harmonic mean of the parts' rates at the measured lengths."""
    intra_node_gbps: float
    inter_node_gbps: float
    collective_latency_s: float
    """Fixed seconds per all-to-all call (0 when the data did not ask for one)."""
    layer_overhead_s: float = 0.0
    """Fixed compute seconds of one layer: the linear part's intercept plus the attention
    calls' fixed cost, averaged over the model's layer kinds."""
    sample_overhead_s: dict[str, float] = field(default_factory=dict)
    """Fixed seconds per sample of each attention part."""
    fits: dict[str, RateFit]
    """Per term (``full_attention``, ..., ``intra``, ``inter``) its fit and errors."""


def timed_model_spec(shape: Any, world: int, gpus_per_node: int) -> tuple[ClusterSpec, ModelSpec]:
    """The cluster and model the measurements are interpreted with: the timed model's shapes
    (``shape`` has the toy model's fields: layers, pattern, hidden, heads, ..., in float32)."""
    model = ModelSpec(
        layers=shape.layers,
        pattern=shape.pattern,
        hidden=shape.hidden,
        heads=shape.heads,
        kv_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        sparse_window=shape.window,
        moe_active_params=shape.top_k * 2 * shape.hidden * shape.ffn,
        dtype_bytes=4,  # the parts are timed in float32
    )
    cluster = ClusterSpec(nodes=max(1, world // gpus_per_node), gpus_per_node=gpus_per_node)
    return cluster, model


def fitted_profile(name: str, fitted: FittedProfile) -> Profile:
    """The contract's ``Profile`` of a fit (raises ``ValidationError`` out of range)."""
    return Profile(
        name=name,
        peak_tflops=fitted.peak_tflops,
        efficiency_full_attention=fitted.part_efficiency["full_attention"],
        efficiency_sparse_attention=fitted.part_efficiency["sparse_attention"],
        efficiency_linear=fitted.part_efficiency["linear"],
        intra_node_gbps=fitted.intra_node_gbps,
        inter_node_gbps=fitted.inter_node_gbps,
        collective_latency_us=fitted.collective_latency_s * 1e6,
        layer_overhead_us=fitted.layer_overhead_s * 1e6,
        sample_overhead_us_full=fitted.sample_overhead_s.get("full_attention", 0.0) * 1e6,
        sample_overhead_us_sparse=fitted.sample_overhead_s.get("sparse_attention", 0.0) * 1e6,
    )


def part_flops(cost: CostModel, part: str, length: int) -> float:
    """Forward + backward FLOPs of one layer's ``part`` on one sample, per the cost model."""
    n = np.array([float(length)])
    if part == "full_attention":
        return float(cost.full_attention_flops(n)[0])
    if part == "sparse_attention":
        return float(cost.sparse_attention_flops(n)[0])
    return cost.linear_flops_per_token * float(length)


def fit_profile(
    cost: CostModel,
    a2a: Sequence[AllToAllPoint],
    compute: Sequence[ComputePoint],
    *,
    peak_tflops: float,
) -> FittedProfile:
    """Fit every constant; ``cost`` supplies the model's shapes (FLOPs and bytes formulas)."""
    fits: dict[str, RateFit] = {}
    for part in PARTS:
        pts = [p for p in compute if p.part == part]
        if len(pts) < 2:
            raise CalibrationFitError(f"Expected >= 2 lengths measured for {part}, got {len(pts)}.")
        flops = [part_flops(cost, part, p.length) * p.samples for p in pts]
        seconds = [p.seconds for p in pts]
        if part == "linear":  # per token: its intercept is the layer's fixed cost
            fits[part] = fit_rate(flops, seconds, intercept=len(pts) >= 3)
        elif len(pts) >= 3:  # fixed cost per call and per sample, both >= 0
            fits[part] = fit_rate_per_item(flops, [p.samples for p in pts], seconds)
        else:
            fits[part] = fit_rate(flops, seconds, intercept=False)
    peak = peak_tflops * FLOPS_PER_TFLOP
    # A part whose time did not grow with its FLOPs at all has no rate to speak of: it may not
    # set the peak (it would make every other part's efficiency ~0).
    credible = [f.rate for f in fits.values() if f.rate < LATENCY_ONLY_RATE] or [peak]
    best, worst = max(credible), min(credible)
    if best > peak or worst / peak <= EFFICIENCY_RANGE[0]:
        # A part beat the stated peak (the peak was wrong), or one runs below a profile's
        # smallest efficiency (a toy model on a CPU core): efficiencies relative to the best part.
        peak = best
    for part in PARTS:
        if fits[part].rate > peak:  # flat times: efficiency 1, the time is fixed cost
            pts = [p for p in compute if p.part == part]
            flops = [part_flops(cost, part, p.length) * p.samples for p in pts]
            fits[part] = fit_intercept_at_rate(flops, [p.seconds for p in pts], peak)
    floor = peak * EFFICIENCY_RANGE[0] * 1.01
    for part in ("full_attention", "sparse_attention"):
        pts = [p for p in compute if p.part == part]
        if fits[part].rate < floor and len(pts) >= 3:
            # Fixed costs swamp the FLOPs at these lengths: the rate is held at the range's
            # low end and the fixed terms take the rest.
            fits[part] = fit_rate_per_item(
                [part_flops(cost, part, p.length) * p.samples for p in pts],
                [p.samples for p in pts],
                [p.seconds for p in pts],
                min_rate=floor,
            )
    total_flops = sum(part_flops(cost, p.part, p.length) * p.samples for p in compute)
    total_s = sum(
        part_flops(cost, p.part, p.length) * p.samples / fits[p.part].rate for p in compute
    )
    for link in LINKS:
        links = [p for p in a2a if p.link == link]
        if len(links) >= 2:
            x, y = [p.bytes_out for p in links], [p.seconds for p in links]
            fits[link] = fit_rate(x, y)
            slowest = BANDWIDTH_GBPS_RANGE[0] * BYTES_PER_GB * 1.0001
            if fits[link].rate < slowest:  # below a profile's range: the rest is latency
                fits[link] = fit_intercept_at_rate(x, y, slowest)
    if "intra" not in fits:
        raise CalibrationFitError("Expected >= 2 intra-node all-to-all measurements.")
    intra = fits["intra"]
    inter = fits.get("inter", intra)  # one node: nothing to measure, links alike
    latencies = [fits[k].intercept_s for k in LINKS if k in fits]
    layers = max(cost.full_layers + cost.sparse_layers, 1)
    attention_call_s = (
        cost.full_layers * fits["full_attention"].intercept_s
        + cost.sparse_layers * fits["sparse_attention"].intercept_s
    ) / layers
    return FittedProfile(
        peak_tflops=peak / FLOPS_PER_TFLOP,
        part_efficiency={p: fits[p].rate / peak for p in PARTS},
        compute_efficiency=min(1.0, total_flops / float(total_s) / peak),
        intra_node_gbps=float(intra.rate / BYTES_PER_GB),
        inter_node_gbps=float(inter.rate / BYTES_PER_GB),
        collective_latency_s=float(np.mean(latencies)),
        layer_overhead_s=fits["linear"].intercept_s + attention_call_s,
        sample_overhead_s={p: fits[p].per_item_s for p in ("full_attention", "sparse_attention")},
        fits=fits,
    )


STEP_FIT = FeedbackConfig(
    min_steps=4,
    max_change=10_000.0,
    window=100_000,
    terms=("compute", "latency", "peer_latency", "overhead"),
    use_all_to_all=False,
)
"""Whole-step calibration: compute scale, per-collective latency (per call and per peer) and
fixed per-layer time move, far (steps may cost several times what the parts add up to); the
bandwidths stay as the all-to-all microbenchmarks measured them (a step's payloads are too small
to tell them from the latency), and only whole step times are regressed (a step's all-to-all
time is mostly waits for peers on an oversubscribed host)."""

MIN_STEP_LATENCY_US = 10.0
"""Starting per-collective latencies of the step fit when the microbenchmarks found none (a
multiplier cannot move a constant that is 0)."""

STEP_FIT_EFFICIENCY = 0.5
"""The best part's efficiency before the step fit (the peak is raised to match, rates are
unchanged): the compute scale may then move either way without clipping at 1."""


STEP_FIT_ROUNDS = 4
"""Refits at most, each from a peak raised to give the compute scale room again (a fit that
wants a part faster than efficiency 1 allows is clipped there; the next round is not)."""


def fit_steps(profile: Profile, steps: Sequence[Observation]) -> Refit:
    """``profile``'s constants refitted to timed whole steps (the runtime client times them);
    each step is repriced with the profile first (the steps were planned with another).

    ``constants`` of the result hold ``peak_tflops`` too, and its ``multipliers`` are the moves
    of the whole fit (the product over rounds)."""
    latency = max(profile.collective_latency_us, MIN_STEP_LATENCY_US)
    current = profile.model_copy(
        update={
            "collective_latency_us": latency,
            "collective_latency_us_per_peer": max(profile.collective_latency_us_per_peer, latency),
        }
    )
    first: Refit | None = None
    moves: dict[str, float] = {}
    for _ in range(STEP_FIT_ROUNDS):
        start = _with_headroom(current)
        priced = [
            Observation(
                o.request.model_copy(update={"profile": start}),
                o.plan,
                o.measured_s,
                o.all_to_all_s,
            )
            for o in steps
        ]
        fit = refit(priced, {n: float(getattr(start, n)) for n in FITTED}, STEP_FIT)
        first = first or fit
        moves = {t: moves.get(t, 1.0) * m for t, m in fit.multipliers.items()}
        current = start.model_copy(update=fit.constants)
        clipped = any(
            getattr(current, n) >= EFFICIENCY_RANGE[1] for n in CONSTANTS_OF_TERM["compute"]
        )
        if not clipped:
            break
    assert first is not None
    return replace(
        fit,
        constants={"peak_tflops": current.peak_tflops, **fit.constants},
        multipliers=moves,
        median_abs_error_before=first.median_abs_error_before,
    )


def _with_headroom(profile: Profile) -> Profile:
    """The same rates with the best part at ``STEP_FIT_EFFICIENCY`` of a raised peak, when the
    worst part stays in range."""
    names = ("efficiency_full_attention", "efficiency_sparse_attention", "efficiency_linear")
    effs = [float(getattr(profile, n)) for n in names]
    scale = STEP_FIT_EFFICIENCY / max(effs)
    if scale >= 1.0 or min(effs) * scale <= EFFICIENCY_RANGE[0] * 1.01:
        return profile
    return profile.model_copy(
        update={
            "peak_tflops": profile.peak_tflops / scale,
            **{n: e * scale for n, e in zip(names, effs, strict=True)},
        }
    )
