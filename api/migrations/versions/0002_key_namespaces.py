"""Separate key namespaces: ``kind`` is ``named`` ((job_id, step)) or ``anonymous``
({mode}-{digest}); the primary key becomes (kind, plan_id). Existing rows get their kind from
whether they carry a step (the rule the plan id was made by).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import warnings

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("plans", sa.Column("kind", sa.String(16), nullable=False, server_default="named"))
    op.execute(
        "UPDATE plans SET kind = CASE WHEN job_id IS NOT NULL AND step IS NOT NULL "
        "THEN 'named' ELSE 'anonymous' END"
    )
    if op.get_bind().dialect.name == "sqlite":
        # SQLite cannot change a primary key: batch mode copies the table. The reflected
        # plan_id still says primary_key, which SQLAlchemy warns about; the new key is right.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*_alembic_tmp_plans.*primary_key")
            with op.batch_alter_table("plans", recreate="always") as batch:
                batch.create_primary_key("pk_plans", ["kind", "plan_id"])
    else:
        op.drop_constraint("plans_pkey", "plans", type_="primary")
        op.create_primary_key("plans_pkey", "plans", ["kind", "plan_id"])


def downgrade() -> None:
    op.execute("DELETE FROM plans WHERE kind = 'anonymous' AND plan_id IN "
               "(SELECT plan_id FROM plans WHERE kind = 'named')")  # fmt: skip
    if op.get_bind().dialect.name == "sqlite":
        with op.batch_alter_table("plans", recreate="always") as batch:
            batch.drop_column("kind")
            batch.create_primary_key("pk_plans", ["plan_id"])
    else:
        op.drop_constraint("plans_pkey", "plans", type_="primary")
        op.drop_column("plans", "kind")
        op.create_primary_key("plans_pkey", "plans", ["plan_id"])
