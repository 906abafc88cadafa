"""User personas in the database: the ``agents`` table behind :class:`AgentRegistry`.

A row holds the persona in its file format (:func:`registry.parser.dump_persona`), so the disk and
the database share one representation and a round trip keeps every field, unknown keys and the
body byte for byte. A row that no longer parses (the format moved on, someone edited it by hand)
is skipped by :meth:`SqlUserStore.list` and reported by :meth:`SqlUserStore.problems` instead of
breaking the registry.

Only SQLite and PostgreSQL are supported. Concurrent writers are settled by the database, never by
a read beforehand:

- :meth:`SqlUserStore.create` is a plain ``INSERT``: of several creates of one name, the primary
  key lets exactly one through and the others raise :class:`PersonaExists`;
- :meth:`SqlUserStore.update` reads, changes and writes the row in one transaction that holds
  its lock (PostgreSQL: ``SELECT … FOR UPDATE``; SQLite: ``BEGIN IMMEDIATE``), so concurrent
  changes wait for each other and each applies to what the previous one left: two concurrent
  changes of different fields both land;
- :meth:`SqlUserStore.upsert` is one ``INSERT … ON CONFLICT DO UPDATE`` whose ``revision =
  revision + 1`` is atomic under concurrent writers on both backends.

:class:`GuardedUserStore` is what the API and workers use: it outlives a database outage.
:class:`ReadOnlyUserStore` is what commands that only read use: it creates and migrates nothing.
"""

from __future__ import annotations

import builtins
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Integer, MetaData, String, Text, delete, func, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import CursorResult, Engine, make_url
from sqlalchemy.exc import IntegrityError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

from coordinator.storage.columns import NAMING_CONVENTION, UtcDateTime, utcnow
from coordinator.storage.engine import (
    SQLITE_BUSY_TIMEOUT_MS,
    Database,
    DatabaseUnavailable,
    database_url,
    head_revision,
    lock_timed_out,
    open_read_only,
    schema_revision,
    write_transaction,
)
from registry.errors import FieldProblem, NotFoundError, PersonaError, ReadOnlyError, UserError
from registry.parser import dump_persona, parse_persona
from registry.persona import Persona, Source
from registry.settings import Settings

__all__ = [
    "AGENTS_METADATA",
    "MAX_NAME_LENGTH",
    "AgentRow",
    "GuardedUserStore",
    "PersonaBusy",
    "PersonaExists",
    "ReadOnlyUserStore",
    "SqlUserStore",
    "StoredPersona",
]

#: Longest persona name the ``agents.name`` column holds.
MAX_NAME_LENGTH = 255
#: What a unique violation looks like: PostgreSQL's SQLSTATE, SQLite's extended error names.
_PG_UNIQUE_VIOLATION = "23505"
_SQLITE_UNIQUE = frozenset({"SQLITE_CONSTRAINT_PRIMARYKEY", "SQLITE_CONSTRAINT_UNIQUE"})


