"""The coordinator's database: engine set-up, migrations and readiness.

SQLite (the default: ``<data_dir>/ongrid.db``) and PostgreSQL (``ONGRID_DATABASE_URL``) are
supported. The schema belongs to Alembic (``coordinator/storage/migrations``): :func:`upgrade`
brings a database to the newest revision and is safe to run from several processes at once.
:class:`Database` migrates on first contact, for processes that start while the database is down.

Commands that only read (``ongrid agents list``) use :func:`open_read_only`: it creates no
directory and no file, and its connections cannot write.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from alembic import command
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import (
    Connection,
    Engine,
    create_engine,
    event,
    func,
    select,
    text,
)
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import StaticPool

from registry.errors import OngridError
from registry.settings import Settings

__all__ = [
    "Database",
    "DatabaseUnavailable",
    "alembic_config",
    "check",
    "database_url",
    "head_revision",
    "lock_timed_out",
    "locked_connection",
    "make_engine",
    "open_read_only",
    "schema_revision",
    "upgrade",
    "write_transaction",
]

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
SQLITE_BUSY_TIMEOUT_MS = 30_000
#: Seconds a PostgreSQL connection attempt may take (readiness must answer quickly).
PG_CONNECT_TIMEOUT = 10
#: Key of the PostgreSQL advisory lock that serialises concurrent :func:`upgrade` calls.
_MIGRATION_LOCK_KEY = 0x6F6E_6772_6964  # "ongrid"
#: PostgreSQL's SQLSTATE for a lock not granted within ``lock_timeout``.
_PG_LOCK_NOT_AVAILABLE = "55P03"


class DatabaseUnavailable(OngridError):
    """The database cannot be reached (readiness fails; the message names the URL)."""


# -- engine ------------------------------------------------------------------------------------


def database_url(settings: Settings, *, create: bool = True) -> str:
    """``settings.database_url``, else the SQLite file ``<data_dir>/ongrid.db``.

    ``create`` (the default, for processes that write) makes the data directory; without it
    nothing is made, and the file may not exist.
    """
    if settings.database_url:
        return _normalise(settings.database_url).render_as_string(hide_password=False)
    data_dir = settings.data_dir.resolve()
    if create:
        data_dir.mkdir(parents=True, exist_ok=True)
    return URL.create("sqlite+pysqlite", database=str(data_dir / "ongrid.db")).render_as_string()


def open_read_only(settings: Settings) -> Engine | None:
    """An engine on the database of ``settings`` whose connections cannot write, or None when
    there is nothing to read: the SQLite file does not exist. Creates nothing."""
    url = _normalise(database_url(settings, create=False))
    sqlite_file = url.get_backend_name() == "sqlite" and not _in_memory(url)
    if sqlite_file and not Path(str(url.database)).is_file():
        return None
    return make_engine(url, read_only=True)


def _normalise(url: str | URL) -> URL:
    """Pin the driver we ship: ``postgres://`` and ``postgresql://`` mean psycopg 3."""
    parsed = make_url(url)
    if parsed.drivername in {"postgres", "postgresql"}:
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def make_engine(url: str | URL, *, read_only: bool = False) -> Engine:
    """An engine tuned for the backend: SQLite in WAL mode (``synchronous=NORMAL``) with a busy
    timeout and foreign keys on; PostgreSQL with pre-ping and a connect timeout.

    ``read_only``: connections that cannot write (SQLite: the file opened ``mode=ro``, which
    must exist, and its journal mode left alone; PostgreSQL: read-only transactions).
    """
    parsed = _normalise(url)
    if parsed.get_backend_name() == "sqlite":
        return _sqlite_engine(parsed, read_only=read_only)
    kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if parsed.get_backend_name() == "postgresql":
        wanted: dict[str, Any] = {
            "connect_timeout": PG_CONNECT_TIMEOUT,
            "application_name": "ongrid",
        }
        if read_only:
            wanted["options"] = "-c default_transaction_read_only=on"
        kwargs["connect_args"] = {k: v for k, v in wanted.items() if k not in parsed.query}
    return create_engine(parsed, **kwargs)


