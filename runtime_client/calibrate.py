"""Calibration measurements on the user's machines: all-to-all per group size, model parts.

Run on every rank of an initialised process group (``repack calibrate`` under torchrun, or
``run_local_ranks`` in tests). All-to-alls run the way a step runs them: every aligned block of
``k`` ranks exchanges at the same time, so a node's link is shared as it is in training.
Model parts run on every rank at once too (a node's cores or memory bandwidth are shared) and
the median over ranks is kept. Times are wall clock after warm-up; on GPUs every timed region
ends with ``torch.cuda.synchronize`` (the only host-device syncs here, on purpose).
"""

from __future__ import annotations

import functools
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from runtime_client.calibration_steps import StepPlanConfig, measure_steps
from runtime_client.groups import GroupConfig, RepackGroups
from runtime_client.toy_model import Block, ToyConfig, varlen_attention
from solver.calibration_profile import AllToAllPoint, ComputePoint, timed_model_spec
from solver.profile_feedback import Observation


@dataclass(kw_only=True, frozen=True)
class CalibrationConfig:
    """What to measure (defaults: small enough for 4 CPU ranks in a test)."""

    gpus_per_node: int
    """Ranks per node; groups wider than this cross nodes."""

    group_sizes: tuple[int, ...] | None = None
    """All-to-all group sizes; None = every power of two from 2 to the world size."""

    payload_tokens: tuple[int, ...] = (256, 1024, 4096)
    """Tokens per rank in the all-to-all payloads (each ``width`` elements wide)."""

    width: int = 64
    """Elements per token in the all-to-all payload."""

    lengths: tuple[int, ...] = (64, 128, 256, 512)
    """Sample lengths at which the model's parts are timed."""

    repeats: int = 5
    """Timed repetitions per point (the median is kept)."""

    pack: int = 8
    """Attention is also timed on ``pack`` samples of ``length / pack`` tokens packed together,
    which separates a fixed cost per sample from the cost per FLOP (1: single samples only)."""

    warmup: int = 2
    """Untimed repetitions first (allocator, first-call costs)."""

    model: ToyConfig = field(default_factory=ToyConfig)
    """The model whose layers are timed."""

    statistic: str = "median"
    """How repetitions become one time: ``median`` (typical, the default) or ``min`` (best
    case: on a machine shared with other work, the least disturbed repetition)."""

    steps: int = 0
    """Whole training steps of the model timed at the end (``runtime_client.calibration_steps``),
    to which the per-collective latency, compute scale and fixed per-layer time are fitted;
    0 = parts only."""

    step_tokens_per_rank: int = 128
    """``max_tokens_per_rank`` of those steps."""

    step_repeats: int = 3
    """Runs of each step (the least disturbed kept)."""

    def __post_init__(self) -> None:
        if self.repeats < 1 or self.warmup < 0:
            raise ValueError(
                f"Expected repeats >= 1 and warmup >= 0, got {self.repeats}, {self.warmup}."
            )
        if len(self.lengths) < 2 or min(self.lengths) < 1:
            raise ValueError(f"Expected >= 2 positive lengths, got {self.lengths}.")
        if self.statistic not in STATISTICS:
            raise ValueError(f"Expected statistic in {sorted(STATISTICS)}, got {self.statistic!r}.")
        if len(self.payload_tokens) < 2 or min(self.payload_tokens) < 1:
            raise ValueError(f"Expected >= 2 positive payload sizes, got {self.payload_tokens}.")
        if self.steps < 0 or self.step_tokens_per_rank < 1 or self.step_repeats < 1:
            raise ValueError(
                f"Expected steps >= 0, step_tokens_per_rank >= 1 and step_repeats >= 1, got "
                f"{self.steps}, {self.step_tokens_per_rank}, {self.step_repeats}."
            )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # host-device sync: the timer must see the kernels end


STATISTICS: dict[str, Callable[[list[float]], float]] = {"median": statistics.median, "min": min}


def _time(
    fn: Callable[[], object],
    repeats: int,
    warmup: int,
    device: torch.device,
    statistic: str = "median",
) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return STATISTICS[statistic](times)


def group_sizes(config: CalibrationConfig, world: int) -> list[int]:
    if config.group_sizes is not None:
        return [k for k in config.group_sizes if 1 < k <= world]
    return [1 << i for i in range(1, world.bit_length()) if (1 << i) <= world]


def measure_all_to_all(
    config: CalibrationConfig, groups: RepackGroups, device: torch.device
) -> list[AllToAllPoint]:
    """Time one ``all_to_all_single`` per group size and payload; slowest rank per point."""
    rank, world = dist.get_rank(), dist.get_world_size()
    points = []
    for k in group_sizes(config, world):
        start = rank // k * k
        group = groups.group((start, start + k))
        for tokens in config.payload_tokens:
            n = tokens // k * k  # equal splits
            x_TW = torch.randn(n, config.width, device=device)
            out_TW = torch.empty_like(x_TW)

            dist.barrier()
            own = _time(
                functools.partial(dist.all_to_all_single, out_TW, x_TW, group=group),
                config.repeats,
                config.warmup,
                device,
                config.statistic,
            )
            slowest = torch.tensor([own], dtype=torch.float64)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            points.append(
                AllToAllPoint(
                    group=k,
                    gpus_per_node=config.gpus_per_node,
                    bytes_per_rank=float(n * config.width * x_TW.element_size()),
                    seconds=float(slowest.item()),
                )
            )
    return points


