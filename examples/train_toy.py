"""Train the toy 1F3S hybrid model with Layerwise Repacking through ``RepackDataIterator``.

    torchrun --standalone --nproc-per-node 16 examples/train_toy.py --replicas 2 --steps 20 \\
        --service-url http://127.0.0.1:8000

The world is a ``DeviceMesh`` of ``--replicas`` data-parallel replicas x one repack domain each
(16 processes: 2 replicas of 8 ranks, each 2 "nodes" x 4). Every rank pulls its own packed batch
from a synthetic loader; the iterator all-gathers the lengths over its replica's domain, asks
the plan service for the step's plan ``--prefetch`` steps ahead (falling back to the in-process
planner when the service is unreachable, which it says), agrees on it, moves the samples to
their planned ranks with one all-to-all of token ids and yields the rank's tokens, position ids,
device ``cu_seqlens`` and the step's ``RepackComm``. The model runs full layers through the
fused all-to-all over the parent and sparse layers with Ulysses over the child, both with the
varlen attention adapters; gradients are all-reduced over the whole world. Every step's
measured times (step, forward+backward per layer kind, all-to-all; the slowest rank of the
replica) are posted to the service in the background (``--no-measurements``: not reported).

``--device cuda`` (one GPU per process, NCCL for the model, gloo for the iterator's host-side
traffic) is the path for GPU users; the default is CPU + gloo.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

from runtime_client.data_iterator import RepackBatch, RepackDataIterator, RepackLoaderConfig
from runtime_client.groups import GroupConfig, RepackGroups, init_distributed
from runtime_client.measurements import MeasurementReporter, ReporterConfig
from runtime_client.plan_client import PlanClient, PlanClientConfig
from runtime_client.step_timer import StepTimer
from runtime_client.toy_data import ToySampleSource
from runtime_client.toy_model import ToyConfig, ToyModel, VarlenRepackAttention
from solver.schema import ClusterSpec, ModelSpec

CFG = ToyConfig()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--service-url", default="http://127.0.0.1:8000")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--replicas", type=int, default=2, help="data-parallel replicas")
    parser.add_argument("--gpus-per-node", type=int, default=4)
    parser.add_argument("--parent-size", type=int, default=None, help="upstream parents")
    parser.add_argument(
        "--mode", default="repack+parent", choices=["baseline", "repack", "repack+parent"]
    )
    parser.add_argument("--max-tokens-per-rank", type=int, default=64)
    parser.add_argument("--fill", type=float, default=0.75, help="share of a parent's tokens")
    parser.add_argument("--timeout-s", type=float, default=2.0, help="per HTTP attempt")
    parser.add_argument("--retries", type=int, default=1)
    parser.add_argument("--prefetch", type=int, default=2, help="steps fetched ahead")
    parser.add_argument("--inline", action="store_true", help="no helper thread")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--attention", default="auto", choices=["auto", "sdpa", "flash"])
    parser.add_argument(
        "--no-measurements", action="store_true", help="do not report measured step times"
    )
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--job-id",
        default=None,
        help="idempotency key prefix; default: unique per run (the service answers 409 when a "
        "(job_id, step) key is reused with a different request)",
    )
    return parser.parse_args()


def model_spec() -> ModelSpec:
    return ModelSpec(
        heads=CFG.heads,
        kv_heads=CFG.kv_heads,
        head_dim=CFG.head_dim,
        hidden=CFG.hidden,
        layers=CFG.layers,
        pattern=CFG.pattern,
        sparse_window=CFG.window,
        # active MoE parameters per token: top_k experts of two matrices each
        moe_active_params=CFG.top_k * 2 * CFG.hidden * CFG.ffn,
    )


def shared_job_id(args: argparse.Namespace) -> str:
    """One id for the whole run, chosen by rank 0 (each replica appends its index)."""
    box = [args.job_id or f"train-toy-{int(time.time())}-{os.getpid()}"]
    dist.broadcast_object_list(box, src=0)
    return str(box[0])


def report(step: int, batch: RepackBatch, loss: float, wall_s: float) -> dict[str, Any]:
    """What a replica's first rank says about its step."""
    plan, m = batch.plan, batch.plan.metrics
    sizes = sorted((c.ranks[1] - c.ranks[0] for c in plan.children), reverse=True)
    return {
        "step": step,
        "text": (
            f"loss {loss:.4f} | plan {plan.plan_id} via {batch.source} "
            f"({batch.fetch_seconds * 1e3:.0f} ms, prefetched) | {batch.total_tokens} tokens | "
            f"children {sizes} | predicted {m.step_time_ms:.4g} ms vs baseline "
            f"{m.baseline_step_time_ms:.4g} ms (speedup {m.speedup:.3f}) | wall {wall_s:.2f} s"
        ),
    }


def main() -> None:
    try:
        run(parse_args())
    except ValueError as exc:  # bad flags (pydantic's errors are ValueErrors too): one line
        raise SystemExit("error: " + " ".join(str(exc).split())) from None


