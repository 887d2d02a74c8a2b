"""Candidate process groups: the count, completeness against the layout rules, and real
communicators on 16 forked gloo ranks."""

from __future__ import annotations

import random

import pytest
import torch
import torch.distributed as dist

from runtime_client.groups import (
    GroupConfig,
    RepackGroups,
    candidate_blocks,
    communicator_blocks,
    communicators_per_rank,
    split_partitions,
)
from runtime_client.local_launch import run_local_ranks
from solver.planner import plan
from solver.schema import CHILD_SIZES, ClusterSpec, ModelSpec, PlanRequest, parent_size_error


def _rule_blocks(world: int, g: int) -> set[tuple[int, int]]:
    """Independent enumeration straight from the schema's placement rule."""
    cluster = ClusterSpec(nodes=world // g, gpus_per_node=g)
    model = ModelSpec(heads=world, kv_heads=world)  # heads never rule a size out here
    blocks = set()
    size = 1
    while size <= world:
        for start in range(world - size + 1):
            if parent_size_error(size, start, cluster, model) is None:
                blocks.add((start, start + size))
        size *= 2
    for k in CHILD_SIZES:
        if k <= g:
            blocks.update((s, s + k) for s in range(0, world, k))
    return blocks


@pytest.mark.parametrize(
    ("world", "blocks", "communicators"), [(16, 31, 14), (64, 133, 68), (1024, 2569, 1544)]
)
def test_group_counts(world: int, blocks: int, communicators: int) -> None:
    cfg = GroupConfig(world_size=world, gpus_per_node=8)
    assert len(candidate_blocks(cfg)) == blocks
    assert len(communicator_blocks(cfg)) == communicators
    assert set(candidate_blocks(cfg)) == _rule_blocks(world, 8)


def test_restricting_parent_sizes_shrinks_the_set() -> None:
    cfg = GroupConfig(world_size=1024, gpus_per_node=8, parent_sizes=(16, 32))
    blocks = candidate_blocks(cfg)
    assert max(e - s for s, e in blocks) == 32
    assert len(communicator_blocks(cfg)) == 896 + 127 + 125


def test_every_planned_block_is_a_candidate() -> None:
    cfg = GroupConfig(world_size=32, gpus_per_node=8)
    blocks = set(candidate_blocks(cfg))
    rng = random.Random(0)
    for sizes in ([32], [16, 16], [8, 16, 8], [8, 8, 16], [16, 8, 4, 4]):
        lengths = [rng.randint(1, 300) for _ in range(12)]
        p = plan(
            PlanRequest.model_validate(
                {
                    "cluster": {"nodes": 4, "gpus_per_node": 8, "max_tokens_per_rank": 128},
                    "model": {"heads": 32, "kv_heads": 4, "head_dim": 8},
                    "lengths": lengths,
                    "parent_sizes": sizes,
                }
            )
        )
        for item in [*p.parents, *p.children]:
            assert tuple(item.ranks) in blocks


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="Expected timeout_s > 0, got 0"):
        GroupConfig(world_size=16, gpus_per_node=8, timeout_s=0)
    with pytest.raises(ValueError, match="power-of-two group sizes, got 12"):
        GroupConfig(world_size=16, gpus_per_node=8, parent_sizes=(12,))


def _groups_worker(rank: int, world: int, creation: str) -> list[tuple[int, int]]:
    cfg = GroupConfig(world_size=world, gpus_per_node=8, timeout_s=60, creation=creation)  # type: ignore[arg-type]
    groups = RepackGroups(cfg)
    assert groups.setup() is groups.setup()  # second call is a no-op (no new_group calls)
    assert groups.creation_used == "world"  # gloo cannot split
    for block in groups.member_blocks:
        pg = groups.group(block)
        assert dist.get_world_size(pg) == block[1] - block[0]
        # A real collective over the group: the sum of its members' global ranks.
        value = torch.tensor([float(rank)])
        dist.all_reduce(value, group=pg)
        assert value.item() == sum(range(*block)), (block, value)
    assert groups.group((rank, rank + 1)) is None
    assert groups.group((0, world)) is dist.group.WORLD
    other = (0, 8) if rank >= 8 else (8, 16)
    try:
        groups.group(other)
    except KeyError:
        pass
    else:
        raise AssertionError("a non-member block must not resolve")
    return groups.member_blocks


@pytest.mark.slow
def test_groups_on_32_ranks() -> None:
    """32 ranks have overlapping wide parents ([0, 16), [8, 24), [16, 32)): rank 8 is in more
    groups than rank 16 when both reach [8, 24), the case that hung with local creation."""
    members = run_local_ranks(_groups_worker, 32, "auto", timeout_s=120)
    assert members[0] == [(0, 2), (0, 4), (0, 8), (0, 16)]
    assert members[13] == [(12, 14), (12, 16), (8, 16), (0, 16), (8, 24)]
    assert members[16] == [(16, 18), (16, 20), (16, 24), (8, 24), (16, 32)]


@pytest.mark.parametrize(
    ("world", "parent_sizes", "most"),
    [(64, None, 9), (1024, None, 129), (1024, (16, 32), 9), (64, (16, 32), 9), (16, (16,), 3)],
)
def test_communicators_per_rank(
    world: int, parent_sizes: tuple[int, ...] | None, most: int
) -> None:
    cfg = GroupConfig(world_size=world, gpus_per_node=8, parent_sizes=parent_sizes)
    counts = communicators_per_rank(cfg)
    assert max(counts) == most
    # Every block's members counted once: the per-rank counts add up to the blocks' sizes.
    assert sum(counts) == sum(e - s for s, e in communicator_blocks(cfg))


@pytest.mark.parametrize("world", [16, 32, 64])
def test_split_partitions_are_disjoint_and_complete(world: int) -> None:
    cfg = GroupConfig(world_size=world, gpus_per_node=8)
    parts = split_partitions(cfg)
    for blocks in parts:
        ranks = [r for s, e in blocks for r in range(s, e)]
        assert len(ranks) == len(set(ranks))  # one split_group call = disjoint groups
    assert sorted(b for blocks in parts for b in blocks) == sorted(communicator_blocks(cfg))


def test_bound_device_follows_local_rank_not_current_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The decision only (no GPU here): with CUDA, rank LOCAL_RANK=3 uses cuda:3, whatever
    ``torch.cuda.current_device()`` would say (GPU 0 on every rank until set_device)."""
    from runtime_client import groups as groups_module

    monkeypatch.setattr(groups_module, "_bound_device", None)
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert groups_module.bound_device() == torch.device("cuda", 3)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert groups_module.bound_device() == torch.device("cpu")
