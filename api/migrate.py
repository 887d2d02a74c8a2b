"""Schema management: Alembic migrations shipped inside the package, applied at start-up.

Replicas starting together serialise on a PostgreSQL advisory lock, so exactly one of them
runs each migration. A database made by the service before migrations existed (a ``plans``
table and no ``alembic_version``) is stamped as revision 0001 and upgraded from there.
"""

from __future__ import annotations

from importlib.resources import files

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, inspect, text

MIGRATIONS = files("api") / "migrations"
BASELINE = "0001"
"""The revision that creates the table exactly as ``create_all`` did before migrations."""
MIGRATION_LOCK_ID = 0x7265_7061_636B
"""PostgreSQL advisory lock id held while migrating ("repack" in hex)."""


def alembic_config(connection: Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Migrate the database behind ``engine`` to ``revision`` (default: the newest)."""
    with engine.begin() as conn:
        postgres = conn.dialect.name == "postgresql"
        if postgres:
            conn.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": MIGRATION_LOCK_ID})
            # Migrations may rewrite tables: give them longer than a request's statement.
            conn.execute(text("SET LOCAL statement_timeout = 0; SET LOCAL lock_timeout = 0"))
        config = alembic_config(conn)
        tables = set(inspect(conn).get_table_names())
        if "plans" in tables and "alembic_version" not in tables:
            command.stamp(config, BASELINE)
        command.upgrade(config, revision)


def downgrade(engine: Engine, revision: str) -> None:
    """Undo migrations down to ``revision`` (operators rolling back a release)."""
    with engine.begin() as conn:
        command.downgrade(alembic_config(conn), revision)
