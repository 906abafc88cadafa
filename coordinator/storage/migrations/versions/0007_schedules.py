"""Scheduled investigations: ``schedules`` and ``schedule_runs``.

One run row per schedule and due time (unique), so a due time fired twice starts one spawn.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("persona", sa.String(255), nullable=False),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("context", sa.JSON(), nullable=False),
        sa.Column("cron", sa.String(255), nullable=True),
        sa.Column("interval_seconds", sa.Float(), nullable=True),
        sa.Column("owner", sa.String(255), nullable=False),
        sa.Column("role", sa.String(255), nullable=False),
        sa.Column("budget", sa.JSON(), nullable=True),
        sa.Column("channels", sa.JSON(), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("created_by", sa.String(255), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_schedules")),
    )
    op.create_table(
        "schedule_runs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("schedule", sa.String(63), nullable=False),
        sa.Column("due_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("spawn_id", sa.String(64), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["schedule"],
            ["schedules.name"],
            name=op.f("fk_schedule_runs_schedule_schedules"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_schedule_runs")),
        sa.UniqueConstraint("schedule", "due_at", name=op.f("uq_schedule_runs_schedule_due_at")),
        sqlite_autoincrement=True,
    )
    op.create_index(op.f("ix_schedule_runs_schedule"), "schedule_runs", ["schedule"])


def downgrade() -> None:
    op.drop_index(op.f("ix_schedule_runs_schedule"), table_name="schedule_runs")
    op.drop_table("schedule_runs")
    op.drop_table("schedules")
