"""The initial schema: user personas (``agents``) and chat sessions and messages.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _timestamp(name: str) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False)


def upgrade() -> None:
    op.create_table(
        "agents",
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("markdown", sa.Text(), nullable=False),
        sa.Column("created_by", sa.String(255), server_default="", nullable=False),
        sa.Column("updated_by", sa.String(255), server_default="", nullable=False),
        _timestamp("created_at"),
        _timestamp("updated_at"),
        sa.Column("revision", sa.Integer(), server_default="1", nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_agents")),
    )
    op.create_table(
        "chat_sessions",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("owner", sa.String(255), nullable=False),
        sa.Column("title", sa.Text(), server_default="", nullable=False),
        _timestamp("created_at"),
        _timestamp("updated_at"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_chat_sessions")),
    )
    op.create_index(
        op.f("ix_chat_sessions_owner_updated_at"), "chat_sessions", ["owner", "updated_at"]
    )
    op.create_table(
        "chat_messages",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("session_id", sa.String(64), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("agent", sa.String(255), nullable=True),
        sa.Column("spawn_id", sa.String(64), nullable=True),
        _timestamp("created_at"),
        sa.CheckConstraint(
            "role IN ('user', 'assistant', 'system')", name=op.f("ck_chat_messages_role")
        ),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["chat_sessions.id"],
            name=op.f("fk_chat_messages_session_id_chat_sessions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_chat_messages")),
        sqlite_autoincrement=True,
    )
    op.create_index(op.f("ix_chat_messages_session_id"), "chat_messages", ["session_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_chat_messages_session_id"), table_name="chat_messages")
    op.drop_table("chat_messages")
    op.drop_index(op.f("ix_chat_sessions_owner_updated_at"), table_name="chat_sessions")
    op.drop_table("chat_sessions")
    op.drop_table("agents")