class _NoAttention:
    """A backend that skips attention: what is left of a block is its linear and MoE work."""

    def full(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return q

    def sparse(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int
    ) -> torch.Tensor:
        return q


def _fwd_bwd(fn: Callable[[], torch.Tensor]) -> Callable[[], None]:
    def run() -> None:
        fn().sum().backward()

    return run


def measure_compute(config: CalibrationConfig, device: torch.device) -> list[ComputePoint]:
    """Forward + backward time of each part of one layer on one sample of each length, and of
    attention on ``config.pack`` shorter samples packed to the same length."""
    cfg = config.model
    torch.manual_seed(0)
    block = Block(cfg, "S").to(device)
    points = []
    for length in config.lengths:
        q_LHD = torch.randn(length, cfg.heads, cfg.head_dim, device=device, requires_grad=True)
        k_LKD = torch.randn(length, cfg.kv_heads, cfg.head_dim, device=device, requires_grad=True)
        v_LKD = torch.randn(length, cfg.kv_heads, cfg.head_dim, device=device, requires_grad=True)
        x_LD = torch.randn(length, cfg.hidden, device=device, requires_grad=True)
        pos_L = torch.arange(length, device=device)
        timed: list[tuple[str, int, Callable[[], torch.Tensor]]] = [
            ("linear", 1, functools.partial(block, x_LD, pos_L, _NoAttention()))
        ]
        packs = sorted({1, config.pack}) if length >= 2 * config.pack else [1]
        for n in packs:
            cu = [i * (length // n) for i in range(n)] + [length]  # the last takes the rest
            for part, window in (("full_attention", None), ("sparse_attention", cfg.window)):
                attn = functools.partial(varlen_attention, q_LHD, k_LKD, v_LKD, cu, window)
                timed.append((part, n, attn))
        for part, n, fn in timed:
            seconds = _time(_fwd_bwd(fn), config.repeats, config.warmup, device, config.statistic)
            points.append(ComputePoint(part=part, length=length // n, samples=n, seconds=seconds))
    return points


def measure_peak_tflops(device: torch.device, n: int = 512, repeats: int = 5) -> float:
    """Dense matmul rate of this device (the profile's ``peak_tflops`` on a CPU, which has no
    datasheet number the cost model could use)."""
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    seconds = _time(functools.partial(torch.matmul, a, b), repeats, 1, device, "min")
    return 2 * n**3 / seconds / 1e12


def _median_over_ranks(points: list[ComputePoint]) -> list[ComputePoint]:
    gathered: list[list[ComputePoint] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, points)
    out = []
    for i, p in enumerate(points):
        times = [g[i].seconds for g in gathered if g is not None]
        median = statistics.median(times)
        out.append(ComputePoint(part=p.part, length=p.length, samples=p.samples, seconds=median))
    return out


@dataclass(frozen=True)
class Measurements:
    """Everything ``repack calibrate`` measured (identical on every rank)."""

    world_size: int
    gpus_per_node: int
    peak_tflops: float
    all_to_all: list[AllToAllPoint]
    compute: list[ComputePoint]
    steps: list[Observation] = field(default_factory=list)
    """Timed whole steps (request, plan, step and all-to-all seconds; max over ranks)."""


def run_calibration(config: CalibrationConfig, device: torch.device | None = None) -> Measurements:
    """Measure on every rank of the default group; collective, every rank must call it."""
    device = device or torch.device("cpu")
    world = dist.get_world_size()
    groups = RepackGroups(GroupConfig(world_size=world, gpus_per_node=config.gpus_per_node)).setup()
    a2a = measure_all_to_all(config, groups, device)
    dist.barrier()
    compute = _median_over_ranks(measure_compute(config, device))
    peak = torch.tensor([measure_peak_tflops(device)], dtype=torch.float64)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    steps: list[Observation] = []
    if config.steps:
        if device.type != "cpu":
            raise ValueError("Timed calibration steps run the toy model on CPU ranks only.")
        cluster, model = timed_model_spec(config.model, world, config.gpus_per_node)
        cluster = cluster.model_copy(update={"max_tokens_per_rank": config.step_tokens_per_rank})
        plans = StepPlanConfig(steps=config.steps, tokens_per_rank=config.step_tokens_per_rank)
        steps = measure_steps(
            config.model, cluster, model, groups, plans, repeats=config.step_repeats
        )
    return Measurements(
        world_size=world,
        gpus_per_node=config.gpus_per_node,
        peak_tflops=float(peak.item()),
        all_to_all=a2a,
        compute=compute,
        steps=steps,
    )


def _calibrate_rank(rank: int, world: int, config: CalibrationConfig) -> Measurements:
    return run_calibration(config)


def measure_on_local_ranks(config: CalibrationConfig, ranks: int) -> Measurements:
    """Start ``ranks`` local gloo processes (``fork``), measure, return rank 0's result."""
    from runtime_client.local_launch import run_local_ranks

    results: list[Measurements] = run_local_ranks(_calibrate_rank, ranks, config)
    return results[0]


def measure_under_launcher(config: CalibrationConfig, backend: str) -> Measurements | None:
    """Join the launcher's job (torchrun's environment), measure; rank 0 gets the result."""
    from runtime_client.groups import init_distributed

    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    init_distributed(backend=backend, timeout_s=600)
    try:
        measured = run_calibration(config, device)
    finally:
        dist.barrier()
        dist.destroy_process_group()
    return measured if int(os.environ.get("RANK", "0")) == 0 else None
