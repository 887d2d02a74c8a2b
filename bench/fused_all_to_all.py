"""Fused variable all-to-all vs the two-pass alternative, on 16 forked gloo ranks (2 x 8).

    .venv/bin/python bench/fused_all_to_all.py [--reps 30] [--tokens-per-rank 1536]
    # GPUs (NCCL, one process per GPU; nodes x GPUs per node taken from torchrun):
    torchrun --nproc-per-node 8 bench/fused_all_to_all.py --device cuda

For one full layer's exchanges (``to_full`` before attention, ``to_child`` after) on the same
Q/K/V data and the same real plan:

* fused: ONE ``all_to_all_single`` per direction with the plan's split sizes (token move and head
  exchange together), as the runtime does;
* two-pass: a separate redistribution of whole token rows (all heads) from the child layout to a
  uniform sequence-sharded parent layout, then the ordinary uniform Ulysses all-to-all; and the
  reverse (Ulysses back, then redistribution back to the child layout) after attention.

Bytes are those leaving each rank (self-copies excluded), summed over ranks, split into intra-
and inter-node. Time per repetition is the slowest rank's (a collective ends with its last
rank), percentiles over repetitions of one run, fused and two-pass interleaved. The script
checks that every variant gives identical tensors; it never asserts times.

Allocations: a ``TorchDispatchMode`` counts every tensor an op returns that aliases no input
(``torch.empty``, ``cat``, a copying ``reshape``, the receive buffer ...) with more than zero
elements, on each rank, for ``to_full`` forward, and for the whole layer's exchanges forward
+ backward; ``copy_`` into an existing buffer is counted as copied bytes, not an allocation.
Variants: fused with the send buffer written once into a reused buffer (the runtime's
default), fused with the older cat-and-reshape packing, and two-pass (its head exchange packed
like the default fused path).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from runtime_client.all_to_all import (
    fused_sequence_to_heads,
    heads_to_sequence,
    kv_heads_per_rank,
    sequence_to_heads,
    variable_all_to_all,
)
from runtime_client.exchange_buffers import ExchangeBuffers
from runtime_client.groups import GroupConfig, RepackGroups, init_distributed
from runtime_client.local_launch import run_local_ranks
from runtime_client.local_layout import GroupSite, LocalLayout, sequence_to_heads_site, split_tokens
from solver.planner import plan
from solver.schema import Plan, PlanRequest

WORLD, GPUS = 16, 8
HEADS, KV_HEADS, HEAD_DIM = 16, 4, 32
BYTES = 4  # float32


@dataclass(frozen=True)
class Scenario:
    name: str
    plan: Plan


def redistribution_site(ranks: tuple[int, int], owned: list[int], index: int) -> GroupSite:
    """Child layout -> uniform layout inside a parent: send the overlaps of token ranges."""
    uniform = split_tokens(sum(owned), len(owned))
    starts = [sum(owned[:i]) for i in range(len(owned))]
    ustarts = [sum(uniform[:i]) for i in range(len(uniform))]

    def overlap(a: int, n: int, b: int, m: int) -> int:
        return max(0, min(a + n, b + m) - max(a, b))

    send = [overlap(starts[index], owned[index], ustarts[j], uniform[j]) for j in range(len(owned))]
    recv = [overlap(starts[j], owned[j], ustarts[index], uniform[index]) for j in range(len(owned))]
    return GroupSite(
        ranks=ranks, index=index, input_split_sizes=tuple(send), output_split_sizes=tuple(recv)
    )


def off_rank_bytes(site: GroupSite, row_bytes: int, rank: int, gpus: int) -> tuple[int, int]:
    """(intra-node, inter-node) bytes this rank sends in one exchange."""
    intra = inter = 0
    for j, rows in enumerate(site.input_split_sizes):
        dest = site.ranks[0] + j
        if dest == rank:
            continue
        if dest // gpus == rank // gpus:
            intra += rows * row_bytes
        else:
            inter += rows * row_bytes
    return intra, inter


class AllocationCounter(TorchDispatchMode):
    """Counts fresh (non-aliasing, non-empty) op outputs and bytes written by ``copy_``."""

    def __init__(self) -> None:
        super().__init__()
        self.allocations = 0
        self.allocated_bytes = 0
        self.copied_bytes = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func.__name__.startswith("copy_"):
            self.copied_bytes += args[0].numel() * args[0].element_size()
        values = out if isinstance(out, tuple | list) else (out,)
        for ret, value in zip(func._schema.returns, values, strict=False):
            if ret.alias_info is not None:
                continue
            for t in value if isinstance(value, list | tuple) else (value,):
                if isinstance(t, torch.Tensor) and t.numel() > 0:
                    self.allocations += 1
                    self.allocated_bytes += t.numel() * t.element_size()
        return out


def _counted(fn: Callable[[], Any]) -> tuple[int, int, int]:
    """(allocations, MB allocated x 1e3, KB copied) of one call; KB keeps integers exact."""
    with AllocationCounter() as counter:
        fn()
    return counter.allocations, counter.allocated_bytes, counter.copied_bytes


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # host waits for the GPU: the time includes the kernels


def _timed(fn: Callable[[], object], device: torch.device) -> float:
    dist.barrier()
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    elapsed = torch.tensor([time.perf_counter() - t0], device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the exchange ends with its slowest rank
    return float(elapsed.item())


VARIANTS = ("fused", "fused, cat packing", "two-pass")


@dataclass(frozen=True)
class Result:
    name: str
    seconds: dict[str, list[float]]
    """Per variant, the slowest rank's time per repetition."""

    megabytes: list[float]
    """Fused intra, fused inter, two-pass intra, two-pass inter (MB, all ranks)."""

    allocations: dict[str, list[float]]
    """Per variant: mean per rank of [to_full fwd allocations, fwd MB, layer fwd+bwd
    allocations, fwd+bwd MB, fwd+bwd MB copied by copy_]."""


