"""What one process tells the others through the database: the ``cluster_facts`` table.

A fact is a named JSON value and the time it was last written; the API writes its view of the
database and Redis under ``api`` (:mod:`coordinator.topology`), so a worker on another host can
compare it with its own before it takes work. Each write replaces the row (an upsert).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, MetaData, String, Text, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

from coordinator.storage.columns import NAMING_CONVENTION, UtcDateTime, utcnow

__all__ = ["CLUSTER_METADATA", "ClusterFact", "ClusterFacts"]


class _Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UtcDateTime}


class _FactRow(_Base):
    __tablename__ = "cluster_facts"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    #: JSON text; its shape belongs to whoever writes the fact.
    value: Mapped[str] = mapped_column(Text)
    updated_at: Mapped[datetime] = mapped_column()


#: The table's metadata, for Alembic.
CLUSTER_METADATA = _Base.metadata

#: Backends whose ``INSERT … ON CONFLICT DO UPDATE`` writes a fact in one statement.
_UPSERTS: dict[str, Any] = {"postgresql": postgresql.insert, "sqlite": sqlite.insert}


@dataclass(frozen=True)
class ClusterFact:
    """One row: the fact's JSON text and when it was written (aware, UTC)."""

    name: str
    value: str
    updated_at: datetime


class ClusterFacts:
    """Reads and writes ``cluster_facts``. Each method is one transaction."""

    def __init__(self, engine: Engine) -> None:
        self._dialect = engine.dialect.name
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    def put(self, name: str, value: str, at: datetime | None = None) -> None:
        """Write ``value`` (JSON text) under ``name``, replacing what was there."""
        values = {"name": name, "value": value, "updated_at": at or utcnow()}
        upsert = _UPSERTS.get(self._dialect)
        with self._sessions.begin() as db:
            if upsert is None:  # another backend: two statements, in one transaction
                db.merge(_FactRow(**values))
                return
            stmt = upsert(_FactRow).values(**values)
            stmt = stmt.on_conflict_do_update(
                index_elements=["name"],
                set_={"value": stmt.excluded.value, "updated_at": stmt.excluded.updated_at},
            )
            db.execute(stmt)

    def get(self, name: str) -> ClusterFact | None:
        """The fact written under ``name``, or None when none was."""
        with self._sessions() as db:
            row = db.scalars(select(_FactRow).where(_FactRow.name == name)).first()
            return ClusterFact(row.name, row.value, row.updated_at) if row is not None else None
