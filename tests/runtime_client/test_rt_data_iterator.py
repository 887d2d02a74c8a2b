"""RepackDataIterator on forked gloo ranks: tokens arrive where the plan says, the model run
through it matches the single-process reference, resuming asks for (and gets) the same plans,
with a real uvicorn service and without one (fallback, counted and said)."""

from __future__ import annotations

import itertools
import logging
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.device_mesh import init_device_mesh

from api.server import ServerThread, free_port
from api.settings import Settings
from runtime_client.data_iterator import RepackBatch, RepackDataIterator, RepackLoaderConfig
from runtime_client.groups import GroupConfig, RepackGroups
from runtime_client.local_launch import run_local_ranks
from runtime_client.local_layout import LocalLayout
from runtime_client.plan_client import (
    PlanClient,
    PlanClientConfig,
    PlanServiceError,
    layout_digest,
)
from runtime_client.reroute import rank_token_positions
from runtime_client.toy_data import ToySampleSource
from runtime_client.toy_model import ToyConfig, ToyModel, VarlenRepackAttention, reference_forward
from solver.planner import plan as local_plan
from solver.schema import ClusterSpec, ModelSpec

WORLD, GPUS, PARENT = 8, 4, 8
CFG = ToyConfig(heads=8, kv_heads=4, head_dim=8, hidden=32, layers=4, window=16)
CLUSTER = ClusterSpec(nodes=WORLD // GPUS, gpus_per_node=GPUS, max_tokens_per_rank=64)
MODEL = ModelSpec(
    heads=CFG.heads,
    kv_heads=CFG.kv_heads,
    head_dim=CFG.head_dim,
    hidden=CFG.hidden,
    layers=CFG.layers,
    pattern=CFG.pattern,
    sparse_window=CFG.window,
    moe_active_params=2000,
)


def _source(
    rank: int, steps: int | None = None, *, seed: int = 0, parent: int = PARENT
) -> ToySampleSource:
    return ToySampleSource(
        rank=rank,
        parent_size=parent,
        tokens_per_parent=380 * parent // PARENT,
        longest=300 * parent // PARENT,
        steps=steps,
        seed=seed,
    )


def _config(job_id: str, **extra: Any) -> RepackLoaderConfig:
    return RepackLoaderConfig(
        job_id=job_id, cluster=CLUSTER, model=MODEL, parent_sizes=(PARENT,), **extra
    )


def _closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def _client(url: str) -> PlanClient:
    return PlanClient(PlanClientConfig(service_url=url, timeout_s=10.0, retries=0))


def _iterator(
    rank: int, url: str, config: RepackLoaderConfig, groups: RepackGroups, steps: int | None
) -> RepackDataIterator:
    client = _client(url) if rank == config.src or config.strategy == "verify" else None
    return RepackDataIterator(_source(rank, steps), config, groups, client)


def _global_batch(
    step: int, *, seed: int = 0, world: int = WORLD
) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """What every rank pulled at ``step``, concatenated in rank order (the global batch)."""
    parts = [_source(r, seed=seed, parent=world).samples(step) for r in range(world)]
    lengths = [n for p in parts for n in p.lengths]
    tokens = torch.cat([p.tokens_T for p in parts])
    labels = torch.cat([p.labels_T for p in parts if p.labels_T is not None])
    return tokens, labels, lengths


def _check_batch(
    batch: RepackBatch, rank: int, *, seed: int = 0, world: int = WORLD
) -> dict[str, Any]:
    """Everything a rank can check about its batch against the plan, alone."""
    tokens_T, labels_T, lengths = _global_batch(batch.step, seed=seed, world=world)
    layout = batch.layout
    assert batch.tokens_N.tolist() == tokens_T[layout.global_index_N].tolist()
    assert batch.labels_N is not None
    assert batch.labels_N.tolist() == labels_T[layout.global_index_N].tolist()
    assert batch.position_ids_N.tolist() == layout.position_ids_N.tolist()
    assert batch.full.cu_seqlens_q.dtype == torch.int32
    assert batch.full.cu_seqlens_q.tolist() == list(layout.cu_seqlens_full)
    assert batch.sparse.cu_seqlens_q.tolist() == list(layout.cu_seqlens_sparse)
    full_lengths = [b - a for a, b in itertools.pairwise(layout.cu_seqlens_full)]
    assert batch.full.max_seqlen_q == max(full_lengths, default=0)
    assert batch.total_tokens == sum(lengths) and layout.rank == rank
    digest = layout_digest(batch.plan).hex()
    return {"step": batch.step, "digest": digest, "source": batch.source, "id": batch.plan.plan_id}


def _run_steps(
    rank: int, world: int, url: str, config: RepackLoaderConfig, steps: int, checkpoint_at: int
) -> dict[str, Any]:
    groups = RepackGroups(GroupConfig(world_size=world, gpus_per_node=GPUS)).setup()
    seen, state = [], None
    with _iterator(rank, url, config, groups, None) as it:
        for i, batch in enumerate(it):
            seen.append(_check_batch(batch, rank))
            if i + 1 == checkpoint_at:
                state = it.state_dict()
            if i + 1 == steps:
                break
        stats = it.client.stats if it.client is not None else None
    # Resume from the checkpoint in the same job: a new source, a new iterator.
    resumed = []
    with _iterator(rank, url, config, groups, None) as again:
        again.load_state_dict(state)
        for batch in again:
            resumed.append(_check_batch(batch, rank))
            if batch.step + 1 == steps:
                break
    return {"seen": seen, "resumed": resumed, "state": state, "stats": stats}


def _assert_same_plans_everywhere(results: list[dict[str, Any]], steps: int, at: int) -> None:
    digests = [[s["digest"] for s in r["seen"]] for r in results]
    assert all(d == digests[0] for d in digests) and len(digests[0]) == steps
    assert results[0]["state"]["step"] == at
    assert results[0]["state"]["source"] == {"batch": at}  # before the read-ahead
    for r in results:
        assert [s["step"] for s in r["resumed"]] == list(range(at, steps))
        assert [s["digest"] for s in r["resumed"]] == digests[0][at:]


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ServerThread]:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'plans.db'}", port=free_port(), log_level="warning"
    )
    server = ServerThread(settings).start()
    yield server
    server.stop()


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("background", [True, False])
def test_tokens_arrive_where_the_plan_says_with_a_real_service(
    service: ServerThread, background: bool
) -> None:
    config = _config(f"it-{background}", background=background, prefetch_depth=2)
    results = run_local_ranks(_run_steps, WORLD, service.url, config, 5, 2, timeout_s=240)
    _assert_same_plans_everywhere(results, 5, 2)
    assert [s["source"] for s in results[0]["seen"]] == ["service"] * 5
    assert all(s["source"] == "broadcast" for r in results[1:] for s in r["seen"])
    stats = results[0]["stats"]
    assert stats.service_plans >= 5 and stats.fallbacks == 0
    assert stats.prefetch_hits >= 5 and stats.prefetch_misses == 0  # every plan was prefetched
    # The resumed run got the service's stored plans back (idempotency), not new solves.
    ids = [s["id"] for s in results[0]["seen"]]
    assert [s["id"] for s in results[0]["resumed"]] == ids[2:]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_without_a_service_plans_come_from_the_fallback_and_say_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = _config("it-fallback", background=True, prefetch_depth=1)
    with caplog.at_level(logging.WARNING):
        results = run_local_ranks(_run_steps, WORLD, _closed_port_url(), config, 4, 3)
    _assert_same_plans_everywhere(results, 4, 3)
    assert [s["source"] for s in results[0]["seen"]] == ["fallback"] * 4
    assert results[0]["stats"].fallbacks >= 4 and results[0]["stats"].service_plans == 0
    # Identical to what the planner gives for the same request, in this process.
    request = config.request(3, [list(_source(r).samples(3).lengths) for r in range(WORLD)])
    assert results[0]["resumed"][0]["digest"] == layout_digest(local_plan(request)).hex()


