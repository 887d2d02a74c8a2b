"""Train the toy 1F3S hybrid model with Layerwise Repacking on CPU (gloo).

    torchrun --nproc-per-node 16 examples/train_toy.py --service-url http://127.0.0.1:8000

Sixteen local processes play two nodes of eight GPUs. Every step, rank 0 asks the plan service
for the step's layout (prefetching the next steps in the background; falling back to the
in-process planner when the service is unreachable, which it says), broadcasts it, every rank
checks the layout digest, then runs forward and backward in the repacked layout: sparse layers
with Ulysses over each child, full layers through the fused variable all-to-all over the parent.
"""

from __future__ import annotations

import argparse
import os
import random
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from runtime_client.all_to_all import RepackComm
from runtime_client.groups import GroupConfig, RepackGroups, init_distributed
from runtime_client.local_layout import LocalLayout, plan_lengths
from runtime_client.plan_client import PlanClient, PlanClientConfig, fetch_agreed_plan
from runtime_client.toy_model import RepackAttention, ToyConfig, ToyModel, synthetic_batch
from solver.schema import PlanRequest

CFG = ToyConfig()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--service-url", default="http://127.0.0.1:8000")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument(
        "--mode", default="repack+parent", choices=["baseline", "repack", "repack+parent"]
    )
    parser.add_argument("--parent-sizes", default="16", help="comma-separated, e.g. 8,8")
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--max-tokens-per-rank", type=int, default=64)
    parser.add_argument("--tokens-per-step", type=int, default=700)
    parser.add_argument("--timeout-s", type=float, default=2.0, help="per HTTP attempt")
    parser.add_argument("--retries", type=int, default=1)
    parser.add_argument("--prefetch", type=int, default=2, help="steps fetched ahead")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--job-id",
        default=None,
        help="idempotency key prefix; default: unique per run (the service answers 409 when a "
        "(job_id, step) key is reused with a different request)",
    )
    return parser.parse_args()


def step_request(args: argparse.Namespace, world: int, step: int) -> PlanRequest:
    """The data loader's side: this step's sample lengths (seeded, same on every rank)."""
    rng = random.Random(args.seed * 100_003 + step)
    sizes = [int(s) for s in args.parent_sizes.split(",")]
    longest = max(sizes) * args.max_tokens_per_rank  # what the widest parent can hold
    lengths: list[int] = []
    while True:
        n = rng.choice([rng.randint(1, 12), rng.randint(12, 60), rng.randint(60, 400)])
        if sum(lengths) + n > args.tokens_per_step:
            break
        lengths.append(min(n, longest))
    return PlanRequest.model_validate(
        {
            "job_id": args.job_id,
            "step": step,
            "cluster": {
                "nodes": world // args.gpus_per_node,
                "gpus_per_node": args.gpus_per_node,
                "max_tokens_per_rank": args.max_tokens_per_rank,
            },
            "model": {
                "heads": CFG.heads,
                "kv_heads": CFG.kv_heads,
                "head_dim": CFG.head_dim,
                "hidden": CFG.hidden,
                "layers": CFG.layers,
                "pattern": CFG.pattern,
                "sparse_window": CFG.window,
                # active MoE parameters per token: top_k experts of two matrices each
                "moe_active_params": CFG.top_k * 2 * CFG.hidden * CFG.ffn,
            },
            "lengths": lengths,
            "parent_sizes": sizes,
            "mode": args.mode,
        }
    )


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)  # 16 ranks share the CPU cores
    init_distributed(backend="gloo", timeout_s=300)
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.job_id is None:  # one id for the whole run, chosen by rank 0
        box = [f"train-toy-{int(time.time())}-{os.getpid()}" if rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        args.job_id = box[0]
    groups = RepackGroups(GroupConfig(world_size=world, gpus_per_node=args.gpus_per_node))
    groups.setup()
    client = None
    if rank == 0:  # strategy "broadcast": one request per step, rank 0 shares the plan
        client = PlanClient(
            PlanClientConfig(
                service_url=args.service_url, timeout_s=args.timeout_s, retries=args.retries
            )
        )
        for step in range(min(args.prefetch, args.steps)):
            client.prefetch(step_request(args, world, step))
        print(
            f"{world} ranks, {len(groups.member_blocks)} communicators on rank 0 "
            f"(set up in {groups.setup_seconds:.2f} s); plan service {args.service_url}"
        )
    torch.manual_seed(args.seed)
    model = ToyModel(CFG)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    for step in range(args.steps):
        t0 = time.perf_counter()
        if client is not None and step + args.prefetch < args.steps:
            client.prefetch(step_request(args, world, step + args.prefetch))
        fetched = fetch_agreed_plan(client, step_request(args, world, step))
        plan = fetched.plan
        layout = LocalLayout.from_plan(plan, rank)
        lengths = plan_lengths(plan)
        tokens_T, labels_T = synthetic_batch(lengths, CFG.vocab, seed=step)
        idx = layout.global_index_N
        backend = RepackAttention(RepackComm(layout, groups))
        logits_NV = model(tokens_T[idx], layout.position_ids_N, backend)
        loss = F.cross_entropy(logits_NV, labels_T[idx], reduction="sum") / sum(lengths)
        optimizer.zero_grad()
        loss.backward()
        for param in model.parameters():  # data-parallel sync: replicas, disjoint tokens
            assert param.grad is not None
            dist.all_reduce(param.grad)
        optimizer.step()
        total_loss = loss.detach().clone()
        dist.all_reduce(total_loss)
        if rank == 0:
            sizes = sorted((c.ranks[1] - c.ranks[0] for c in plan.children), reverse=True)
            empty = sum(1 for c in plan.children if not c.samples)
            m = plan.metrics
            print(
                f"step {step}: loss {total_loss.item():.4f} | plan {plan.plan_id} via "
                f"{fetched.source} ({fetched.attempts} attempt(s), {fetched.seconds * 1e3:.0f} ms)"
                f" | {len(lengths)} samples, {sum(lengths)} tokens | children {sizes}"
                f" ({empty} empty) | predicted {m.step_time_ms:.4g} ms vs baseline "
                f"{m.baseline_step_time_ms:.4g} ms, speedup {m.speedup:.3f}, "
                f"solve {m.solve_ms} ms | step wall {time.perf_counter() - t0:.2f} s",
                flush=True,
            )
    if client is not None:
        s = client.stats
        print(
            f"plans: {s.service_plans} from the service, {s.fallbacks} from the fallback "
            f"planner, {s.retries} retries, prefetch hits {s.prefetch_hits}"
        )
        if s.fallbacks:
            print(
                f"NOTE: the service at {args.service_url} gave no usable plan for "
                f"{s.fallbacks} step(s) (see the warnings above); those plans came from the "
                "in-process fallback planner."
            )
        client.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