def _measure(
    rank: int, sc: Scenario, groups: RepackGroups, reps: int, device: torch.device, gpus: int
) -> Result:
    lay = LocalLayout.from_plan(sc.plan, rank)
    group = groups.group(lay.parent_ranks)
    p, index = lay.to_full.size, lay.to_full.index
    owned = list(lay.to_full.output_split_sizes)
    redist = redistribution_site(lay.parent_ranks, owned, index)
    uniform = sequence_to_heads_site(lay.parent_ranks, split_tokens(sum(owned), p), index)
    gen = torch.Generator().manual_seed(rank)
    q, k, v = (  # tensors; variants are named `var` below
        torch.randn(lay.n_local, h, HEAD_DIM, generator=gen).to(device).requires_grad_()
        for h in (HEADS, KV_HEADS, KV_HEADS)
    )
    buffers = ExchangeBuffers()

    def fused_to_full() -> tuple[torch.Tensor, ...]:
        return fused_sequence_to_heads(q, k, v, lay.to_full, group, buffers).wait()

    def cat_to_full() -> tuple[torch.Tensor, ...]:
        return sequence_to_heads(q, k, v, lay.to_full, group)

    def two_pass_to_full() -> tuple[torch.Tensor, ...]:
        moved = variable_all_to_all(torch.cat([q, k, v], dim=1), redist, group)  # pass 1: tokens
        mq, mk, mv = moved.split([HEADS, KV_HEADS, KV_HEADS], dim=1)
        # pass 2: heads, with the same one-copy packing as the fused path (a fair comparison)
        return fused_sequence_to_heads(mq, mk, mv, uniform, group, buffers).wait()

    def layer(variant: str, backward: bool) -> tuple[torch.Tensor, ...]:
        """One full layer's exchanges: to_full, (attention elided), to_child."""
        if variant == "two-pass":
            out = two_pass_to_full()
            o_uniform = heads_to_sequence(out[0], uniform.transposed(), group)
            back = variable_all_to_all(o_uniform, redist.transposed(), group)
        else:
            out = fused_to_full() if variant == "fused" else cat_to_full()
            back = heads_to_sequence(out[0], lay.to_child, group)
        if backward:
            (back.sum() + out[1].sum() + out[2].sum()).backward()
        return (*out, back)

    results = {var: layer(var, backward=False) for var in VARIANTS}  # warm-up; same tensors?
    for var in VARIANTS:
        got = [x.detach() for x in results[var]]
        want = [x.detach() for x in results["fused"]]
        assert all(torch.equal(x, y) for x, y in zip(got, want, strict=True)), (sc.name, var)
    assert torch.equal(results["fused"][3].detach(), q.detach())
    allocations = {}
    for var in VARIANTS:
        to_full = {"fused": fused_to_full, "fused, cat packing": cat_to_full}.get(
            var, two_pass_to_full
        )
        fwd_n, fwd_b, _ = _counted(to_full)
        all_n, all_b, copied = _counted(lambda var=var: layer(var, backward=True))
        allocations[var] = [fwd_n, fwd_b / 1e6, all_n, all_b / 1e6, copied / 1e6]
    seconds: dict[str, list[float]] = {var: [] for var in VARIANTS}
    with torch.no_grad():
        for _ in range(reps):  # interleaved, so drift hits every variant alike
            for var in VARIANTS:
                seconds[var].append(_timed(lambda var=var: layer(var, backward=False), device))
    fused_row = (HEADS // p + 2 * kv_heads_per_rank(KV_HEADS, p)) * HEAD_DIM * BYTES
    back_row = (HEADS // p) * HEAD_DIM * BYTES
    fused_b = [
        off_rank_bytes(lay.to_full, fused_row, rank, gpus),
        off_rank_bytes(lay.to_child, back_row, rank, gpus),
    ]
    two_b = [
        off_rank_bytes(redist, (HEADS + 2 * KV_HEADS) * HEAD_DIM * BYTES, rank, gpus),
        off_rank_bytes(uniform, fused_row, rank, gpus),
        off_rank_bytes(uniform.transposed(), back_row, rank, gpus),
        off_rank_bytes(redist.transposed(), HEADS * HEAD_DIM * BYTES, rank, gpus),
    ]
    totals = torch.tensor(
        [
            sum(x for x, _ in fused_b),
            sum(y for _, y in fused_b),
            sum(x for x, _ in two_b),
            sum(y for _, y in two_b),
            *(x for var in VARIANTS for x in allocations[var]),
        ],
        dtype=torch.float64,
        device=device,
    )
    dist.all_reduce(totals)
    world = dist.get_world_size()
    flat = totals.tolist()
    per_variant = {
        var: [x / world for x in flat[4 + 5 * i : 9 + 5 * i]] for i, var in enumerate(VARIANTS)
    }
    return Result(sc.name, seconds, [x / 1e6 for x in flat[:4]], per_variant)


def _worker(
    rank: int, world: int, scenarios: list[Scenario], reps: int, device: str, gpus: int
) -> list[Result]:
    groups = RepackGroups(GroupConfig(world_size=world, gpus_per_node=gpus)).setup()
    return [_measure(rank, sc, groups, reps, torch.device(device), gpus) for sc in scenarios]


def _request(
    mode: str, sizes: list[int], tokens_per_rank: int, seed: int, world: int, gpus: int
) -> PlanRequest:
    rng = random.Random(seed)
    budget = world * tokens_per_rank * 3 // 4
    lengths: list[int] = []
    while True:
        n = rng.choice([rng.randint(16, 256), rng.randint(256, 2048), rng.randint(2048, 12000)])
        if sum(lengths) + n > budget:
            break
        lengths.append(min(n, gpus * tokens_per_rank))
    return PlanRequest.model_validate(
        {
            "cluster": {
                "nodes": max(1, world // gpus),
                "gpus_per_node": gpus,
                "max_tokens_per_rank": tokens_per_rank,
            },
            # A small MoE (1e6 active params) so that sparse layers are cheap enough for the
            # planner to use small and empty children: the uneven layouts the fused path is for.
            "model": {
                "heads": HEADS,
                "kv_heads": KV_HEADS,
                "head_dim": HEAD_DIM,
                "hidden": 512,
                "sparse_window": 512,
                "moe_active_params": 1e6,
            },
            "lengths": lengths,
            "parent_sizes": sizes,
            "mode": mode,
        }
    )


def _pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[int(q) - 1] if q < 100 else max(xs)


def _scenarios(tokens_per_rank: int, world: int, gpus: int) -> list[Scenario]:
    scenarios = []
    for name, mode, seed in (
        ("repack+parent", "repack+parent", 1),
        ("repack+parent", "repack+parent", 2),
        ("repack+parent", "repack+parent", 4),
        ("baseline", "baseline", 2),
    ):
        p = plan(_request(mode, [world], tokens_per_rank, seed, world, gpus))
        children = sorted((c.ranks[1] - c.ranks[0] for c in p.children), reverse=True)
        empty = sum(1 for c in p.children if not c.samples)
        label = f"P{world} {name} {children}" + (f", {empty} empty" if empty else "")
        scenarios.append(Scenario(f"{label}; tokens/rank {min(p.tokens)}-{max(p.tokens)}", p))
    return scenarios


def _print(rows: list[Result], header: str) -> None:
    print(header)
    print(
        "| layout (children) | fused MB intra/inter | two-pass MB intra/inter | "
        "p50 ms fused / cat packing / two-pass | two-pass / fused p50 (p10-p90) |"
    )
    print("|" + "---|" * 5)
    for r in rows:
        fi, fx, ti, tx = r.megabytes
        f_s, t_s = r.seconds["fused"], r.seconds["two-pass"]
        ratios = [t / f for t, f in zip(t_s, f_s, strict=True)]
        p50 = " / ".join(f"{_pct(r.seconds[v], 50) * 1e3:.1f}" for v in VARIANTS)
        print(
            f"| {r.name} | {fi:.1f} / {fx:.1f} | {ti:.1f} / {tx:.1f} | {p50} | "
            f"{_pct(ratios, 50):.2f} ({_pct(ratios, 10):.2f}-{_pct(ratios, 90):.2f}) |"
        )
    print()
    print(
        "| layout | variant | to_full fwd: allocations / MB | layer fwd+bwd: allocations / MB "
        "| fwd+bwd MB copied into existing tensors |"
    )
    print("|" + "---|" * 5)
    for r in rows:
        for v in VARIANTS:
            fwd_n, fwd_mb, all_n, all_mb, copied = r.allocations[v]
            print(
                f"| {r.name.split(';')[0]} | {v} | {fwd_n:.1f} / {fwd_mb:.2f} | "
                f"{all_n:.1f} / {all_mb:.2f} | {copied:.2f} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--tokens-per-rank", type=int, default=1536)
    parser.add_argument(
        "--device",
        default="cpu",
        choices=["cpu", "cuda"],
        help="cpu: 16 forked gloo ranks; cuda: NCCL under torchrun, one GPU per process",
    )
    args = parser.parse_args()
    if args.device == "cuda":
        if "RANK" not in os.environ:
            parser.error("--device cuda runs under torchrun (one process per GPU)")
        device = init_distributed()
        world, gpus = dist.get_world_size(), int(os.environ.get("LOCAL_WORLD_SIZE", GPUS))
        scenarios = _scenarios(args.tokens_per_rank, world, gpus)
        rows = _worker(dist.get_rank(), world, scenarios, args.reps, str(device), gpus)
        if dist.get_rank() != 0:
            return
        backend = f"{world} NCCL ranks ({world // gpus} x {gpus})"
    else:
        world, gpus = WORLD, GPUS
        scenarios = _scenarios(args.tokens_per_rank, world, gpus)
        rows = run_local_ranks(_worker, world, scenarios, args.reps, "cpu", gpus, timeout_s=1800)[0]
        backend = f"{world} gloo ranks ({world // gpus} nodes x {gpus}, one CPU host)"
    _print(
        rows,
        f"{backend}, heads {HEADS}, kv_heads {KV_HEADS}, head_dim {HEAD_DIM}, float32, "
        f"{args.reps} reps; to_full + to_child of one full layer (allocations: mean per rank)",
    )


if __name__ == "__main__":
    main()
