"""Where the API's database and Redis are, announced to the workers, which refuse to start
against a configuration that cannot work with it.

A worker on another host than the API must reach the same database (user personas, installed
plugins) and the same Redis (tasks, events, spawn records). Two mistakes leave a worker running
but useless: a SQLite URL (or none, which is the SQLite default) while the API is on PostgreSQL,
and a loopback address (``REDIS_URL`` unset means ``127.0.0.1``) for what the API reaches across
the network. Such a worker takes tasks nobody enqueues, or runs personas the API never sees.

- The API announces its :class:`Topology` at start and every :data:`ANNOUNCE_EVERY` seconds
  (:class:`ApiAnnouncer`): in its Redis under :data:`API_KEY` (expiring after
  :data:`ANNOUNCE_TTL` seconds) and in its database, row ``api`` of ``cluster_facts``.
- A worker reads the announcement from its own database and its own Redis before it builds its
  runtime (:func:`check_worker`) and stops, saying what to set, when its configuration cannot
  reach what the API uses.

An announcement found in a place is evidence that the place is the API's: the API writes only to
its own database and Redis. So the one read from the worker's database judges the worker's
Redis, and the one read from the worker's Redis judges the worker's database. A rule is not
applied when the place it judges holds the same announcement (the API's Redis, say, reached
through ``127.0.0.1`` on the API's own host while the API names it by its address).

Loopback means 127.0.0.0/8, ``::1``, ``localhost`` (and ``*.localhost``), the unspecified
address (which connects to this host) and Unix sockets; a host without a name is the client's
local default. Nothing is resolved over DNS: a name other than ``localhost`` counts as remote.
Nothing here holds a password: a topology keeps hosts, ports and names only.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, cast
from urllib.parse import urlsplit

import redis
from pydantic import AwareDatetime, BaseModel, ConfigDict, ValidationError
from redis.connection import parse_url
from sqlalchemy import Engine
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import SQLAlchemyError

from coordinator.storage.cluster import ClusterFacts
from coordinator.storage.columns import utcnow
from coordinator.storage.engine import Database, database_url
from registry.errors import UserError
from registry.settings import Settings
from workers.celery_app import DEFAULT_REDIS_URL

__all__ = [
    "ANNOUNCE_EVERY",
    "ANNOUNCE_TTL",
    "API_FACT",
    "API_KEY",
    "api_key",
    "CHECK_TIMEOUT",
    "Announcement",
    "ApiAnnouncer",
    "Topology",
    "TopologyMismatch",
    "check_worker",
    "is_loopback_host",
]

log = logging.getLogger(__name__)

#: The Redis key of the API's announcement, after the stack's key prefix: see :func:`api_key`.
API_KEY = "cluster:api"
#: The ``cluster_facts`` row of the API's announcement.
API_FACT = "api"
#: Seconds between two announcements of a running API.
ANNOUNCE_EVERY = 30.0
#: Seconds the Redis copy lives without a newer one (ten missed announcements).
ANNOUNCE_TTL = 300
#: Seconds a Redis client of this module waits to connect or for an answer.
CHECK_TIMEOUT = 2.0

_DEFAULT_PORTS = {"postgresql": 5432, "mysql": 3306, "mariadb": 3306, "mssql": 1433}
_DIALECT_NAMES = {
    "postgresql": "PostgreSQL",
    "mysql": "MySQL",
    "mariadb": "MariaDB",
    "mssql": "SQL Server",
    "oracle": "Oracle",
    "sqlite": "SQLite",
}


class TopologyMismatch(UserError):
    """A worker configured for another database or Redis than the API announced."""


def api_key(prefix: str = "ongrid:") -> str:
    """The Redis key of the API's announcement for a stack whose keys start with ``prefix``."""
    return prefix + API_KEY


def is_loopback_host(host: str | None) -> bool:
    """Whether a client given ``host`` stays on this machine. No DNS lookup is made."""
    if not host:
        return True  # no host: the client's local default (a Unix socket, or localhost)
    if host.startswith(("/", "@")):
        return True  # a Unix socket path (``@``: Linux's abstract namespace)
    name = host.strip("[]").rstrip(".").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(name.split("%", 1)[0])  # without an IPv6 zone
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
    # Connecting to the unspecified address (0.0.0.0, ::) reaches this host too.
    return address.is_loopback or address.is_unspecified


