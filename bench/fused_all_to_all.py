"""Fused variable all-to-all vs the two-pass alternative, on 16 forked gloo ranks (2 x 8).

    .venv/bin/python bench/fused_all_to_all.py [--reps 30] [--tokens-per-rank 1024]

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
checks that both give identical tensors; it never asserts times.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from runtime_client.all_to_all import (
    heads_to_sequence,
    kv_heads_per_rank,
    sequence_to_heads,
    variable_all_to_all,
)
from runtime_client.groups import GroupConfig, RepackGroups
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


def off_rank_bytes(site: GroupSite, row_bytes: int, rank: int) -> tuple[int, int]:
    """(intra-node, inter-node) bytes this rank sends in one exchange."""
    intra = inter = 0
    for j, rows in enumerate(site.input_split_sizes):
        dest = site.ranks[0] + j
        if dest == rank:
            continue
        if dest // GPUS == rank // GPUS:
            intra += rows * row_bytes
        else:
            inter += rows * row_bytes
    return intra, inter


def _timed(fn: Callable[[], object]) -> float:
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    elapsed = torch.tensor([time.perf_counter() - t0])
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the exchange ends with its slowest rank
    return float(elapsed.item())


@dataclass(frozen=True)
class Result:
    name: str
    fused_s: list[float]
    two_pass_s: list[float]
    megabytes: list[float]
    """Fused intra, fused inter, two-pass intra, two-pass inter (MB, all ranks)."""


def _measure(rank: int, sc: Scenario, groups: RepackGroups, reps: int) -> Result:
    lay = LocalLayout.from_plan(sc.plan, rank)
    group = groups.group(lay.parent_ranks)
    p, index = lay.to_full.size, lay.to_full.index
    owned = list(lay.to_full.output_split_sizes)
    redist = redistribution_site(lay.parent_ranks, owned, index)
    uniform = sequence_to_heads_site(lay.parent_ranks, split_tokens(sum(owned), p), index)
    gen = torch.Generator().manual_seed(rank)
    q = torch.randn(lay.n_local, HEADS, HEAD_DIM, generator=gen)
    k = torch.randn(lay.n_local, KV_HEADS, HEAD_DIM, generator=gen)
    v = torch.randn(lay.n_local, KV_HEADS, HEAD_DIM, generator=gen)

    def fused() -> tuple[torch.Tensor, ...]:
        out = sequence_to_heads(q, k, v, lay.to_full, group)
        back = heads_to_sequence(out[0].contiguous(), lay.to_child, group)
        return (*out, back)

    def two_pass() -> tuple[torch.Tensor, ...]:
        moved = variable_all_to_all(torch.cat([q, k, v], dim=1), redist, group)  # pass 1: tokens
        mq, mk, mv = moved.split([HEADS, KV_HEADS, KV_HEADS], dim=1)
        out = sequence_to_heads(mq, mk, mv, uniform, group)  # pass 2: heads
        o_uniform = heads_to_sequence(out[0].contiguous(), uniform.transposed(), group)
        back = variable_all_to_all(o_uniform, redist.transposed(), group)
        return (*out, back)

    a, b = fused(), two_pass()  # warm-up, and proof that both compute the same thing
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True)), sc.name
    assert torch.equal(a[3], q)
    t_fused, t_two = [], []
    for _ in range(reps):  # interleaved, so drift hits both alike
        t_fused.append(_timed(fused))
        t_two.append(_timed(two_pass))
    fused_row = (HEADS // p + 2 * kv_heads_per_rank(KV_HEADS, p)) * HEAD_DIM * BYTES
    back_row = (HEADS // p) * HEAD_DIM * BYTES
    fused_b = [
        off_rank_bytes(lay.to_full, fused_row, rank),
        off_rank_bytes(lay.to_child, back_row, rank),
    ]
    two_b = [
        off_rank_bytes(redist, (HEADS + 2 * KV_HEADS) * HEAD_DIM * BYTES, rank),
        off_rank_bytes(uniform, fused_row, rank),
        off_rank_bytes(uniform.transposed(), back_row, rank),
        off_rank_bytes(redist.transposed(), HEADS * HEAD_DIM * BYTES, rank),
    ]
    totals = torch.tensor(
        [
            sum(x for x, _ in fused_b),
            sum(y for _, y in fused_b),
            sum(x for x, _ in two_b),
            sum(y for _, y in two_b),
        ],
        dtype=torch.float64,
    )
    dist.all_reduce(totals)
    return Result(sc.name, t_fused, t_two, [x / 1e6 for x in totals.tolist()])


def _worker(rank: int, world: int, scenarios: list[Scenario], reps: int) -> list[Result]:
    groups = RepackGroups(GroupConfig(world_size=world, gpus_per_node=GPUS)).setup()
    return [_measure(rank, sc, groups, reps) for sc in scenarios]


def _request(mode: str, sizes: list[int], tokens_per_rank: int, seed: int) -> PlanRequest:
    rng = random.Random(seed)
    budget = WORLD * tokens_per_rank * 3 // 4
    lengths: list[int] = []
    while True:
        n = rng.choice([rng.randint(16, 256), rng.randint(256, 2048), rng.randint(2048, 12000)])
        if sum(lengths) + n > budget:
            break
        lengths.append(min(n, GPUS * tokens_per_rank))
    return PlanRequest.model_validate(
        {
            "cluster": {"nodes": 2, "gpus_per_node": GPUS, "max_tokens_per_rank": tokens_per_rank},
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--tokens-per-rank", type=int, default=1536)
    args = parser.parse_args()
    scenarios = []
    for name, mode, sizes, seed in (
        ("P16 repack+parent", "repack+parent", [16], 1),
        ("P16 repack+parent", "repack+parent", [16], 2),
        ("P16 repack+parent", "repack+parent", [16], 4),
        ("P16 baseline", "baseline", [16], 2),
    ):
        p = plan(_request(mode, sizes, args.tokens_per_rank, seed))
        children = sorted((c.ranks[1] - c.ranks[0] for c in p.children), reverse=True)
        empty = sum(1 for c in p.children if not c.samples)
        label = f"{name} {children}" + (f", {empty} empty" if empty else "")
        scenarios.append(Scenario(f"{label}; tokens/rank {min(p.tokens)}-{max(p.tokens)}", p))
    rows = run_local_ranks(_worker, WORLD, scenarios, args.reps, timeout_s=1200)[0]
    print(
        f"16 gloo ranks (2 nodes x 8, one CPU host), heads {HEADS}, kv_heads {KV_HEADS}, "
        f"head_dim {HEAD_DIM}, float32, {args.reps} reps; to_full + to_child of one full layer"
    )
    head = (
        "| layout (children) | fused MB intra/inter | two-pass MB intra/inter | "
        "fused p50 / p90 ms | two-pass p50 / p90 ms | time ratio p50 (p10-p90) |"
    )
    print(head)
    print("|" + "---|" * 6)
    for r in rows:
        fi, fx, ti, tx = r.megabytes
        f_s, t_s = r.fused_s, r.two_pass_s
        ratios = [t / f for t, f in zip(t_s, f_s, strict=True)]
        print(
            f"| {r.name} | {fi:.1f} / {fx:.1f} | {ti:.1f} / {tx:.1f} | "
            f"{_pct(f_s, 50) * 1e3:.1f} / {_pct(f_s, 90) * 1e3:.1f} | "
            f"{_pct(t_s, 50) * 1e3:.1f} / {_pct(t_s, 90) * 1e3:.1f} | "
            f"{_pct(ratios, 50):.2f} ({_pct(ratios, 10):.2f}-{_pct(ratios, 90):.2f}) |"
        )


if __name__ == "__main__":
    main()
