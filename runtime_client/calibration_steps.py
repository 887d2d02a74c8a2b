"""Whole training steps timed during calibration: what the microbenchmarks cannot see.

The parts timed alone (``runtime_client.calibrate``) miss what only a real step has: a
collective entered by peers that arrive at different times (a descheduled process, a slower
kernel launch), the exchange's packing copies, the embedding, LM head, loss and gradient
all-reduce. On 4 gloo ranks sharing 2 cores a collective inside a step costs several times what
back-to-back calls measure, and the microbenchmark profile predicted steps ~50% short.

So calibration ends by training the timed model for a few steps through the real runtime path
(``RepackComm``, the fused variable all-to-all) on layouts that cover every group size: uniform
parents of each power-of-two size, unrepacked (``baseline``) and repacked (``repack``), and the
planner's own ``repack+sizing`` layouts. Their lengths come from their own generator (log-uniform,
40-90% full), not from any training trace. ``solver.profile_feedback.refit`` then fits the
compute scale, the per-collective latency and the fixed per-layer time to these steps.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from runtime_client.all_to_all import RepackComm
from runtime_client.groups import RepackGroups
from runtime_client.local_layout import LocalLayout, plan_lengths
from runtime_client.step_timer import StepTimer, TimedAttention
from runtime_client.toy_model import RepackAttention, ToyConfig, ToyModel, synthetic_batch
from solver.measurement_schema import StepMeasurement
from solver.planner import plan as solve
from solver.profile_feedback import Observation
from solver.schema import ClusterSpec, ModelSpec, Plan, PlanRequest

WARMUP_STEPS = 3
"""Steps run untimed first (one per parent size of a 4-rank world): allocator growth, first
calls into each communicator."""

LAYOUT_MODES = ("baseline", "repack+sizing", "repack", "repack+sizing")
"""Unrepacked uniform parents, the same parents repacked, and the planner's free layout."""


@dataclass(frozen=True, kw_only=True)
class StepPlanConfig:
    """Which synthetic steps to time."""

    steps: int
    tokens_per_rank: int
    """The cluster's ``max_tokens_per_rank`` for these steps."""
    seed: int = 0


def parent_sizes(world: int) -> list[int]:
    """Every power-of-two parent size up to the world (each a uniform tiling)."""
    return [1 << i for i in range(world.bit_length()) if world % (1 << i) == 0]


def step_request(
    cluster: ClusterSpec, model: ModelSpec, config: StepPlanConfig, index: int
) -> PlanRequest:
    """Step ``index``: uniform parents of one size (cycling through sizes, then modes), lengths
    log-uniform in [1, a parent's capacity], 40-90% of the cluster filled. Samples go to the
    least loaded parent they fit in (longest first); what fits nowhere is dropped."""
    world = cluster.world_size
    sizes = parent_sizes(world)
    size = sizes[index % len(sizes)]
    mode = LAYOUT_MODES[(index // len(sizes)) % len(LAYOUT_MODES)]
    rng = random.Random(config.seed * 1_000_003 + index)
    capacity = size * config.tokens_per_rank
    budget = int(world * config.tokens_per_rank * rng.uniform(0.4, 0.9))
    lengths: list[int] = []
    while sum(lengths) < budget:
        lengths.append(max(1, int(math.exp(rng.uniform(0.0, math.log(capacity))))))
    lengths.sort(reverse=True)
    load = [0] * (world // size)
    kept: list[int] = []
    parent_of: list[int] = []
    for n in lengths:
        j = min(range(len(load)), key=lambda p: (load[p], p))
        if load[j] + n <= capacity:
            load[j] += n
            kept.append(n)
            parent_of.append(j)
    body: dict[str, object] = {
        "cluster": cluster.model_dump(exclude={"profile"}),
        "model": model.model_dump(exclude={"profile"}),
        "lengths": kept,
        "mode": mode,
    }
    if mode != "repack+sizing":
        body |= {"parent_sizes": [size] * len(load), "parent_of": parent_of}
    return PlanRequest.model_validate(body)


def run_toy_step(
    toy: ToyModel,
    plan: Plan,
    rank: int,
    groups: RepackGroups,
    timer: StepTimer,
    *,
    seed: int,
    repeats: int = 1,
) -> StepMeasurement:
    """Forward, loss, backward and the gradient all-reduce of one step laid out by ``plan``
    (the optimizer step is not timed); run ``repeats`` times, the least disturbed run kept.
    Collective: every rank calls it with the same plan."""
    layout = LocalLayout.from_plan(plan, rank)
    tokens_T, labels_T = synthetic_batch(plan_lengths(plan), toy.cfg.vocab, seed=seed)
    backend = TimedAttention(RepackAttention(RepackComm(layout, groups)), timer)
    runs = []
    for _ in range(repeats):
        dist.barrier()
        timer.start()
        logits = toy(tokens_T[layout.global_index_N], layout.position_ids_N, backend)
        loss = F.cross_entropy(logits, labels_T[layout.global_index_N], reduction="sum")
        toy.zero_grad()
        loss.backward()
        grads = [p.grad for p in toy.parameters() if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])  # one bucket, as DDP would
        dist.all_reduce(flat)
        torch._utils._unflatten_dense_tensors(flat, grads)
        runs.append(timer.finish(plan.plan_id))
    return min(runs, key=lambda r: r.step_time_ms)


def measure_steps(
    model_config: ToyConfig,
    cluster: ClusterSpec,
    model: ModelSpec,
    groups: RepackGroups,
    config: StepPlanConfig,
    *,
    repeats: int = 3,
) -> list[Observation]:
    """Time ``config.steps`` synthetic steps of the toy model; identical on every rank.

    Rank 0 plans each step and broadcasts the plan, so every rank runs the same layout even if
    a plan's search were cut short differently on a loaded rank."""
    rank = dist.get_rank()
    torch.manual_seed(0)
    toy = ToyModel(model_config)
    pattern = model_config.pattern
    kinds = [pattern[i % len(pattern)] for i in range(model_config.layers)]
    timer = StepTimer().attach(toy.blocks, kinds)
    observations = []
    try:
        for index in range(-WARMUP_STEPS, config.steps):  # the first ones untimed: warm-up
            request = step_request(cluster, model, config, index)
            box: list[object] = [solve(request, use_cpsat=False) if rank == 0 else None]
            dist.broadcast_object_list(box, src=0)
            plan = box[0]
            assert isinstance(plan, Plan)
            m = run_toy_step(toy, plan, rank, groups, timer, seed=index, repeats=repeats)
            if index < 0:
                continue
            a2a_s = None if m.all_to_all_ms is None else m.all_to_all_ms / 1e3
            observations.append(Observation(request, plan, m.step_time_ms / 1e3, a2a_s))
    finally:
        timer.detach()
    return observations