def _in_memory(url: URL) -> bool:
    return url.database in (None, "", ":memory:")


def _sqlite_engine(url: URL, *, read_only: bool = False) -> Engine:
    in_memory = _in_memory(url)
    if read_only and not in_memory:
        # SQLite's URI form is the only way to open a file without creating it or writing to it.
        path = Path(str(url.database)).resolve().as_posix()
        url = url.set(database=f"file:{quote(path)}", query={"mode": "ro", "uri": "true"})
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
            if read_only:
                cursor.execute("PRAGMA query_only = ON")
            elif not in_memory:
                _use_wal(cursor)
                # WAL's own recommendation: no fsync per commit, only at checkpoints. A crash
                # of the process loses nothing and the file stays consistent whatever happens;
                # a power cut or kernel crash may undo the last commits. The fsync per commit
                # was 0.3-0.5 ms of an API process's CPU per chat; PostgreSQL is the database
                # for a fleet whose every commit must survive the host.
                cursor.execute("PRAGMA synchronous = NORMAL")
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


def head_revision() -> str:
    """The schema revision this version of the code migrates to."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:
        raise RuntimeError(f"no migrations in {MIGRATIONS_DIR}")
    return head


def schema_revision(engine: Engine) -> str | None:
    """The revision the database is at; None when it was never migrated. Only reads."""
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


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


@contextmanager
def write_transaction(
    engine: Engine, lock_timeout_ms: int = SQLITE_BUSY_TIMEOUT_MS
) -> Iterator[Connection]:
    """A transaction for a read-modify-write, committed on success, rolled back on error.

    SQLite: ``BEGIN IMMEDIATE``, i.e. the database's write lock from the start (a deferred
    transaction that reads first could not upgrade to writing once another writer committed).
    PostgreSQL: a plain transaction whose ``SELECT … FOR UPDATE`` takes the row lock. Either way
    waiting for a lock is bounded by ``lock_timeout_ms``; past it the driver raises
    ``OperationalError`` (see :func:`lock_timed_out`).
    """
    if engine.dialect.name != "sqlite":
        with engine.begin() as conn:
            if engine.dialect.name == "postgresql":
                conn.execute(text(f"SET LOCAL lock_timeout = {int(lock_timeout_ms)}"))
            yield conn
        return
    with engine.connect() as base:
        conn = base.execution_options(isolation_level="AUTOCOMMIT")
        conn.exec_driver_sql(f"PRAGMA busy_timeout = {int(lock_timeout_ms)}")
        try:
            conn.exec_driver_sql("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.exec_driver_sql("ROLLBACK")
                raise
            conn.exec_driver_sql("COMMIT")
        finally:
            conn.exec_driver_sql(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")


def lock_timed_out(exc: SQLAlchemyError) -> bool:
    """Whether ``exc`` says a lock was not granted in time (PostgreSQL's ``lock_timeout``,
    SQLite's busy timeout)."""
    orig = getattr(exc, "orig", None)
    if getattr(orig, "sqlstate", None) == _PG_LOCK_NOT_AVAILABLE:
        return True
    return getattr(orig, "sqlite_errorname", None) in {"SQLITE_BUSY", "SQLITE_LOCKED"}


class Database:
    """The engine plus "is the schema there": migrated once, on first contact."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._migrated = False
        self._lock = threading.Lock()

    def ensure(self) -> None:
        """Reachable and migrated, or :class:`DatabaseUnavailable` naming the URL and why."""
        if self._migrated:
            return
        with self._lock:
            if self._migrated:
                return
            check(self.engine)
            try:
                upgrade(self.engine)
            except SQLAlchemyError as exc:
                reason = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or ["?"])[0]
                raise DatabaseUnavailable(f"database migration failed: {reason}") from exc
            self._migrated = True

    def ready(self) -> None:
        """For ``/readyz``: a live ``SELECT 1`` every time, then the migration if still due."""
        check(self.engine)
        self.ensure()