def run(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)  # the ranks share the CPU cores
    device = init_distributed(timeout_s=300, bind_device=args.device == "cuda")
    world = dist.get_world_size()
    if world % args.replicas:
        raise SystemExit(f"error: {world} ranks do not split into {args.replicas} replicas")
    size = world // args.replicas
    mesh = init_device_mesh(device.type, (args.replicas, size), mesh_dim_names=("dp", "cp"))
    gpus = min(args.gpus_per_node, size)
    groups = RepackGroups.from_mesh(mesh, "cp", GroupConfig(world_size=size, gpus_per_node=gpus))
    groups.setup()
    replica, rank = mesh.get_local_rank("dp"), groups.domain_rank
    parent = args.parent_size or size
    if size % parent:
        raise SystemExit(f"error: --parent-size {parent} does not divide the domain's {size} ranks")
    cluster = ClusterSpec(
        nodes=size // gpus, gpus_per_node=gpus, max_tokens_per_rank=args.max_tokens_per_rank
    )
    config = RepackLoaderConfig(
        job_id=f"{shared_job_id(args)}-r{replica}",
        cluster=cluster,
        model=model_spec(),
        parent_sizes=(parent,) * (size // parent),
        mode=args.mode,
        prefetch_depth=args.prefetch,
        background=not args.inline,
    )
    source = ToySampleSource(
        rank=rank,
        parent_size=parent,
        tokens_per_parent=int(args.fill * parent * args.max_tokens_per_rank),
        longest=min(400, parent * args.max_tokens_per_rank),
        vocab=CFG.vocab,
        seed=args.seed * 1000 + replica,  # replicas read different data
    )
    client = None
    if rank == 0:  # one request per replica and step; the plan is broadcast in the replica
        client_config = PlanClientConfig(
            service_url=args.service_url, timeout_s=args.timeout_s, retries=args.retries
        )
        client = PlanClient(client_config)
    if dist.get_rank() == 0:
        print(
            f"{world} ranks = {args.replicas} replicas x {size} ({cluster.nodes} nodes x {gpus}); "
            f"{len(groups.member_blocks)} communicators on rank 0 ({groups.creation_used}, "
            f"{groups.setup_seconds:.2f} s); plan service {args.service_url}; device {device}",
            flush=True,
        )
    timer = None if args.no_measurements else StepTimer(sync=device.type == "cuda")
    reporter = None
    if timer is not None and rank == 0:
        reporter = MeasurementReporter(
            ReporterConfig(service_url=args.service_url, timeout_s=args.timeout_s)
        )
    elif timer is None and dist.get_rank() == 0:
        print("step measurements: not reported (--no-measurements)", flush=True)
    batches = RepackDataIterator(
        source, config, groups, client, device=device, timer=timer, reporter=reporter
    )
    train(args, groups, batches, device)
    if reporter is not None:
        reporter.close()  # waits for the last posts
        s = reporter.stats
        print(f"replica {replica} measurements: {s.posted} posted, {s.failed} failed", flush=True)
    stats = [dataclasses.asdict(client.stats) if client else None]
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, stats[0])
    if dist.get_rank() == 0:
        summarize(args, [s for s in everyone if s is not None])
    if client is not None:
        client.close()
    dist.barrier()
    dist.destroy_process_group()


def train(
    args: argparse.Namespace, groups: RepackGroups, batches: RepackDataIterator, device: Any
) -> None:
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model = ToyModel(CFG).to(device)
    if batches.timer is not None:
        batches.timer.attach(
            model.blocks, [CFG.pattern[i % len(CFG.pattern)] for i in range(CFG.layers)]
        )
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    with batches:
        for step, batch in enumerate(itertools.islice(batches, args.steps)):
            t0 = time.perf_counter()
            backend = VarlenRepackAttention(batch.comm, batch.full, batch.sparse, args.attention)
            logits_NV = model(batch.tokens_N, batch.position_ids_N, backend)
            assert batch.labels_N is not None
            loss = F.cross_entropy(logits_NV, batch.labels_N, reduction="sum") / batch.total_tokens
            optimizer.zero_grad()
            loss.backward()
            for param in model.parameters():  # ranks of a replica hold disjoint tokens;
                assert param.grad is not None  # replicas average their gradients
                dist.all_reduce(param.grad)
                param.grad /= args.replicas
            optimizer.step()
            total = loss.detach().clone()
            dist.all_reduce(total, group=groups.domain_group)
            line = report(step, batch, total.item(), time.perf_counter() - t0)
            lines: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(lines, line if groups.domain_rank == 0 else None)
            if dist.get_rank() == 0:
                parts = [f"replica {r}: {x['text']}" for r, x in enumerate(filter(None, lines))]
                print(f"step {step}\n  " + "\n  ".join(parts), flush=True)


def summarize(args: argparse.Namespace, stats: list[dict[str, int]]) -> None:
    for r, s in enumerate(stats):
        print(
            f"replica {r} plans: {s['service_plans']} from the service, {s['fallbacks']} from the "
            f"fallback planner, {s['retries']} retries, prefetch hits {s['prefetch_hits']}"
        )
    fallbacks = sum(s["fallbacks"] for s in stats)
    if fallbacks:
        print(
            f"NOTE: the service at {args.service_url} gave no usable plan for {fallbacks} "
            "request(s) (see the warnings above); those plans came from the in-process "
            "fallback planner."
        )


if __name__ == "__main__":
    main()
