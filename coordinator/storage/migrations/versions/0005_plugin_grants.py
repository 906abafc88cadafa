"""What an install grants a plugin beyond its allowed mode: the network and a writable folder.

Both default to false: a plugin installed before this revision keeps running with neither.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("installed_plugins") as table:
        table.add_column(
            sa.Column("network", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        table.add_column(
            sa.Column("writable", sa.Boolean(), nullable=False, server_default=sa.false())
        )


def downgrade() -> None:
    with op.batch_alter_table("installed_plugins") as table:
        table.drop_column("writable")
        table.drop_column("network")
