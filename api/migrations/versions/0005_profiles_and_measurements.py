"""Calibration and measured feedback: named profiles, the request each job step was planned
with, measured steps, a job's opt-in settings and its refitted profile versions.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

TABLES = ("job_profiles", "job_feedback", "measurements", "step_requests", "profiles")


def upgrade() -> None:
    op.create_table(
        "profiles",
        sa.Column("name", sa.String(100), primary_key=True),
        sa.Column("version", sa.Integer, primary_key=True),
        sa.Column("digest", sa.String(32), nullable=False),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "step_requests",
        sa.Column("job_id", sa.String(200), primary_key=True),
        sa.Column("step", sa.BigInteger, primary_key=True),
        sa.Column("plan_id", sa.String(300), nullable=False),
        sa.Column("profile_version", sa.Integer, nullable=True),
        sa.Column("request", sa.Text, nullable=False),
    )
    op.create_table(
        "measurements",
        sa.Column("job_id", sa.String(200), primary_key=True),
        sa.Column("step", sa.BigInteger, primary_key=True),
        sa.Column("digest", sa.String(32), nullable=False),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("step_time_ms", sa.Float, nullable=False),
        sa.Column("all_to_all_ms", sa.Float, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "job_feedback",
        sa.Column("job_id", sa.String(200), primary_key=True),
        sa.Column("enabled", sa.Boolean, nullable=False),
        sa.Column("config", sa.Text, nullable=False),
        sa.Column("base_profile", sa.Text, nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "job_profiles",
        sa.Column("job_id", sa.String(200), primary_key=True),
        sa.Column("version", sa.Integer, primary_key=True),
        sa.Column("from_step", sa.BigInteger, nullable=False),
        sa.Column("steps_used", sa.Integer, nullable=False),
        sa.Column("error_before", sa.Float, nullable=False),
        sa.Column("error_after", sa.Float, nullable=False),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    for table in TABLES:
        op.drop_table(table)