def _train_and_compare(rank: int, world: int, url: str, config: RepackLoaderConfig) -> float:
    """One training step's loss through the iterator vs the single-process reference."""
    groups = RepackGroups(GroupConfig(world_size=world, gpus_per_node=GPUS)).setup()
    torch.manual_seed(0)
    model = ToyModel(CFG).double()
    with _iterator(rank, url, config, groups, 2) as it:
        batches = list(it)
    assert [b.step for b in batches] == [0, 1]  # the source ends: every rank stops together
    worst = 0.0
    for batch in batches:
        backend = VarlenRepackAttention(batch.comm, batch.full, batch.sparse, impl="sdpa")
        logits_NV = model(batch.tokens_N, batch.position_ids_N, backend)
        assert batch.labels_N is not None
        loss = F.cross_entropy(logits_NV, batch.labels_N, reduction="sum") / batch.total_tokens
        total = loss.detach().clone()
        dist.all_reduce(total)
        tokens_T, labels_T, lengths = _global_batch(batch.step)
        with torch.no_grad():
            ref = reference_forward(model, tokens_T, batch.layout.global_cu_seqlens)
            want = F.cross_entropy(ref, labels_T, reduction="sum") / sum(lengths)
        worst = max(worst, abs(total.item() - want.item()))
    return worst


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_model_through_the_iterator_matches_the_reference() -> None:
    config = _config("it-model", background=True, prefetch_depth=1)
    errors = run_local_ranks(_train_and_compare, WORLD, _closed_port_url(), config)
    assert max(errors) < 1e-9, errors