class PersonaExists(UserError):
    """A create found a user persona of that name already stored (HTTP 409)."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"agent {name!r} already exists as a user persona: change it with "
            f"PATCH /v1/agents/custom/{name}, or DELETE it first"
        )


class PersonaBusy(UserError):
    """An update waited too long for another change of the persona to finish (HTTP 409)."""

    def __init__(self, name: str, waited_ms: int) -> None:
        self.name = name
        super().__init__(
            f"agent {name!r} is being changed by someone else and stayed locked for "
            f"{waited_ms / 1000:g} s; nothing was written: retry"
        )


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

    def __init__(self, engine: Engine, *, lock_timeout_ms: int = SQLITE_BUSY_TIMEOUT_MS) -> None:
        """``lock_timeout_ms``: how long :meth:`update` waits for another change of the same
        persona to finish."""
        dialect = engine.dialect.name
        if dialect not in _INSERTS:
            raise UserError(
                f"database {engine.url!r} uses {dialect!r}; the persona store supports "
                "sqlite and postgresql only"
            )
        self._engine = engine
        self._lock_timeout_ms = lock_timeout_ms
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

    def create(self, persona: Persona, user: str = "") -> None:
        """Store a new persona; :class:`PersonaExists` if one of that name is stored already.

        A plain ``INSERT``: of concurrent creates of one name the database lets exactly one in.
        """
        try:
            with self._sessions.begin() as session:
                session.execute(insert(AgentRow).values(**_new_row(persona, user)))
        except IntegrityError as exc:
            if _unique_violation(exc):
                raise PersonaExists(persona.name) from None
            raise

    def update(
        self, name: str, change: Callable[[Persona], Persona], user: str = ""
    ) -> StoredPersona:
        """Replace a stored persona with ``change(current)``, without losing concurrent updates.

        The row is locked, read, changed and written in one transaction
        (:func:`~coordinator.storage.engine.write_transaction`): concurrent updates wait for
        each other, each applies ``change`` to what the previous one left, and ``revision``
        counts every one. :class:`NotFoundError` if there is no such row (one deleted meanwhile
        included: a deleted persona is never brought back); :class:`PersonaBusy` when the lock
        was not granted within the store's ``lock_timeout_ms``. Whatever ``change`` raises goes
        through, with nothing written. Returns the row as written.
        """
        query = select(AgentRow.__table__).where(AgentRow.name == name).with_for_update()
        try:
            with write_transaction(self._engine, self._lock_timeout_ms) as conn:
                row = conn.execute(query).mappings().first()
                if row is None:
                    raise NotFoundError("user persona", name)
                changed = change(_parse(name, row["markdown"]))
                if changed.name != name:
                    problem = FieldProblem("name", "cannot be changed; create a new persona")
                    raise PersonaError([problem])
                now = utcnow()
                conn.execute(
                    update(AgentRow)
                    .where(AgentRow.name == name)
                    .values(
                        markdown=dump_persona(changed),
                        updated_by=user,
                        updated_at=now,
                        revision=row["revision"] + 1,
                    )
                )
        except OperationalError as exc:
            if lock_timed_out(exc):
                raise PersonaBusy(name, self._lock_timeout_ms) from None
            raise
        return StoredPersona(
            persona=changed.model_copy(update={"source": Source.USER, "path": None}),
            revision=row["revision"] + 1,
            created_by=row["created_by"],
            updated_by=user,
            created_at=row["created_at"],
            updated_at=now,
        )

    def upsert(self, persona: Persona, user: str = "") -> None:
        """Create the persona or replace it, bumping ``revision`` atomically."""
        stmt = self._insert(AgentRow).values(**_new_row(persona, user))
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


def _new_row(persona: Persona, user: str) -> dict[str, Any]:
    if len(persona.name) > MAX_NAME_LENGTH:
        raise UserError(
            f"persona name {persona.name[:40]!r}… is longer than {MAX_NAME_LENGTH} characters"
        )
    now = utcnow()
    return {
        "name": persona.name,
        "markdown": dump_persona(persona),
        "created_by": user,
        "updated_by": user,
        "created_at": now,
        "updated_at": now,
        "revision": 1,
    }


def _unique_violation(exc: IntegrityError) -> bool:
    orig = exc.orig
    return (
        getattr(orig, "sqlstate", None) == _PG_UNIQUE_VIOLATION
        or getattr(orig, "sqlite_errorname", None) in _SQLITE_UNIQUE
    )


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

    def create(self, persona: Persona, user: str = "") -> None:
        self._db.ensure()
        self._store.create(persona, user)

    def update(
        self, name: str, change: Callable[[Persona], Persona], user: str = ""
    ) -> StoredPersona:
        self._db.ensure()
        return self._store.update(name, change, user)

    def upsert(self, persona: Persona, user: str = "") -> None:
        self._db.ensure()
        self._store.upsert(persona, user)

    def delete(self, name: str) -> bool:
        self._db.ensure()
        return self._store.delete(name)


class ReadOnlyUserStore:
    """User personas for a command that only reads them: it creates and migrates nothing.

    No database yet (the SQLite file does not exist): no user personas, and nothing is made.
    A database whose schema is not at this version's revision is read anyway when its table
    is there, with a warning; an unreachable one is a warning too. Writes are refused.
    """

    def __init__(self, engine: Engine | None, label: str = "") -> None:
        """``label``: the database as warnings name it (default: the engine's URL)."""
        self._engine = engine
        self._store = SqlUserStore(engine) if engine is not None else None
        self._label = label or (engine.url.render_as_string(hide_password=True) if engine else "")
        self._notes: builtins.list[tuple[str, str]] = []

    @classmethod
    def open(cls, settings: Settings) -> ReadOnlyUserStore:
        """The store of ``settings``' database, opened so that it cannot write."""
        url = make_url(database_url(settings, create=False))
        return cls(open_read_only(settings), url.render_as_string(hide_password=True))

    def summary(self, count: int) -> str:
        """Where the ``count`` user personas shown were read from, or why none were: a command
        run outside the data directory's parent otherwise leaves them out without a word."""
        if self._engine is None:
            return (
                f"user personas: none read, no database at {self._label} (set ONGRID_DATA_DIR "
                "or ONGRID_DATABASE_URL to the one the API uses)"
            )
        return f"user personas: {count} read from {self._label}"

    def list(self) -> builtins.list[Persona]:
        self._notes = []
        if self._engine is None or self._store is None:
            return []
        url = self._label
        try:
            revision, head = schema_revision(self._engine), head_revision()
            if revision is None:
                self._notes.append(("*", f"database {url} has no schema yet: {_MIGRATES}"))
                return []
            if revision != head:
                self._notes.append(
                    (
                        "*",
                        f"database {url} is at schema revision {revision}, this version "
                        f"expects {head}: {_MIGRATES}; user personas are read as they are",
                    )
                )
            return self._store.list()
        except SQLAlchemyError as exc:
            reason = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or ["?"])[0]
            self._notes.append(("*", f"user personas could not be read from {url}: {reason}"))
            return []

    def problems(self) -> builtins.list[tuple[str, str]]:
        stored = self._store.problems() if self._store is not None else []
        return stored + self._notes

    def close(self) -> None:
        """Close the store's connections."""
        if self._engine is not None:
            self._engine.dispose()

    def upsert(self, persona: Persona, user: str = "") -> None:
        raise ReadOnlyError(f"the user personas were opened read-only: {persona.name!r} not saved")

    def delete(self, name: str) -> bool:
        raise ReadOnlyError(f"the user personas were opened read-only: {name!r} not deleted")


_MIGRATES = "`ongrid api` and `ongrid worker` migrate it when they start"
