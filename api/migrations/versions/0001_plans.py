"""The ``plans`` table as the service created it before migrations (``create_all``).

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "plans",
        sa.Column("plan_id", sa.String(300), primary_key=True),
        sa.Column("job_id", sa.String(200), nullable=True),
        sa.Column("step", sa.BigInteger(), nullable=True),
        sa.Column("request_digest", sa.String(64), nullable=False),
        sa.Column("mode", sa.String(32), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("stopped_by", sa.String(32), nullable=True),
        sa.Column("nodes", sa.Integer(), nullable=False),
        sa.Column("gpus_per_node", sa.Integer(), nullable=False),
        sa.Column("num_samples", sa.Integer(), nullable=False),
        sa.Column("step_time_ms", sa.Float(), nullable=False),
        sa.Column("baseline_step_time_ms", sa.Float(), nullable=False),
        sa.Column("speedup", sa.Float(), nullable=False),
        sa.Column("mfu", sa.Float(), nullable=False),
        sa.Column("baseline_mfu", sa.Float(), nullable=False),
        sa.Column("gap", sa.Float(), nullable=True),
        sa.Column("lower_bound_ms", sa.Float(), nullable=True),
        sa.Column("solve_ms", sa.Float(), nullable=True),
        sa.Column("lengths", sa.Text(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("job_id", "step", name="uq_plans_job_step"),
    )
    op.create_index("ix_plans_job_id", "plans", ["job_id"])


def downgrade() -> None:
    op.drop_table("plans")