def test_rank_positions_match_every_ranks_layout() -> None:
    """The sender side (all ranks at once) agrees with LocalLayout (one rank at a time)."""
    for step in range(6):
        per_rank = [list(_source(r).samples(step).lengths) for r in range(WORLD)]
        for mode in ("repack", "repack+parent", "baseline"):
            plan = local_plan(_config("x", mode=mode).request(step, per_rank))
            positions = rank_token_positions(plan)
            for r in range(WORLD):
                want = LocalLayout.from_plan(plan, r).global_index_N
                assert positions[r].tolist() == want.tolist()


def test_request_carries_the_upstream_membership() -> None:
    config = RepackLoaderConfig(
        job_id="j", cluster=CLUSTER, model=MODEL, parent_sizes=(4, 4), mode="repack"
    )
    request = config.request(7, [[5], [], [3, 4], [9], [1], [2], [], [6]])
    assert request.lengths == [5, 3, 4, 9, 1, 2, 6]
    assert request.parent_of == [0, 0, 0, 0, 1, 1, 1]
    assert (request.job_id, request.step, request.parent_sizes) == ("j", 7, [4, 4])


def test_the_iterator_is_stateful_for_distributed_checkpoint() -> None:
    assert issubclass(RepackDataIterator, Stateful)
    assert not issubclass(RepackLoaderConfig, Stateful)  # the check can fail


def test_config_refuses_parents_that_do_not_tile_the_domain() -> None:
    with pytest.raises(ValueError, match="parent_sizes summing to 8"):
        RepackLoaderConfig(job_id="j", cluster=CLUSTER, model=MODEL, parent_sizes=(4,))
    with pytest.raises(ValueError, match="parent_sizes summing to 8"):
        RepackLoaderConfig(job_id="j", cluster=CLUSTER, model=MODEL, parent_sizes=())
    with pytest.raises(ValueError, match="prefetch_depth >= 0"):
        _config("j", prefetch_depth=-1)


def _mesh_run(rank: int, world: int, url: str) -> dict[str, Any]:
    """2 replicas x 4 ranks: each replica's iterator over its own domain and its own data."""
    mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "cp"))
    groups = RepackGroups.from_mesh(mesh, "cp", GroupConfig(world_size=4, gpus_per_node=4))
    groups.setup()
    replica, me = mesh.get_local_rank("dp"), groups.domain_rank
    cluster = ClusterSpec(nodes=1, gpus_per_node=4, max_tokens_per_rank=64)
    config = RepackLoaderConfig(
        job_id=f"mesh-r{replica}", cluster=cluster, model=MODEL, parent_sizes=(4,)
    )
    client = _client(url) if me == 0 else None
    source = _source(me, 3, seed=replica, parent=4)
    with RepackDataIterator(source, config, groups, client) as it:
        seen = [_check_batch(b, me, seed=replica, world=4) for b in it]
    return {"replica": replica, "digests": [s["digest"] for s in seen]}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_each_replica_of_a_mesh_runs_its_own_plans() -> None:
    results = run_local_ranks(_mesh_run, 8, _closed_port_url())
    by_replica = {r["replica"]: r["digests"] for r in results}
    assert [r["digests"] for r in results] == [by_replica[0]] * 4 + [by_replica[1]] * 4
    assert len(by_replica[0]) == 3 and by_replica[0] != by_replica[1]


def _failing_and_short(rank: int, world: int, url: str) -> dict[str, str]:
    """No service and no fallback: every rank's next() raises (helper thread and inline); then
    a rank whose data ends first stops every rank at the same step; checkpoints of another job,
    or loaded late, are refused."""
    groups = RepackGroups(GroupConfig(world_size=world, gpus_per_node=GPUS)).setup()
    failed = []
    for background in (True, False):
        config = _config(f"it-fail-{background}", background=background, prefetch_depth=1)
        client = None
        if rank == 0:
            client = PlanClient(PlanClientConfig(service_url=url, retries=0, fallback=False))
        with RepackDataIterator(_source(rank), config, groups, client) as it:
            try:
                next(it)
                failed.append("no error")
            except PlanServiceError as exc:
                failed.append(type(exc).__name__)
            with pytest.raises(StopIteration):  # no later step after an error
                next(it)
    client = _client(url) if rank == 0 else None
    short = _source(rank, steps=1 if rank == 3 else 4)
    with RepackDataIterator(short, _config("it-short"), groups, client) as it:
        with pytest.raises(ValueError, match="checkpoint is for job 'other'"):
            it.load_state_dict({"job_id": "other", "step": 0, "source": None})
        steps = [batch.step for batch in it]
        with pytest.raises(RuntimeError, match="before iterating"):
            it.load_state_dict(it.state_dict())
    return {"failed": str(failed), "steps": str(steps)}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_errors_and_the_end_of_data_reach_every_rank() -> None:
    results = run_local_ranks(_failing_and_short, WORLD, _closed_port_url(), timeout_s=200)
    assert [r["failed"] for r in results] == [str(["PlanServiceError"] * 2)] * WORLD
    assert [r["steps"] for r in results] == ["[0]"] * WORLD
