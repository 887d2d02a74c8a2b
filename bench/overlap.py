"""Does ``RepackComm.to_full_async`` overlap the exchange with independent compute?

    .venv/bin/python bench/overlap.py [--ranks 4] [--tokens 4096] [--reps 20]
    torchrun --nproc-per-node 8 bench/overlap.py --device cuda     # GPUs, NCCL

Each rank times (slowest rank per repetition, percentiles over repetitions, variants
interleaved): the ``to_full`` exchange alone, an independent matmul alone, the two one after
the other (synchronous), and the exchange started with ``async_op=True``, the matmul, then
``wait()``. Overlap shows as async < sync; the best possible is max(exchange, compute). On a
CPU host gloo's worker thread and the matmul compete for the same cores, so expect little
here; the number that matters is the GPU one. Never asserts times.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from runtime_client.all_to_all import fused_sequence_to_heads
from runtime_client.exchange_buffers import ExchangeBuffers
from runtime_client.groups import collective_device, init_distributed
from runtime_client.local_launch import run_local_ranks
from runtime_client.local_layout import sequence_to_heads_site, split_tokens

HEADS, KV_HEADS, HEAD_DIM, HIDDEN = 16, 4, 64, 256
VARIANTS = ("exchange", "compute", "sync", "async")


def _timed(fn: Callable[[], object], device: torch.device) -> float:
    dist.barrier()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # the host waits for the GPU: kernels included
    elapsed = torch.tensor([time.perf_counter() - t0], device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed.item())


def _worker(rank: int, world: int, tokens: int, reps: int) -> dict[str, list[float]]:
    device = collective_device()
    owned = split_tokens(tokens, world)
    site = sequence_to_heads_site((0, world), owned, rank)
    group = dist.group.WORLD
    gen = torch.Generator().manual_seed(rank)
    n = owned[rank]
    q, k, v = (
        torch.randn(n, h, HEAD_DIM, generator=gen).to(device) for h in (HEADS, KV_HEADS, KV_HEADS)
    )
    x_ND = torch.randn(n, HIDDEN, generator=gen).to(device)
    w_DD = torch.randn(HIDDEN, HIDDEN, generator=gen).to(device)
    buffers = ExchangeBuffers()

    def exchange() -> object:
        return fused_sequence_to_heads(q, k, v, site, group, buffers).wait()

    def compute() -> object:
        return x_ND @ w_DD @ w_DD  # stands for the next projection: independent of the exchange

    def sync() -> object:
        return exchange(), compute()

    def overlapped() -> object:
        pending = fused_sequence_to_heads(q, k, v, site, group, buffers, async_op=True)
        y = compute()
        return pending.wait(), y

    fns = {"exchange": exchange, "compute": compute, "sync": sync, "async": overlapped}
    with torch.no_grad():
        for fn in fns.values():
            fn()  # warm-up
        times: dict[str, list[float]] = {name: [] for name in VARIANTS}
        for _ in range(reps):
            for name in VARIANTS:
                times[name].append(_timed(fns[name], device))
    return times


def _p(xs: list[float], q: int) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1] * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args()
    if args.device == "cuda":
        if "RANK" not in os.environ:
            parser.error("--device cuda runs under torchrun (one process per GPU)")
        init_distributed()
        times = _worker(dist.get_rank(), dist.get_world_size(), args.tokens, args.reps)
        if dist.get_rank() != 0:
            return
        label = f"{dist.get_world_size()} NCCL ranks"
    else:
        times = run_local_ranks(_worker, args.ranks, args.tokens, args.reps, timeout_s=600)[0]
        label = f"{args.ranks} gloo ranks on one CPU host"
    print(f"{label}, {args.tokens} tokens, {args.reps} reps (ms, slowest rank)")
    print("| variant | p10 | p50 | p90 |\n|---|---|---|---|")
    for name in VARIANTS:
        print(
            f"| {name} | {_p(times[name], 10):.1f} | {_p(times[name], 50):.1f} | "
            f"{_p(times[name], 90):.1f} |"
        )
    ratio = [a / s for a, s in zip(times["async"], times["sync"], strict=True)]
    print(f"async / sync p50 {statistics.median(ratio):.2f}")


if __name__ == "__main__":
    main()
