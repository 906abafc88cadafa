"""The audit trail of approvals: ``approval_audit``.

Revision ID: 0002
Revises: 0001
Create Date: 2025-02-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "approval_audit",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("spawn_id", sa.String(255), nullable=False),
        sa.Column("session_id", sa.String(255), nullable=False),
        sa.Column("call_id", sa.Text(), nullable=False),
        sa.Column("tool", sa.Text(), nullable=False),
        sa.Column("args_hash", sa.Text(), nullable=False),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("role", sa.Text(), nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.Column("feed_epoch", sa.String(64), nullable=True),
        sa.Column("feed_seq", sa.Integer(), nullable=True),
        sa.CheckConstraint(
            "action IN ('requested', 'approved', 'denied', 'expired', 'refused')",
            name=op.f("ck_approval_audit_action"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_approval_audit")),
        sa.UniqueConstraint(
            "feed_epoch", "feed_seq", name=op.f("uq_approval_audit_feed_epoch_feed_seq")
        ),
        sqlite_autoincrement=True,
    )
    op.create_index(op.f("ix_approval_audit_at"), "approval_audit", ["at"])
    op.create_index(op.f("ix_approval_audit_spawn_id_at"), "approval_audit", ["spawn_id", "at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_approval_audit_spawn_id_at"), table_name="approval_audit")
    op.drop_index(op.f("ix_approval_audit_at"), table_name="approval_audit")
    op.drop_table("approval_audit")
