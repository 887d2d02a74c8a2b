"""What ``RepackDataIterator`` costs the training loop: time inside ``next()`` on rank 0.

    .venv/bin/python bench/data_iterator_overhead.py [--ranks 8] [--steps 12] [--step-s 2.0]

Each rank runs the iterator over the toy sample source and "trains" by sleeping ``--step-s``
(a stand-in for forward + backward that leaves the CPU to the iterator's helper work). The plan
service is the real FastAPI app under uvicorn (SQLite in a temporary directory) in this
process; ranks are forked gloo processes. For each configuration it reports, on rank 0:

* ``next()`` time: the wrapper's cost on the critical path (queue hand-off, host-to-device
  copies, comm lookup in background mode; plus lengths all-gather, plan agreement and the token
  all-to-all inline), p50 / p90 / max over steps 1.. (step 0 has no earlier step to hide
  behind and is reported apart);
* the plan fetch time (request to plan, from the client): what prefetch hides.

It never asserts times; numbers from a shared 2-core host are noisy (see docs/runtime.md).
``--device cuda`` moves the batches to the GPU (``cuda:LOCAL_RANK``-style binding by rank).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time
from typing import Any

import torch

from api.server import ServerThread, free_port
from api.settings import Settings
from runtime_client.data_iterator import RepackDataIterator, RepackLoaderConfig
from runtime_client.groups import GroupConfig, RepackGroups
from runtime_client.local_launch import run_local_ranks
from runtime_client.plan_client import PlanClient, PlanClientConfig
from runtime_client.toy_data import ToySampleSource
from solver.schema import ClusterSpec, ModelSpec

GPUS = 4
MODEL = ModelSpec(heads=8, kv_heads=4, head_dim=8, hidden=32, layers=4, sparse_window=16)


def _rank(rank: int, world: int, url: str, args: argparse.Namespace, mode: str) -> dict[str, Any]:
    groups = RepackGroups(GroupConfig(world_size=world, gpus_per_node=GPUS)).setup()
    config = RepackLoaderConfig(
        job_id=f"bench-{mode}-{time.time_ns()}" if rank == 0 else "",
        cluster=ClusterSpec(nodes=world // GPUS, gpus_per_node=GPUS, max_tokens_per_rank=64),
        model=MODEL,
        parent_sizes=(world,),
        prefetch_depth=args.prefetch,
        background=mode == "background",
    )
    box = [config.job_id]
    torch.distributed.broadcast_object_list(box, src=0)  # one job id for every rank
    config = dataclasses.replace(config, job_id=box[0])
    client = PlanClient(PlanClientConfig(service_url=url, timeout_s=10.0)) if rank == 0 else None
    source = ToySampleSource(
        rank=rank, parent_size=world, tokens_per_parent=world * 48, longest=300
    )
    device = torch.device(args.device, rank % max(1, torch.cuda.device_count()))
    if args.device == "cpu":
        device = torch.device("cpu")
    next_s, fetch_s, sources = [], [], []
    with RepackDataIterator(source, config, groups, client, device=device) as it:
        for _ in range(args.steps):
            t0 = time.perf_counter()
            batch = next(it)
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # the copies are part of the cost
            next_s.append(time.perf_counter() - t0)
            fetch_s.append(batch.fetch_seconds)
            sources.append(batch.source)
            time.sleep(args.step_s)  # the training step
    return {"next_s": next_s, "fetch_s": fetch_s, "sources": sources}


def _ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return 1e3 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--step-s", type=float, default=2.0)
    parser.add_argument("--prefetch", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            database_url=f"sqlite:///{tmp}/plans.db", port=free_port(), log_level="warning"
        )
        server = ServerThread(settings).start()
        print(
            f"{args.ranks} ranks, {args.steps} steps of {args.step_s} s, prefetch "
            f"{args.prefetch}, service {server.url}"
        )
        print(
            "| mode | next() step 0 ms | next() p50 / p90 / max ms (steps 1..) "
            "| plan fetch p50 / max ms | sources |"
        )
        print("|---|--:|--:|--:|---|")
        try:
            for mode in ("background", "inline"):
                out = run_local_ranks(_rank, args.ranks, server.url, args, mode)[0]
                rest = out["next_s"][1:]
                print(
                    f"| {mode} | {out['next_s'][0] * 1e3:.1f} | {_ms(rest, 0.5):.2f} / "
                    f"{_ms(rest, 0.9):.2f} / {max(rest) * 1e3:.2f} | "
                    f"{statistics.median(out['fetch_s']) * 1e3:.1f} / "
                    f"{max(out['fetch_s']) * 1e3:.1f} | "
                    f"{sorted(set(out['sources']))} |",
                    flush=True,
                )
        finally:
            server.stop()


if __name__ == "__main__":
    main()
