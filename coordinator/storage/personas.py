"""User personas in the database: the ``agents`` table behind :class:`AgentRegistry`.

A row holds the persona in its file format (:func:`registry.parser.dump_persona`), so the disk and
the database share one representation and a round trip keeps every field, unknown keys and the
body byte for byte. A row that no longer parses (the format moved on, someone edited it by hand)
is skipped by :meth:`SqlUserStore.list` and reported by :meth:`SqlUserStore.problems` instead of
breaking the registry.

Only SQLite and PostgreSQL are supported: an upsert is one ``INSERT … ON CONFLICT DO UPDATE``
statement whose ``revision = revision + 1`` is atomic under concurrent writers on both.

:class:`GuardedUserStore` is what the API and workers use: it outlives a database outage.
"""

from __future__ import annotations

import builtins
import threading
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Integer, MetaData, String, Text, delete, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import CursorResult, Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

from coordinator.storage.columns import NAMING_CONVENTION, UtcDateTime, utcnow
from coordinator.storage.engine import Database, DatabaseUnavailable
from registry.errors import FieldProblem, PersonaError, UserError
from registry.parser import dump_persona, parse_persona
from registry.persona import Persona, Source

__all__ = [
    "AGENTS_METADATA",
    "MAX_NAME_LENGTH",
    "AgentRow",
    "GuardedUserStore",
    "SqlUserStore",
    "StoredPersona",
]

#: Longest persona name the ``agents.name`` column holds.
MAX_NAME_LENGTH = 255

_INSERTS: dict[str, Any] = {"postgresql": postgresql.insert, "sqlite": sqlite.insert}


class _Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UtcDateTime}


class AgentRow(_Base):
    """One user persona, as the text of its file."""

    __tablename__ = "agents"

    name: Mapped[str] = mapped_column(String(MAX_NAME_LENGTH), primary_key=True)
    markdown: Mapped[str] = mapped_column(Text, doc="The persona in file format (dump_persona).")
    created_by: Mapped[str] = mapped_column(String(255), server_default="")
    updated_by: Mapped[str] = mapped_column(String(255), server_default="")
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(server_default=func.now())
    revision: Mapped[int] = mapped_column(
        Integer, server_default="1", doc="1 on creation, +1 on every upsert."
    )


#: The ``agents`` table's metadata, for Alembic (see ``coordinator/storage/migrations``).
AGENTS_METADATA = _Base.metadata


@dataclass(frozen=True)
class StoredPersona:
    """A user persona with its bookkeeping columns."""

    persona: Persona
    revision: int
    created_by: str
    updated_by: str
    created_at: datetime
    updated_at: datetime


class SqlUserStore:
    """A :class:`registry.agent_registry.UserStore` over the ``agents`` table.

    Each call is one short transaction; the store keeps no cache, so every process sharing the
    database sees the same personas after its registry reloads.
    """

    def __init__(self, engine: Engine) -> None:
        dialect = engine.dialect.name
        if dialect not in _INSERTS:
            raise UserError(
                f"database {engine.url!r} uses {dialect!r}; the persona store supports "
                "sqlite and postgresql only"
            )
        self._insert = _INSERTS[dialect]
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        self._problems: tuple[tuple[str, str], ...] = ()
        self._problems_lock = threading.Lock()

    def list(self) -> list[Persona]:
        """Every persona that still loads, by name. Rows that do not load go to :meth:`problems`."""
        with self._sessions() as session:
            rows = session.execute(
                select(AgentRow.name, AgentRow.markdown).order_by(AgentRow.name)
            ).all()
        personas: list[Persona] = []
        problems: list[tuple[str, str]] = []
        for name, markdown in rows:
            try:
                personas.append(_parse(name, markdown))
            except PersonaError as exc:
                problems.append((name, f"stored persona does not load and is skipped: {exc}"))
        with self._problems_lock:
            self._problems = tuple(problems)
        return personas

    def problems(self) -> builtins.list[tuple[str, str]]:
        """``(name, reason)`` for each row the last :meth:`list` skipped."""
        with self._problems_lock:
            return list(self._problems)

    def get(self, name: str) -> StoredPersona | None:
        """One persona with its revision and authorship; None if absent.

        Raises :class:`PersonaError` if the stored text no longer loads.
        """
        with self._sessions() as session:
            row = session.get(AgentRow, name)
        if row is None:
            return None
        return StoredPersona(
            persona=_parse(row.name, row.markdown),
            revision=row.revision,
            created_by=row.created_by,
            updated_by=row.updated_by,
            created_at=row.created_at,
            updated_at=row.updated_at,
        )

    def upsert(self, persona: Persona, user: str = "") -> None:
        """Create the persona or replace it, bumping ``revision`` atomically."""
        if len(persona.name) > MAX_NAME_LENGTH:
            raise UserError(
                f"persona name {persona.name[:40]!r}… is longer than {MAX_NAME_LENGTH} characters"
            )
        now = utcnow()
        stmt = self._insert(AgentRow).values(
            name=persona.name,
            markdown=dump_persona(persona),
            created_by=user,
            updated_by=user,
            created_at=now,
            updated_at=now,
            revision=1,
        )
        stmt = stmt.on_conflict_do_update(
            index_elements=[AgentRow.name],
            set_={
                "markdown": stmt.excluded.markdown,
                "updated_by": stmt.excluded.updated_by,
                "updated_at": stmt.excluded.updated_at,
                "revision": AgentRow.revision + 1,
            },
        )
        with self._sessions.begin() as session:
            session.execute(stmt)

    def delete(self, name: str) -> bool:
        """Delete one persona; False if there was none of that name."""
        with self._sessions.begin() as session:
            result = session.execute(delete(AgentRow).where(AgentRow.name == name))
        return cast(CursorResult[Any], result).rowcount > 0


def _parse(name: str, markdown: str) -> Persona:
    persona = parse_persona(markdown).persona
    if persona.name != name:
        raise PersonaError([FieldProblem("name", f"is {persona.name!r}, but the row is {name!r}")])
    return persona.model_copy(update={"source": Source.USER})


class GuardedUserStore:
    """A :class:`SqlUserStore` that outlives a database outage.

    While the database cannot be read, :meth:`list` returns the personas it read last and
    :meth:`problems` says so (it shows in ``GET /api/v1/agents/warnings``); writes fail with
    :class:`DatabaseUnavailable` (HTTP 503).
    """

    def __init__(self, store: SqlUserStore, database: Database) -> None:
        self._store, self._db = store, database
        self._last: builtins.list[Persona] = []
        self._outage: str | None = None

    def list(self) -> builtins.list[Persona]:
        try:
            self._db.ensure()
            personas = self._store.list()
        except (DatabaseUnavailable, SQLAlchemyError) as exc:
            self._outage = f"user personas could not be read ({exc}); showing the last ones read"
            return list(self._last)
        self._last, self._outage = personas, None
        return personas

    def problems(self) -> builtins.list[tuple[str, str]]:
        outage = [("*", self._outage)] if self._outage else []
        return self._store.problems() + outage

    def get(self, name: str) -> StoredPersona | None:
        self._db.ensure()
        return self._store.get(name)

    def upsert(self, persona: Persona, user: str = "") -> None:
        self._db.ensure()
        self._store.upsert(persona, user)

    def delete(self, name: str) -> bool:
        self._db.ensure()
        return self._store.delete(name)
