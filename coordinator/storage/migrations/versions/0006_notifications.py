"""The notification outbox: ``notification_deliveries`` and ``notification_feeds``.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "notification_deliveries",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("source", sa.String(255), nullable=False),
        sa.Column("channel", sa.String(255), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("spawn_id", sa.String(255), nullable=False),
        sa.Column("session_id", sa.String(255), nullable=False),
        sa.Column("owner", sa.Text(), nullable=False),
        sa.Column("persona", sa.Text(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('pending', 'sent', 'failed')",
            name=op.f("ck_notification_deliveries_status"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_notification_deliveries")),
        sa.UniqueConstraint("source", name=op.f("uq_notification_deliveries_source")),
    )
    op.create_index(
        op.f("ix_notification_deliveries_status_next_attempt_at"),
        "notification_deliveries",
        ["status", "next_attempt_at"],
    )
    op.create_index(
        op.f("ix_notification_deliveries_created_at"), "notification_deliveries", ["created_at"]
    )
    op.create_table(
        "notification_feeds",
        sa.Column("feed", sa.String(32), nullable=False),
        sa.Column("epoch", sa.String(64), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("feed", name=op.f("pk_notification_feeds")),
    )


def downgrade() -> None:
    op.drop_table("notification_feeds")
    op.drop_index(
        op.f("ix_notification_deliveries_created_at"), table_name="notification_deliveries"
    )
    op.drop_index(
        op.f("ix_notification_deliveries_status_next_attempt_at"),
        table_name="notification_deliveries",
    )
    op.drop_table("notification_deliveries")
