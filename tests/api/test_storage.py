"""The plan repository on SQLite and PostgreSQL: immutable inserts, keyset pages."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import text

from api.storage import PlanKey, PlanRow, PlanStore, utcnow


@pytest.fixture
def store(db_url: str) -> Iterator[PlanStore]:
    s = PlanStore(db_url)
    s.migrate()
    yield s
    s.close()


def row(job_id: str | None, step: int | None, body: str = "{}", digest: str = "d") -> PlanRow:
    plan_id = f"{job_id}-{step}" if job_id is not None else f"anon-{body}"
    kind = "named" if step is not None else "anonymous"
    return PlanRow(
        kind=kind, plan_id=plan_id, job_id=job_id, step=step, request_digest=digest, mode="repack",
        status="optimal", stopped_by="optimal", nodes=1, gpus_per_node=8, num_samples=2,
        step_time_ms=10.0, baseline_step_time_ms=12.0 + (step or 0), speedup=1.2, mfu=0.4,
        baseline_mfu=0.33, gap=0.0, lower_bound_ms=10.0, solve_ms=1.5, lengths="[1,2]",
        body=body, created_at=utcnow(),
    )  # fmt: skip


def test_insert_is_first_writer_wins(store: PlanStore) -> None:
    first = store.insert(row("j", 0, body='{"a":1}', digest="one"))
    second = store.insert(row("j", 0, body='{"a":2}', digest="two"))
    assert first == second
    assert second.body == b'{"a":1}'
    assert second.request_digest == "one"
    assert store.get("j-0") == first
    assert store.get("missing") is None


def test_list_jobs_pages_by_job_id(store: PlanStore) -> None:
    for job in ("b", "a", "c"):
        for step in range(3):
            store.insert(row(job, step))
    store.insert(row(None, None, body="x"))  # anonymous plans belong to no job
    page = store.list_jobs(None, 2)
    assert [j.job_id for j in page] == ["a", "b"]
    assert (page[0].steps, page[0].first_step, page[0].last_step) == (3, 0, 2)
    assert page[0].mean_speedup == pytest.approx(1.2)
    assert page[0].last_created_at.tzinfo is not None
    assert [j.job_id for j in store.list_jobs("b", 2)] == ["c"]


def test_list_steps_pages_by_step(store: PlanStore) -> None:
    for step in (5, 1, 3, 2, 4):
        store.insert(row("j", step))
    assert [r.step for r in store.list_steps("j", None, 3)] == [1, 2, 3]
    rest = store.list_steps("j", 3, 3)
    assert [r.step for r in rest] == [4, 5]
    assert rest[0].baseline_step_time_ms == 16.0
    assert store.list_steps("other", None, 3) == []


def test_ping(store: PlanStore) -> None:
    store.ping()


def claim_owners(store: PlanStore) -> list[str]:
    with store.engine.connect() as conn:
        return [r[0] for r in conn.execute(text("SELECT owner FROM plan_claims"))]


def test_only_an_orphaned_claim_is_taken_over(store: PlanStore) -> None:
    key = PlanKey("named", "j-1")
    later = utcnow() + timedelta(seconds=30)
    assert store.claim(key, "p.0", later) is True
    assert store.claim(key, "q.0", later, lambda owner: owner == "p.9") is False
    assert store.claim(key, "p.1", later, lambda owner: owner == "p.0") is True
    assert claim_owners(store) == ["p.1"]
    store.release(key, "p.0")  # the orphan's late release leaves the new claim alone
    assert claim_owners(store) == ["p.1"]
    assert store.claim(key, "q.0", later) is False
    store.release(key, "p.1")
    assert store.claim(key, "q.0", later) is True


def test_taking_over_a_claim_whose_plan_exists_answers_the_plan(store: PlanStore) -> None:
    key = PlanKey("named", "j-2")
    assert store.claim(key, "p.0", utcnow() + timedelta(seconds=30)) is True
    stored = store.insert(row("j", 2))  # stored without dropping the claim
    claimed = store.claim(key, "p.1", utcnow() + timedelta(seconds=30), lambda o: o == "p.0")
    assert claimed == stored
    assert claim_owners(store) == []