class Topology(BaseModel):
    """What a process's settings point at: the database and the Redis, without credentials."""

    model_config = ConfigDict(frozen=True, extra="ignore")  # a newer API may announce more

    #: The backend, without the driver: ``sqlite``, ``postgresql``, …
    database_dialect: str
    #: The server's host (several joined by ``,``; a Unix socket's directory), None for a file
    #: or the client's default.
    database_host: str | None = None
    database_port: int | None = None
    #: The database's name; for SQLite the file's path (None: in memory).
    database_name: str | None = None
    #: Whether only this host can reach it (always true for SQLite: a file is on one host).
    database_loopback: bool
    #: The Redis server's host, or the path of its Unix socket.
    redis_host: str
    #: The port; None for a Unix socket.
    redis_port: int | None = None
    redis_db: int = 0
    redis_tls: bool = False
    redis_loopback: bool

    @classmethod
    def from_settings(cls, settings: Settings) -> Topology:
        """The topology of the effective URLs: ``ONGRID_DATABASE_URL`` (or the SQLite file in
        the data directory) and ``REDIS_URL`` (or the default, on ``127.0.0.1``)."""
        return cls.from_urls(
            database_url(settings, create=False), settings.redis_url or DEFAULT_REDIS_URL
        )

    @classmethod
    def from_urls(cls, database: str | URL, redis_url: str) -> Topology:
        """The topology of a database URL and a Redis URL (both as the settings hold them)."""
        return cls.model_validate(
            {**_database_fields(make_url(database)), **_redis_fields(redis_url)}
        )

    # -- in words --------------------------------------------------------------------------

    @property
    def is_sqlite(self) -> bool:
        return self.database_dialect == "sqlite"

    def database_words(self) -> str:
        """The database for a sentence: ``the SQLite file …``, ``PostgreSQL at …``."""
        if self.is_sqlite:
            name = self.database_name
            return f"the SQLite file {name}" if name else "an in-memory SQLite database"
        dialect = _DIALECT_NAMES.get(self.database_dialect, self.database_dialect)
        return f"{dialect} at {self._database_address()}"

    def database_url_hint(self) -> str:
        """A database URL that reaches this database (without user and password)."""
        if self.is_sqlite:
            return f"sqlite:///{self.database_name or ''}"
        host = self.database_host or ""
        name = self.database_name or ""
        if host.startswith("/"):
            return f"{self.database_dialect}:///{name}?host={host}"
        return f"{self.database_dialect}://{_host_port(host, self.database_port)}/{name}"

    def redis_words(self) -> str:
        """Redis for a sentence: ``127.0.0.1:6379/0``, ``the Unix socket /run/… (db 0)``."""
        if self.redis_port is None:
            return f"the Unix socket {self.redis_host} (db {self.redis_db})"
        return f"{_host_port(self.redis_host, self.redis_port)}/{self.redis_db}"

    def redis_url_hint(self) -> str:
        """A Redis URL that reaches this Redis (without the password)."""
        if self.redis_port is None:
            return f"unix://{self.redis_host}?db={self.redis_db}"
        scheme = "rediss" if self.redis_tls else "redis"
        return f"{scheme}://{_host_port(self.redis_host, self.redis_port)}/{self.redis_db}"

    def _database_address(self) -> str:
        host = self.database_host or "the local socket"
        port = f":{self.database_port}" if self.database_port and self.database_host else ""
        if host.startswith("/"):
            host, port = f"the socket in {host}", ""
        return f"{host}{port}/{self.database_name or ''}"


def _host_port(host: str, port: int | None) -> str:
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"{shown}:{port}" if port else shown


def _database_fields(url: URL) -> dict[str, object]:
    dialect = url.get_backend_name()
    if dialect == "postgres":  # an alias the engine accepts (and pins to psycopg)
        dialect = "postgresql"
    if dialect == "sqlite":
        in_memory = url.database in (None, "", ":memory:")
        return {
            "database_dialect": dialect,
            "database_name": None if in_memory else url.database,
            "database_loopback": True,
        }
    hosts = _database_hosts(url)
    port = url.port or (_DEFAULT_PORTS.get(dialect) if hosts else None)
    return {
        "database_dialect": dialect,
        "database_host": ",".join(hosts) or None,
        "database_port": port,
        "database_name": url.database,
        "database_loopback": all(is_loopback_host(h) for h in hosts),
    }


