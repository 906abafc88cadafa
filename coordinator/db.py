"""The coordinator's database: engine set-up, migrations, readiness, and the chat tables.

SQLite (the default: ``<data_dir>/ongrid.db``) and PostgreSQL (``ONGRID_DATABASE_URL``) are
supported. The schema belongs to Alembic (``coordinator/migrations``): :func:`upgrade` brings a
database to the newest revision and is safe to run from several processes at once.
"""

from __future__ import annotations

import re
import sqlite3
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, cast, get_args

from alembic import command
from alembic.config import Config
from sqlalchemy import (
    CheckConstraint,
    Connection,
    Engine,
    ForeignKey,
    Index,
    MetaData,
    String,
    Text,
    create_engine,
    delete,
    event,
    func,
    select,
    text,
    update,
)
from sqlalchemy.engine import URL, CursorResult, make_url
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker
from sqlalchemy.pool import StaticPool

from registry.errors import NotFoundError, OngridError, UserError
from registry.settings import Settings
from registry.sql_store import AGENTS_METADATA, NAMING_CONVENTION, UtcDateTime, utcnow

__all__ = [
    "CHAT_METADATA",
    "TARGET_METADATA",
    "ChatMessage",
    "ChatSession",
    "ChatStore",
    "DatabaseUnavailable",
    "Role",
    "alembic_config",
    "check",
    "database_url",
    "locked_connection",
    "make_engine",
    "upgrade",
]

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
SQLITE_BUSY_TIMEOUT_MS = 30_000
#: Seconds a PostgreSQL connection attempt may take (readiness must answer quickly).
PG_CONNECT_TIMEOUT = 10
#: Key of the PostgreSQL advisory lock that serialises concurrent :func:`upgrade` calls.
_MIGRATION_LOCK_KEY = 0x6F6E_6772_6964  # "ongrid"

Role = Literal["user", "assistant", "system"]
ROLES: tuple[str, ...] = get_args(Role)
_SESSION_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class DatabaseUnavailable(OngridError):
    """The database cannot be reached (readiness fails; the message names the URL)."""


# -- engine ------------------------------------------------------------------------------------


def database_url(settings: Settings) -> str:
    """``settings.database_url``, else the SQLite file ``<data_dir>/ongrid.db`` (dir created)."""
    if settings.database_url:
        return _normalise(settings.database_url).render_as_string(hide_password=False)
    data_dir = settings.data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    return URL.create("sqlite+pysqlite", database=str(data_dir / "ongrid.db")).render_as_string()


def _normalise(url: str | URL) -> URL:
    """Pin the driver we ship: ``postgres://`` and ``postgresql://`` mean psycopg 3."""
    parsed = make_url(url)
    if parsed.drivername in {"postgres", "postgresql"}:
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def make_engine(url: str | URL) -> Engine:
    """An engine tuned for the backend: SQLite in WAL mode with a busy timeout and foreign keys
    on; PostgreSQL with pre-ping and a connect timeout."""
    parsed = _normalise(url)
    if parsed.get_backend_name() == "sqlite":
        return _sqlite_engine(parsed)
    kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if parsed.get_backend_name() == "postgresql":
        kwargs["connect_args"] = {
            key: value
            for key, value in {
                "connect_timeout": PG_CONNECT_TIMEOUT,
                "application_name": "ongrid",
            }.items()
            if key not in parsed.query
        }
    return create_engine(parsed, **kwargs)


def _sqlite_engine(url: URL) -> Engine:
    in_memory = url.database in (None, "", ":memory:")
    # One shared connection for an in-memory database: the default pool gives each thread its
    # own, i.e. its own empty database.
    engine = create_engine(
        url,
        connect_args={"check_same_thread": False},
        **({"poolclass": StaticPool} if in_memory else {}),
    )

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
            if not in_memory:
                _use_wal(cursor)
            cursor.execute("PRAGMA foreign_keys = ON")
        finally:
            cursor.close()

    return engine


