"""Alembic environment: runs on the connection ``api.migrate`` hands over (no ini file), so the
migrations work from an installed package as well as from the checkout."""

from __future__ import annotations

from alembic import context

from api.storage import Base

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
