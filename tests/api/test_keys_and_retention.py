"""Key namespaces (a named key never meets an anonymous one), per-job delete and retention,
over real HTTP on SQLite and PostgreSQL."""

from __future__ import annotations

import time
from datetime import timedelta

import httpx

from api.server import ServerThread
from api.storage import PlanKey, PlanRow, PlanStore, utcnow
from tests.api.conftest import ServerFactory, small_request


def store_of(server: ServerThread) -> PlanStore:
    store: PlanStore = server.server.config.app.state.service.db.store
    return store


def stored_row(kind: str, plan_id: str, job_id: str | None, step: int | None, age_days: float
               ) -> PlanRow:  # fmt: skip
    return PlanRow(
        kind=kind, plan_id=plan_id, job_id=job_id, step=step, request_digest="other",
        mode="repack", status="optimal", stopped_by="optimal", nodes=1, gpus_per_node=8,
        num_samples=2, step_time_ms=1.0, baseline_step_time_ms=1.0, speedup=1.0, mfu=0.5,
        baseline_mfu=0.5, gap=0.0, lower_bound_ms=1.0, solve_ms=1.0, lengths="[1,2]",
        body=f'{{"plan_id":"{plan_id}"}}', created_at=utcnow() - timedelta(days=age_days),
    )  # fmt: skip


def test_named_and_anonymous_keys_never_collide(client: httpx.Client, server: ServerThread
                                                ) -> None:  # fmt: skip
    # An anonymous plan whose id is exactly what the named key (job "repack", step 7) reads.
    store_of(server).insert(stored_row("anonymous", "repack-7", None, None, 0))
    named = client.post("/v1/plans", json=small_request("repack", 7))
    assert named.status_code == 200, named.text  # not an unrelated 409
    assert named.headers["x-repack-plan-source"] == "solved"
    assert client.get("/v1/plans/repack-7").content == named.content  # named wins the id
    store = store_of(server)
    assert store.get_key(PlanKey("anonymous", "repack-7")) is not None
    assert store.get_key(PlanKey("named", "repack-7")) is not None


def test_delete_job(client: httpx.Client) -> None:
    for step in range(3):
        assert client.post("/v1/plans", json=small_request("gone", step)).status_code == 200
    kept = client.post("/v1/plans", json=small_request("kept", 0))
    assert client.get("/v1/plans/gone-0").status_code == 200  # now in the memory cache
    r = client.delete("/v1/jobs/gone")
    assert r.status_code == 204
    assert client.get("/v1/jobs/gone/steps").status_code == 404
    assert client.get("/v1/plans/gone-0").status_code == 404
    assert client.delete("/v1/jobs/gone").status_code == 404
    assert client.get("/v1/plans/kept-0").content == kept.content
    # The key is free again: another body for it is a new plan, not a conflict.
    other = small_request("gone", 0, lengths=[1000, 2000])
    assert client.post("/v1/plans", json=other).status_code == 200


def test_retention_deletes_old_plans_only(db_url: str, start_server: ServerFactory) -> None:
    server = start_server(db_url, solver_workers=1, retention_days=1, retention_interval_s=0.2)
    store = store_of(server)
    store.insert(stored_row("named", "old-1", "old", 1, age_days=3))
    store.insert(stored_row("anonymous", "repack-0ld", None, None, age_days=2))
    with httpx.Client(base_url=server.url, timeout=60) as c:
        fresh = c.post("/v1/plans", json=small_request("fresh", 0))
        assert fresh.status_code == 200
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and store.get_key(PlanKey("named", "old-1")):
            time.sleep(0.1)
        assert store.get_key(PlanKey("named", "old-1")) is None
        assert store.get_key(PlanKey("anonymous", "repack-0ld")) is None
        assert c.get("/v1/plans/fresh-0").content == fresh.content


def test_retention_sweep_in_batches(db_url: str) -> None:
    store = PlanStore(db_url)
    store.migrate()
    for i in range(5):
        store.insert(stored_row("named", f"b-{i}", "b", i, age_days=10))
    store.insert(stored_row("named", "b-9", "b", 9, age_days=0))
    cutoff = utcnow() - timedelta(days=1)
    assert store.delete_older_than(cutoff, batch=2) == 2
    assert store.delete_older_than(cutoff, batch=2) == 2
    assert store.delete_older_than(cutoff, batch=2) == 1
    assert store.delete_older_than(cutoff, batch=2) == 0
    assert [r.step for r in store.list_steps("b", None, 10)] == [9]
    store.close()
