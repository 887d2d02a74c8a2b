"""Cost of creating (and warming) every candidate process group, and how many a rank is in.

    .venv/bin/python bench/group_setup.py [--worlds 16 32 64] [--creation auto]
    # GPUs (NCCL; creation "auto" = split_group of the domain's communicator):
    torchrun --nproc-per-node 8 bench/group_setup.py --device cuda

Prints, per world size (8 ranks per node) and creation path: candidate blocks, communicators,
the most one rank is in, and the slowest rank's ``RepackGroups.setup`` time (creation + one
warm-up all-reduce per communicator). Larger worlds (256, 1,024) are counted with
``communicators_per_rank`` without creating anything, for every parent size and for parents
of 16/32 only.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

from runtime_client.groups import (
    GroupConfig,
    RepackGroups,
    candidate_blocks,
    collective_device,
    communicator_blocks,
    communicators_per_rank,
    init_distributed,
)
from runtime_client.local_launch import run_local_ranks

GPUS = 8


def _worker(rank: int, world: int, creation: str, gpus: int) -> tuple[float, int, str]:
    cfg = GroupConfig(world_size=world, gpus_per_node=gpus, creation=creation)  # type: ignore[arg-type]
    groups = RepackGroups(cfg).setup()
    slowest = torch.tensor([groups.setup_seconds], device=collective_device())
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return float(slowest.item()), len(groups.member_blocks), groups.creation_used


def _counts_row(world: int, parent_sizes: tuple[int, ...] | None) -> str:
    cfg = GroupConfig(world_size=world, gpus_per_node=GPUS, parent_sizes=parent_sizes)
    label = "all" if parent_sizes is None else "/".join(map(str, parent_sizes))
    return (
        f"| {world} | {label} | (counted) | {len(candidate_blocks(cfg))} | "
        f"{len(communicator_blocks(cfg))} | {max(communicators_per_rank(cfg))} | |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--creation", nargs="+", default=["auto"])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args()
    header = (
        "| ranks | parent sizes | creation | candidate blocks | communicators "
        "| most per rank | setup + warm-up s (slowest rank) |\n|---|---|---|---|---|---|---|"
    )
    if args.device == "cuda":
        if "RANK" not in os.environ:
            parser.error("--device cuda runs under torchrun (one process per GPU)")
        init_distributed()
        world, gpus = dist.get_world_size(), int(os.environ.get("LOCAL_WORLD_SIZE", GPUS))
        seconds, mine, used = _worker(dist.get_rank(), world, "auto", gpus)
        if dist.get_rank() == 0:
            cfg = GroupConfig(world_size=world, gpus_per_node=gpus)
            print(header)
            print(
                f"| {world} | all | {used} (NCCL) | {len(candidate_blocks(cfg))} | "
                f"{len(communicator_blocks(cfg))} | {mine} | {seconds:.2f} |"
            )
        return
    print(header)
    for world in args.worlds:
        cfg = GroupConfig(world_size=world, gpus_per_node=GPUS)
        for creation in args.creation:
            seconds, _, used = run_local_ranks(_worker, world, creation, GPUS, timeout_s=600)[0]
            print(
                f"| {world} | all | {used} | {len(candidate_blocks(cfg))} | "
                f"{len(communicator_blocks(cfg))} | {max(communicators_per_rank(cfg))} "
                f"| {seconds:.2f} |"
            )
    for world in (64, 256, 1024):
        print(_counts_row(world, None))
        print(_counts_row(world, (16, 32)))


if __name__ == "__main__":
    main()
