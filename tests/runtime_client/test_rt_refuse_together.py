"""A corrupt split-size row must make every rank refuse the plan before any collective.

Reported defect: the row of rank r was only checked on rank r, so r raised ``PlanLayoutError``
while its 15 peers entered the all-to-all and waited for the process-group timeout. The rank
that detects the error stays alive here (as an exception caught by a training loop would); if
it exited, gloo would notice the dead peer within a second and hide the hang that NCCL shows.
The process groups get a short timeout, so a regression fails in seconds, as a timeout error
on the peers, not as ``PlanLayoutError``.
"""

from __future__ import annotations

import os
import tempfile
import time

import pytest
import torch
import torch.distributed as dist
from rt_plans import hand_plan

from runtime_client.agreement import agreed_layout
from runtime_client.all_to_all import RepackComm
from runtime_client.groups import GroupConfig, RepackGroups
from runtime_client.local_launch import run_local_ranks
from runtime_client.local_layout import LocalLayout, PlanLayoutError
from solver.schema import Plan

WORLD, GPUS = 16, 8
PG_TIMEOUT_S = 6.0
"""Short on purpose: a rank left waiting in a collective fails after this, not after 10 min."""

LENGTHS = [120, 30, 9, 60, 44, 3, 50, 25]
BAD_RANK = 5


def _corrupted_plan() -> Plan:
    """A valid 16-rank plan whose ``to_full`` output row of ``BAD_RANK`` is off by one token."""
    good = hand_plan(LENGTHS, [[(8, [0, 1]), (4, [2, 3]), (2, [4, 5]), (1, [6]), (1, [7])]])
    data = good.model_dump(mode="json")
    data["all_to_all"]["to_full"]["output_split_sizes"][BAD_RANK][0] += 1
    return Plan.model_validate(data)


def _wait_for_everyone(store: dist.Store, world: int) -> None:
    """Keep this rank alive until every rank has its outcome (or a generous deadline)."""
    store.add("done", 1)
    deadline = time.monotonic() + 3 * PG_TIMEOUT_S
    while store.add("done", 0) < world and time.monotonic() < deadline:
        time.sleep(0.05)


def _worker(rank: int, world: int, plan: Plan, store_path: str) -> tuple[str, float]:
    store = dist.FileStore(store_path, world)
    groups = RepackGroups(
        GroupConfig(world_size=world, gpus_per_node=GPUS, timeout_s=PG_TIMEOUT_S)
    ).setup()
    dist.barrier()
    t0 = time.perf_counter()
    try:
        # What a training loop does with the step's plan: cut out the layout, then exchange.
        layout = LocalLayout.from_plan(plan, rank)
        comm = RepackComm(layout, groups)
        q = torch.randn(layout.n_local, 16, 8)
        kv = torch.randn(layout.n_local, 4, 8)
        comm.to_full(q, kv, kv)
        outcome = "exchanged"
    except PlanLayoutError:
        outcome = "PlanLayoutError"
    except Exception as exc:  # a timeout or a peer error: the defect
        outcome = type(exc).__name__
    elapsed = time.perf_counter() - t0
    _wait_for_everyone(store, world)
    return outcome, elapsed


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_every_rank_refuses_a_corrupt_split_row() -> None:
    plan = _corrupted_plan()
    with tempfile.TemporaryDirectory() as tmp:
        results = run_local_ranks(_worker, WORLD, plan, os.path.join(tmp, "outcomes"), timeout_s=90)
    # Refused before any collective: a rank left in one would report the group's timeout
    # (or the peer's error) instead, and the slowest rank's time is in the message.
    outcomes = [outcome for outcome, _ in results]
    slowest = max(elapsed for _, elapsed in results)
    assert outcomes == ["PlanLayoutError"] * WORLD, (outcomes, f"slowest {slowest:.1f} s")


def test_the_corrupt_row_is_seen_from_every_rank() -> None:
    plan = _corrupted_plan()
    for rank in range(WORLD):
        with pytest.raises(PlanLayoutError, match=f"rank {BAD_RANK}: plan split sizes"):
            LocalLayout.from_plan(plan, rank)


def _flag_worker(rank: int, world: int, good: Plan, bad: Plan) -> str:
    # Only rank 3 holds the corrupt copy (no digest check here): it alone can see the error.
    try:
        agreed_layout(bad if rank == 3 else good)
    except PlanLayoutError as exc:
        return str(exc)
    return "accepted"


@pytest.mark.slow
def test_a_layout_error_seen_by_one_rank_raises_on_all() -> None:
    good = hand_plan([20, 9, 30, 4], [[(2, [0, 1]), (1, [2]), (1, [3])]], gpus_per_node=4)
    data = good.model_dump(mode="json")
    data["all_to_all"]["to_child"]["input_split_sizes"][1][0] += 1
    results = run_local_ranks(_flag_worker, 4, good, Plan.model_validate(data), timeout_s=60)
    assert "rank 1: plan split sizes" in results[3]
    assert results[:3] == ["another rank of the domain refused the plan's layout"] * 3
