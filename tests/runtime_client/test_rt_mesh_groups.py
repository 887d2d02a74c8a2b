"""The repack domain is one dimension of a DeviceMesh: 2 data-parallel replicas x 8 ranks on
gloo, each replica running its own plans on its own communicators, each matching its own
single-process reference (logits, loss, every gradient within 1e-5); and each replica's first
rank fetching and broadcasting its own plan inside its domain."""

from __future__ import annotations

import copy
import random
import socket
from typing import Any

import pytest
import torch
import torch.distributed as dist
from rt_equivalence import step_errors
from torch.distributed.device_mesh import init_device_mesh

from runtime_client.agreement import agreed_layout, fetch_agreed_plan
from runtime_client.groups import GroupConfig, RepackGroups
from runtime_client.local_launch import run_local_ranks
from runtime_client.plan_client import PlanClient, PlanClientConfig, layout_digest
from runtime_client.toy_model import ToyConfig, ToyModel
from solver.planner import plan
from solver.schema import Plan, PlanRequest

REPLICAS, DOMAIN, GPUS = 2, 8, 4  # each replica: 2 "nodes" x 4, so parents of 8 span nodes
TOL = 1e-5
CFG = ToyConfig(heads=16, kv_heads=4, head_dim=8, hidden=32, layers=4, window=16)


def _plan(seed: int, sizes: list[int], mode: str) -> Plan:
    rng = random.Random(seed)
    lengths: list[int] = []
    while True:
        n = rng.choice([rng.randint(1, 12), rng.randint(12, 60), rng.randint(60, 200)])
        if sum(lengths) + n > 350:
            break
        lengths.append(n)
    request = PlanRequest.model_validate(
        {
            "cluster": {"nodes": 2, "gpus_per_node": GPUS, "max_tokens_per_rank": 64},
            "model": {"heads": 16, "kv_heads": 4, "head_dim": 8, "moe_active_params": 2000},
            "lengths": lengths,
            "parent_sizes": sizes,
            "mode": mode,
        }
    )
    return plan(request)


def _steps(replica: int) -> list[tuple[Plan, int]]:
    """Different plans per replica: the replicas' data differ, so must their layouts."""
    base = 1000 * (replica + 1)
    return [
        (_plan(base + 1, [8], "repack+parent"), base + 1),
        (_plan(base + 2, [4, 4], "repack"), base + 2),
        (_plan(base + 3, [8], "baseline"), base + 3),
    ]


def _worker(rank: int, world: int, steps: list[list[tuple[Plan, int]]]) -> dict[str, Any]:
    mesh = init_device_mesh("cpu", (REPLICAS, DOMAIN), mesh_dim_names=("dp", "cp"))
    config = GroupConfig(world_size=DOMAIN, gpus_per_node=GPUS, timeout_s=120)
    groups = RepackGroups.from_mesh(mesh, "cp", config).setup()
    replica = mesh.get_local_rank("dp")
    torch.manual_seed(0)
    model = ToyModel(CFG)
    ref = copy.deepcopy(model) if groups.domain_rank == 0 else None
    errors = [step_errors(CFG, model, ref, groups, p, s).tolist() for p, s in steps[replica]]
    return {
        "replica": replica,
        "domain_rank": groups.domain_rank,
        "creation": groups.creation_used,
        "members": [groups.global_ranks(b) for b in groups.member_blocks],
        "domain": dist.get_process_group_ranks(groups.domain_group),
        "errors": errors,
    }


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_replicas_each_match_their_reference() -> None:
    steps = [_steps(r) for r in range(REPLICAS)]
    digests = [[layout_digest(p) for p, _ in s] for s in steps]
    assert all(a != b for a, b in zip(*digests, strict=True))  # each replica its own plans
    assert any(c.ranks[1] - c.ranks[0] < 8 for p, _ in steps[0] for c in p.children)  # repacked
    results = run_local_ranks(_worker, REPLICAS * DOMAIN, steps, timeout_s=280)
    for rank, res in enumerate(results):
        replica = rank // DOMAIN
        assert res["replica"] == replica and res["domain_rank"] == rank % DOMAIN
        assert res["domain"] == list(range(replica * DOMAIN, (replica + 1) * DOMAIN))
        assert res["creation"] == "world"  # gloo cannot split
        # Every communicator of this rank lies inside its replica.
        assert all(r // DOMAIN == replica for ranks in res["members"] for r in ranks), res
        assert res["errors"] == results[replica * DOMAIN]["errors"]  # one verdict per replica
    for replica in range(REPLICAS):
        for (p, _), (logit, loss, grad, smallest) in zip(
            steps[replica], results[replica * DOMAIN]["errors"], strict=True
        ):
            label = f"replica {replica}: {p.mode} {[c.ranks for c in p.children]}"
            assert smallest > 1e-4, label
            assert logit <= TOL and loss <= TOL and grad <= TOL, (label, logit, loss, grad)


def _agreement_worker(rank: int, world: int, url: str) -> tuple[int, str, str]:
    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "cp"))
    domain = mesh.get_group("cp")
    replica = mesh.get_local_rank("dp")
    request = PlanRequest.model_validate(
        {
            "job_id": f"replica-{replica}",
            "step": 0,
            "cluster": {"nodes": 1, "gpus_per_node": world // 2, "max_tokens_per_rank": 64},
            "model": {"heads": 16, "kv_heads": 4, "head_dim": 8},
            "lengths": [50, 9, 30 + 40 * replica, 4],
        }
    )
    # Only each domain's first rank has a client (no service: it falls back and says so).
    src = dist.get_rank(domain) == 0
    client = PlanClient(PlanClientConfig(service_url=url, retries=0)) if src else None
    fetched = fetch_agreed_plan(client, request, group=domain)
    layout = agreed_layout(fetched.plan, group=domain)
    if client is not None:
        client.close()
    assert layout.rank == dist.get_rank(domain)
    return replica, fetched.source, layout_digest(fetched.plan).hex()


@pytest.mark.slow
def test_each_replica_agrees_on_its_own_plan() -> None:
    with socket.socket() as s:  # bind and release: nothing listens there afterwards
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    results = run_local_ranks(_agreement_worker, 8, url, timeout_s=120)
    assert [src for _, src, _ in results] == ["fallback", *["broadcast"] * 3] * 2
    assert len({d for _, _, d in results[:4]}) == 1 and len({d for _, _, d in results[4:]}) == 1
    assert results[0][2] != results[4][2]  # each replica broadcast its own plan