def _database_hosts(url: URL) -> list[str]:
    """The URL's host, or those of its ``?host=`` (libpq's multi-host and socket form)."""
    if url.host:
        return [url.host]
    query = url.query.get("host")
    values = [query] if isinstance(query, str) else list(query or ())
    # ``host=a:5432`` (SQLAlchemy's multi-host form) and ``host=a,b`` (libpq's).
    found = [part for value in values for part in value.split(",") if part]
    return [_without_port(h) for h in found]


def _without_port(host: str) -> str:
    """``db:5432`` → ``db``; a socket path and a bare IPv6 address stay as they are."""
    if host.startswith("/") or host.count(":") != 1:
        return host
    return host.rsplit(":", 1)[0]


def _redis_fields(url: str) -> dict[str, object]:
    parts = parse_url(url)
    db = int(parts.get("db") or 0)
    if "path" in parts:  # unix://…
        return {"redis_host": parts["path"], "redis_db": db, "redis_loopback": True}
    host = str(parts.get("host") or "localhost")  # redis-py's own default
    return {
        "redis_host": host,
        "redis_port": int(parts.get("port") or 6379),
        "redis_db": db,
        "redis_tls": urlsplit(url).scheme == "rediss",
        "redis_loopback": is_loopback_host(host),
    }


# -- the API's announcement ------------------------------------------------------------------


class Announcement(BaseModel):
    """What the API tells the workers: its topology, the host it runs on, and when it said so."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    topology: Topology
    hostname: str
    announced_at: AwareDatetime


class ApiAnnouncer:
    """Announces the API's :class:`Topology` to its Redis and its database, now and every
    :data:`ANNOUNCE_EVERY` seconds, from a daemon thread. A failed write is logged (once per
    outage), never raised: the API starts and serves with either of them down."""

    def __init__(
        self, settings: Settings, database: Database, *, every: float = ANNOUNCE_EVERY
    ) -> None:
        self.topology = Topology.from_settings(settings)
        self.key = api_key(settings.key_prefix)
        self.hostname = socket.gethostname()
        self.every = every
        self._database = database
        self.redis = redis.Redis.from_url(
            settings.redis_url or DEFAULT_REDIS_URL,
            socket_connect_timeout=CHECK_TIMEOUT,
            socket_timeout=CHECK_TIMEOUT,
        )
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing: set[str] = set()

    def announce(self) -> Announcement:
        """Write one announcement to both places; returns it."""
        made = Announcement(topology=self.topology, hostname=self.hostname, announced_at=utcnow())
        text = made.model_dump_json()
        self._write("Redis", lambda: self.redis.set(self.key, text, ex=ANNOUNCE_TTL))

        def to_database() -> None:
            self._database.ensure()  # migrates once it answers (the table may be new)
            ClusterFacts(self._database.engine).put(API_FACT, text, made.announced_at)

        self._write("the database", to_database)
        return made

    def _write(self, place: str, write: Callable[[], object]) -> None:
        try:
            write()
        except Exception as exc:  # noqa: BLE001 - announcing must never stop the API
            if place not in self._failing:
                log.warning("cannot announce the API's topology to %s: %s", place, exc)
            self._failing.add(place)
            return
        if place in self._failing:
            log.info("the API's topology is announced to %s again", place)
            self._failing.discard(place)

    def start(self) -> ApiAnnouncer:
        self._thread = threading.Thread(target=self._run, name="cluster-announcer", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            self.announce()
            if self._stopping.wait(self.every):
                return

    def stop(self, timeout: float = 5.0) -> None:
        """Stop announcing (the last announcement stays: workers starting meanwhile still
        compare against it) and close the Redis client."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self.redis.close()


# -- the worker's check ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Found:
    announcement: Announcement
    #: Where it was read, for the message: ``this worker's database``, ``this worker's Redis``.
    where: Literal["database", "Redis"]


