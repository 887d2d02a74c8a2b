"""Cost of creating every candidate process group, on forked gloo ranks of one CPU host.

    .venv/bin/python bench/group_setup.py [--worlds 16 32 64]

Prints, per world size (8 ranks per node): candidate blocks, ``new_group`` calls, the groups
rank 0 belongs to, and the slowest rank's ``RepackGroups.setup`` time. The counts for larger
worlds (e.g. 1,024) come from ``candidate_blocks`` without creating anything.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

from runtime_client.groups import GroupConfig, RepackGroups, candidate_blocks, communicator_blocks
from runtime_client.local_launch import run_local_ranks

GPUS = 8


def _worker(rank: int, world: int) -> tuple[float, int]:
    groups = RepackGroups(GroupConfig(world_size=world, gpus_per_node=GPUS))
    groups.setup()
    slowest = torch.tensor([groups.setup_seconds])
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return float(slowest.item()), len(groups.member_blocks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[16, 32, 64])
    args = parser.parse_args()
    print("| ranks | candidate blocks | new_group calls | groups of rank 0 | setup s (slowest) |")
    print("|---|---|---|---|---|")
    for world in args.worlds:
        cfg = GroupConfig(world_size=world, gpus_per_node=GPUS)
        seconds, mine = run_local_ranks(_worker, world, timeout_s=600)[0]
        print(
            f"| {world} | {len(candidate_blocks(cfg))} | {len(communicator_blocks(cfg))} | "
            f"{mine} | {seconds:.2f} |"
        )
    for world in (256, 1024):
        cfg = GroupConfig(world_size=world, gpus_per_node=GPUS)
        print(
            f"| {world} | {len(candidate_blocks(cfg))} | {len(communicator_blocks(cfg))} | "
            "(not run) | |"
        )


if __name__ == "__main__":
    main()
