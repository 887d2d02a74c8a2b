"""Measured steps through ``RepackDataIterator`` on forked gloo ranks: every step's times reach
the real service (uvicorn) once, keyed by the job and step, with the plan that ran; a gone
service or no reporter never stops training."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import torch.nn.functional as F

from api.server import ServerThread, free_port
from api.settings import Settings
from runtime_client.data_iterator import RepackDataIterator, RepackLoaderConfig
from runtime_client.groups import GroupConfig, RepackGroups
from runtime_client.local_launch import run_local_ranks
from runtime_client.measurements import MeasurementReporter, ReporterConfig
from runtime_client.plan_client import PlanClient, PlanClientConfig
from runtime_client.step_timer import StepTimer
from runtime_client.toy_data import ToySampleSource
from runtime_client.toy_model import ToyConfig, ToyModel, VarlenRepackAttention
from solver.schema import ClusterSpec, ModelSpec

WORLD, GPUS = 4, 2
STEPS = 3
CFG = ToyConfig(heads=8, kv_heads=4, head_dim=8, hidden=32, layers=4, window=16)
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
CLUSTER = ClusterSpec(nodes=WORLD // GPUS, gpus_per_node=GPUS, max_tokens_per_rank=64)


def _train(rank: int, world: int, url: str, job_id: str, report: bool) -> dict[str, Any]:
    """``STEPS`` training steps through the iterator with a timer on every rank and the
    reporter on rank 0 (when ``report``); the plans that ran and what the reporter counted."""
    groups = RepackGroups(GroupConfig(world_size=world, gpus_per_node=GPUS)).setup()
    config = RepackLoaderConfig(
        job_id=job_id, cluster=CLUSTER, model=MODEL, parent_sizes=(WORLD,), prefetch_depth=1
    )
    source = ToySampleSource(rank=rank, parent_size=WORLD, tokens_per_parent=160, longest=120)
    client = None
    if rank == 0:
        client = PlanClient(PlanClientConfig(service_url=url, timeout_s=10.0, retries=0))
    reporter = None
    if rank == 0 and report:
        reporter = MeasurementReporter(ReporterConfig(service_url=url, backoff_s=0.01))
    torch.manual_seed(0)
    model = ToyModel(CFG)
    timer = StepTimer().attach(model.blocks, [CFG.pattern[i % 4] for i in range(CFG.layers)])
    predicted = []
    with RepackDataIterator(
        source, config, groups, client, timer=timer, reporter=reporter
    ) as batches:
        for batch in batches:
            backend = VarlenRepackAttention(batch.comm, batch.full, batch.sparse, impl="sdpa")
            logits_NV = model(batch.tokens_N, batch.position_ids_N, backend)
            assert batch.labels_N is not None
            F.cross_entropy(logits_NV, batch.labels_N).backward()
            predicted.append(batch.plan.metrics.step_time_ms)
            if batch.step + 1 == STEPS:
                break
    stats = None
    if reporter is not None:
        reporter.close()  # waits for the queued posts
        stats = (reporter.stats.posted, reporter.stats.failed)
    if client is not None:
        client.close()
    return {"predicted": predicted, "stats": stats}


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
def test_every_step_is_measured_once_in_the_service(service: ServerThread) -> None:
    results = run_local_ranks(_train, WORLD, service.url, "measured-job", True, timeout_s=240)
    assert results[0]["stats"] == (STEPS, 0)
    listed = httpx.get(f"{service.url}/v1/jobs/measured-job/measurements", timeout=30).json()
    steps = listed["steps"]
    assert [s["step"] for s in steps] == list(range(STEPS))
    for s in steps:
        assert s["measured_ms"] > 0 and s["all_to_all_ms"] > 0
        layers = s["layers"]
        assert layers["full_ms"] > 0 and layers["sparse_ms"] > 0
        # each is a max over the ranks of a part of that rank's step (the all-to-all time is
        # twice the forward exchanges', an estimate, so it is not bounded by the step here)
        assert max(layers["full_ms"], layers["sparse_ms"]) <= s["measured_ms"]
    # stored beside the plan that ran at that step
    assert [s["predicted_ms"] for s in steps] == pytest.approx(results[0]["predicted"])
    # One measurement per (job, step): a different one for a stored step is refused.
    again = httpx.post(
        f"{service.url}/v1/jobs/measured-job/steps/0/measurements",
        json={"step_time_ms": 1.0},
        timeout=30,
    )
    assert again.status_code == 409


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_no_reporter_or_a_gone_service_never_stops_training() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: plans fall back, posts fail
    gone = run_local_ranks(_train, WORLD, url, "gone", True, timeout_s=240)
    silent = run_local_ranks(_train, WORLD, url, "silent", False, timeout_s=240)
    assert all(len(r["predicted"]) == STEPS for r in gone + silent)
    assert gone[0]["stats"] == (0, STEPS)  # counted, not raised
    assert silent[0]["stats"] is None
