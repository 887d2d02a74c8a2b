"""Schema managed by Alembic on SQLite and PostgreSQL: upgrade from nothing, from a database
made before migrations (rows kept, key namespaces assigned), and down/up again."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, inspect, text

from api import migrate
from api.profile_store import ProfileStore
from api.storage import PlanKey, PlanStore


def legacy_rows(url: str) -> None:
    """The database as the service left it before migrations: ``plans`` with a named and an
    anonymous plan (revision 0001 is that table, exactly)."""
    engine = create_engine(url)
    migrate.upgrade(engine, "0001")
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE alembic_version"))
        for plan_id, job, step in (("j-1", "j", 1), ("repack-00ab", None, None)):
            conn.execute(
                text(
                    "INSERT INTO plans (plan_id, job_id, step, request_digest, mode, status, "
                    "nodes, gpus_per_node, num_samples, step_time_ms, baseline_step_time_ms, "
                    "speedup, mfu, baseline_mfu, lengths, body, created_at) VALUES (:p, :j, :s, "
                    "'d', 'repack', 'optimal', 1, 8, 2, 1, 1, 1, 0.5, 0.5, '[1]', :b, "
                    "'2026-01-01 00:00:00+00')"
                ),
                {"p": plan_id, "j": job, "s": step, "b": f'{{"id":"{plan_id}"}}'},
            )
    engine.dispose()


def test_fresh_database_reaches_head(db_url: str) -> None:
    store = PlanStore(db_url)
    store.migrate()
    assert migrate.current_revision(store.engine) == migrate.head_revision()
    tables = set(inspect(store.engine).get_table_names())
    assert {"plans", "plan_claims", "alembic_version"} <= tables
    indexes = {ix["name"] for ix in inspect(store.engine).get_indexes("plans")}
    assert "ix_plans_created_at" in indexes
    store.migrate()  # idempotent: a second start changes nothing
    store.close()


def test_pre_migration_database_is_upgraded_with_its_rows(db_url: str) -> None:
    legacy_rows(db_url)
    store = PlanStore(db_url)
    store.migrate()
    assert migrate.current_revision(store.engine) == migrate.head_revision()
    named = store.get_key(PlanKey("named", "j-1"))
    anonymous = store.get_key(PlanKey("anonymous", "repack-00ab"))
    assert named is not None and named.body == b'{"id":"j-1"}'
    assert anonymous is not None and anonymous.body == b'{"id":"repack-00ab"}'
    assert store.get_key(PlanKey("anonymous", "j-1")) is None
    store.close()


def test_downgrade_and_upgrade_again(db_url: str) -> None:
    store = PlanStore(db_url)
    store.migrate()
    migrate.downgrade(store.engine, "0001")
    assert migrate.current_revision(store.engine) == "0001"
    store.migrate()
    assert migrate.current_revision(store.engine) == migrate.head_revision()
    store.close()


@pytest.mark.parametrize("revision", ["0002", "0003", "0004", "0005"])
def test_each_migration_has_a_file_in_the_package(revision: str) -> None:
    names = [p.name for p in (migrate.MIGRATIONS / "versions").iterdir()]
    assert any(n.startswith(revision) for n in names)


CALIBRATION_TABLES = {"profiles", "step_requests", "measurements", "job_feedback", "job_profiles"}


def test_calibration_tables_come_from_migration_0005(db_url: str) -> None:
    store = PlanStore(db_url)
    store.migrate()
    assert set(inspect(store.engine).get_table_names()) >= CALIBRATION_TABLES
    profiles = ProfileStore(store.engine)  # works on the migrated schema, no create_all
    stored, created = profiles.put_profile("lab", {"collective_latency_us": 5.0})
    assert created and profiles.get_profile("lab") == stored
    migrate.downgrade(store.engine, "0004")
    assert not CALIBRATION_TABLES & set(inspect(store.engine).get_table_names())
    store.migrate()
    assert profiles.get_profile("lab") is None  # the downgrade dropped it; the tables are back
    store.close()