def check_worker(settings: Settings, engine: Engine, redis_client: redis.Redis) -> None:
    """Raise :class:`TopologyMismatch` when the worker of ``settings`` cannot work with the API
    whose announcement its database (``engine``, migrated) or its Redis holds.

    Refused: a SQLite database while the API's is not; a loopback database or Redis while the
    API's is not. Nothing announced, or a Redis that does not answer, passes: the runtime's own
    start reports an unreachable Redis.
    """
    mine = Topology.from_settings(settings)
    in_database = _from_database(engine)
    in_redis = _from_redis(redis_client, api_key(settings.key_prefix), mine)
    problems: list[str] = []
    # Each announcement judges the other place (its own place is the API's, as it was read there).
    if in_database is not None and not _same(in_redis, in_database):
        problems += _redis_problems(mine, in_database)
    if in_redis is not None and not _same(in_database, in_redis):
        problems += _database_problems(mine, in_redis)
    if problems:
        raise TopologyMismatch("; and ".join(problems))
    checked = [f.where for f in (in_database, in_redis) if f is not None]
    if checked:
        log.info(
            "the API's announcement (read from this worker's %s) agrees", " and ".join(checked)
        )


def _same(other: _Found | None, found: _Found) -> bool:
    """Whether the place ``found`` judges holds an announcement of the same topology (then that
    place is the API's, whatever name this worker reaches it by)."""
    return other is not None and other.announcement.topology == found.announcement.topology


def _from_database(engine: Engine) -> _Found | None:
    try:
        fact = ClusterFacts(engine).get(API_FACT)
    except SQLAlchemyError as exc:
        log.warning("cannot read the API's announcement from the database: %s", exc)
        return None
    return _parse(fact.value, "database") if fact is not None else None


def _from_redis(client: redis.Redis, key: str, mine: Topology) -> _Found | None:
    try:
        raw = cast("bytes | None", client.get(key))
    except redis.RedisError as exc:
        # Not this check's error: the runtime's start reports a Redis that does not answer.
        log.info("cannot read the API's announcement from Redis %s: %s", mine.redis_words(), exc)
        return None
    return _parse(raw, "Redis") if raw is not None else None


def _parse(raw: str | bytes, where: Literal["database", "Redis"]) -> _Found | None:
    try:
        return _Found(Announcement.model_validate_json(raw), where)
    except ValidationError as exc:
        log.warning("ignoring an unreadable API announcement in the %s: %s", where, exc)
        return None


def _source(found: _Found) -> str:
    made = found.announcement
    at = made.announced_at.strftime("%Y-%m-%d %H:%M:%S UTC")
    age = (utcnow() - made.announced_at).total_seconds()
    ago = f", {age:.0f} s ago" if age >= 0 else ""
    return f"(read from this worker's {found.where}, announced at {at}{ago})"


def _database_problems(mine: Topology, found: _Found) -> list[str]:
    api = found.announcement.topology
    host = found.announcement.hostname
    if mine.is_sqlite and not api.is_sqlite:
        return [
            f"this worker's database is {mine.database_words()}, but the API on {host} "
            f"announced {api.database_words()} {_source(found)}: a SQLite file is on one host, "
            "so this worker would read other personas and plugins than the API and keep what "
            "it writes where the API never looks; set ONGRID_DATABASE_URL to the API's "
            f"database, {api.database_url_hint()} (with the user and password the API uses)"
        ]
    if mine.database_loopback and not api.database_loopback:
        return [
            f"this worker's database is {mine.database_words()}, on this host only, but the "
            f"API on {host} announced {api.database_words()} {_source(found)}: this worker "
            "would read other personas and plugins than the API; set ONGRID_DATABASE_URL to "
            f"the API's database, {api.database_url_hint()} (with the user and password the "
            "API uses)"
        ]
    return []


def _redis_problems(mine: Topology, found: _Found) -> list[str]:
    api = found.announcement.topology
    host = found.announcement.hostname
    if mine.redis_loopback and not api.redis_loopback:
        return [
            f"this worker's Redis is {mine.redis_words()}, on this host only, but the API on "
            f"{host} announced its Redis at {api.redis_words()} {_source(found)}: this worker "
            "would take tasks from another Redis than the one the API enqueues them on, and "
            f"nobody would see its answers; set REDIS_URL={api.redis_url_hint()} (with the "
            "password, if that Redis has one)"
        ]
    return []