def _use_wal(cursor: Any) -> None:
    """Switch the file to WAL mode, waiting for other connections like the busy timeout would.

    Changing the journal mode needs an exclusive lock, and SQLite answers "database is locked"
    at once instead of calling its busy handler when another connection holds one (another
    process migrating the same fresh file, say): retry until the busy timeout has passed.
    """
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            mode = cursor.execute("PRAGMA journal_mode").fetchone()[0]
            if str(mode).lower() != "wal":
                cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def check(engine: Engine) -> None:
    """Raise :class:`DatabaseUnavailable` unless a connection answers ``SELECT 1``."""
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except SQLAlchemyError as exc:
        reason = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or ["?"])[0]
        raise DatabaseUnavailable(
            f"database {engine.url.render_as_string(hide_password=True)} is unreachable: {reason}"
        ) from exc


# -- migrations --------------------------------------------------------------------------------


def alembic_config(url: str | URL | None = None) -> Config:
    """An Alembic config built in code (no ini file), pointing at the packaged migrations."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("path_separator", "os")
    config.set_main_option("file_template", "%%(rev)s_%%(slug)s")
    if url is not None:
        rendered = _normalise(url).render_as_string(hide_password=False)
        config.set_main_option("sqlalchemy.url", rendered.replace("%", "%%"))
    return config


def upgrade(target: Engine | str | URL, revision: str = "head") -> None:
    """Migrate the database to ``revision`` (default: the newest). Running it again is a no-op;
    concurrent runs wait for each other."""
    engine = target if isinstance(target, Engine) else make_engine(target)
    try:
        with locked_connection(engine) as conn:
            config = alembic_config()
            config.attributes["connection"] = conn
            command.upgrade(config, revision)
    finally:
        if engine is not target:
            engine.dispose()


@contextmanager
def locked_connection(engine: Engine) -> Iterator[Connection]:
    """A connection in one transaction that holds the migration lock, committed on success.

    PostgreSQL: a transaction-scoped advisory lock (DDL is transactional there). SQLite: ``BEGIN
    IMMEDIATE`` (the write lock, so the DDL is transactional too), with foreign keys off while
    it runs, as SQLite requires for rebuilding tables in batch migrations.
    """
    if engine.dialect.name != "sqlite":
        with engine.begin() as conn:
            if engine.dialect.name == "postgresql":
                conn.execute(select(func.pg_advisory_xact_lock(_MIGRATION_LOCK_KEY)))
            yield conn
        return
    with engine.connect() as base:
        conn = base.execution_options(isolation_level="AUTOCOMMIT")
        conn.exec_driver_sql("PRAGMA foreign_keys = OFF")
        try:
            conn.exec_driver_sql("BEGIN IMMEDIATE")
            try:
                yield conn
                broken = conn.exec_driver_sql("PRAGMA foreign_key_check").first()
                if broken is not None:
                    raise RuntimeError(f"migration left a broken foreign key: {tuple(broken)}")
            except BaseException:
                conn.exec_driver_sql("ROLLBACK")
                raise
            conn.exec_driver_sql("COMMIT")
        finally:
            conn.exec_driver_sql("PRAGMA foreign_keys = ON")


# -- chat sessions -----------------------------------------------------------------------------


class _Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UtcDateTime}


class _SessionRow(_Base):
    __tablename__ = "chat_sessions"
    __table_args__ = (Index("ix_chat_sessions_owner_updated_at", "owner", "updated_at"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    # Not "user": that is a reserved word in PostgreSQL (a bare `user` there is current_user).
    owner: Mapped[str] = mapped_column(String(255))
    title: Mapped[str] = mapped_column(Text, server_default="")
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(server_default=func.now())


class _MessageRow(_Base):
    __tablename__ = "chat_messages"
    __table_args__ = (
        CheckConstraint("role IN ('user', 'assistant', 'system')", name="role"),
        # Never reuse the id of a deleted message: ids are the order and may be referenced.
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    session_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("chat_sessions.id", ondelete="CASCADE"), index=True
    )
    role: Mapped[str] = mapped_column(String(16))
    content: Mapped[str] = mapped_column(Text)
    agent: Mapped[str | None] = mapped_column(String(255))
    spawn_id: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())


#: The chat tables' metadata, for Alembic.
CHAT_METADATA = _Base.metadata
#: Everything the migrations manage.
TARGET_METADATA: list[MetaData] = [AGENTS_METADATA, CHAT_METADATA]


@dataclass(frozen=True)
class ChatSession:
    """A conversation, owned by one user."""

    id: str
    user: str
    title: str
    created_at: datetime
    updated_at: datetime

    def as_dict(self) -> dict[str, Any]:
        return _jsonable(asdict(self))


@dataclass(frozen=True)
class ChatMessage:
    """One message of a session. ``agent``/``spawn_id`` link an answer to the spawn behind it."""

    id: int
    session_id: str
    role: str
    content: str
    agent: str | None
    spawn_id: str | None
    created_at: datetime

    def as_dict(self) -> dict[str, Any]:
        return _jsonable(asdict(self))


def _jsonable(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in data.items()}


def _session(row: _SessionRow) -> ChatSession:
    return ChatSession(row.id, row.owner, row.title, row.created_at, row.updated_at)


def _message(row: _MessageRow) -> ChatMessage:
    return ChatMessage(
        row.id, row.session_id, row.role, row.content, row.agent, row.spawn_id, row.created_at
    )


class ChatStore:
    """Chat sessions and their messages. Sessions are per user: another user's is invisible."""

    def __init__(self, engine: Engine) -> None:
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    def create_session(self, user: str, title: str = "", *, session_id: str | None = None) -> str:
        """Start a session and return its id (a fresh one unless ``session_id`` is given)."""
        sid = session_id or uuid.uuid4().hex
        if not _SESSION_ID.match(sid):
            raise UserError(f"chat session id {sid[:80]!r}: use 1-64 letters, digits, '_' or '-'")
        now = utcnow()
        row = _SessionRow(id=sid, owner=user, title=title, created_at=now, updated_at=now)
        try:
            with self._sessions.begin() as db:
                db.add(row)
        except IntegrityError:
            raise UserError(f"chat session {sid!r} already exists") from None
        return sid

    def get_session(self, session_id: str, user: str) -> ChatSession | None:
        """The session if it exists and belongs to ``user``; None otherwise (answer 404)."""
        with self._sessions() as db:
            row = db.get(_SessionRow, session_id)
        return _session(row) if row is not None and row.owner == user else None

    def list_sessions(self, user: str, *, limit: int = 100) -> list[ChatSession]:
        """``user``'s sessions, most recently active first."""
        query = (
            select(_SessionRow)
            .where(_SessionRow.owner == user)
            .order_by(_SessionRow.updated_at.desc(), _SessionRow.id)
            .limit(limit)
        )
        with self._sessions() as db:
            return [_session(row) for row in db.scalars(query)]

    def delete_session(self, session_id: str, user: str) -> bool:
        """Delete ``user``'s session and (by cascade) its messages; False if there was none."""
        query = delete(_SessionRow).where(_SessionRow.id == session_id, _SessionRow.owner == user)
        with self._sessions.begin() as db:
            return cast(CursorResult[Any], db.execute(query)).rowcount > 0

    def add_message(
        self,
        session_id: str,
        role: str,
        content: str,
        agent: str | None = None,
        spawn_id: str | None = None,
    ) -> ChatMessage:
        """Append a message and mark the session active. The caller has checked ownership."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
        now = utcnow()
        touch = update(_SessionRow).where(_SessionRow.id == session_id).values(updated_at=now)
        row = _MessageRow(
            session_id=session_id,
            role=role,
            content=content,
            agent=agent,
            spawn_id=spawn_id,
            created_at=now,
        )
        with self._sessions.begin() as db:
            if cast(CursorResult[Any], db.execute(touch)).rowcount == 0:
                raise NotFoundError("chat session", session_id)
            db.add(row)
        return _message(row)

    def messages(self, session_id: str) -> list[ChatMessage]:
        """The session's messages in the order they were added."""
        query = select(_MessageRow).where(_MessageRow.session_id == session_id)
        with self._sessions() as db:
            return [_message(row) for row in db.scalars(query.order_by(_MessageRow.id))]
