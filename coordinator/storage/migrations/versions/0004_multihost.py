"""Several hosts: ``plugin_archives`` (installed plugins for every host) and ``cluster_facts``.

An installed plugin's files were only in the marketplace root of the host that installed it;
every other host now unpacks them from ``plugin_archives``. ``cluster_facts`` holds what a
process announces to the others (the API's view of the database and Redis), so a worker
configured for another cluster is refused at start.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "plugin_archives",
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("directory", sa.String(255), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("archive", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_plugin_archives")),
    )
    op.create_table(
        "cluster_facts",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_cluster_facts")),
    )


def downgrade() -> None:
    op.drop_table("cluster_facts")
    op.drop_table("plugin_archives")
