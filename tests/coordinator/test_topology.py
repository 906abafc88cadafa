"""The API's announced topology and the worker's check against it.

Against a real Redis (database 9) and real databases (a migrated SQLite file; PostgreSQL when it
answers): announcements are written where the API writes them, and read back by the check.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
import redis_server
from fastapi.testclient import TestClient
from harness import wait_for
from postgres import fresh_database
from sqlalchemy import Engine

from coordinator.api.app import create_app
from coordinator.storage.cluster import ClusterFacts
from coordinator.storage.columns import utcnow
from coordinator.storage.engine import Database, make_engine, upgrade
from coordinator.topology import (
    ANNOUNCE_TTL,
    API_FACT,
    Announcement,
    ApiAnnouncer,
    Topology,
    TopologyMismatch,
    api_key,
    check_worker,
    is_loopback_host,
)
from registry.errors import UserError
from registry.settings import Settings

REDIS_URL = redis_server.url(9)
#: A password in the API's URLs; no announcement and no message may carry it.
SECRET = "s3cret-Pw"
API_HOST = "api-7.example"


@pytest.fixture
def redis_client() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'worker.db'}"


@pytest.fixture
def sqlite_engine(sqlite_url: str) -> Iterator[Engine]:
    engine = make_engine(sqlite_url)
    upgrade(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def pg_url(postgres_admin: tuple[Engine | None, str]) -> Iterator[str]:
    admin, reason = postgres_admin
    if admin is None:
        pytest.skip(reason)
    with fresh_database(admin, "ongrid_topology") as url:
        yield url


@pytest.fixture
def pg_engine(pg_url: str) -> Iterator[Engine]:
    engine = make_engine(pg_url)
    upgrade(engine)
    yield engine
    engine.dispose()


def _settings(database_url: str, redis_url: str = REDIS_URL, **more: Any) -> Settings:
    return Settings(database_url=database_url, redis_url=redis_url, **more)


def _announcement(database_url: str, redis_url: str, **changes: Any) -> Announcement:
    made = Announcement(
        topology=Topology.from_urls(database_url, redis_url),
        hostname=API_HOST,
        announced_at=utcnow() - timedelta(seconds=5),
    )
    return made.model_copy(update=changes)


def _to_redis(client: redis.Redis, made: Announcement) -> None:
    client.set(api_key(), made.model_dump_json(), ex=ANNOUNCE_TTL)


def _to_database(engine: Engine, made: Announcement) -> None:
    ClusterFacts(engine).put(API_FACT, made.model_dump_json(), made.announced_at)


def _refusal(settings: Settings, engine: Engine, client: redis.Redis) -> str:
    with pytest.raises(TopologyMismatch) as caught:
        check_worker(settings, engine, client)
    message = str(caught.value)
    assert SECRET not in message
    return message


# -- parsing -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        (None, True),
        ("", True),
        ("127.0.0.1", True),
        ("127.10.20.30", True),
        ("::1", True),
        ("[::1]", True),
        ("::ffff:127.0.0.1", True),
        ("localhost", True),
        ("LOCALHOST.", True),
        ("redis.localhost", True),
        ("0.0.0.0", True),
        ("/var/run/postgresql", True),
        ("10.0.0.5", False),
        ("192.168.1.20", False),
        ("fd00::5", False),
        ("fe80::1%eth0", False),
        ("db.example", False),
        ("localhost.example", False),
        ("redis", False),  # a Compose service name: nothing is resolved
    ],
)
def test_loopback_hosts_are_told_apart_without_dns(host: str | None, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            f"postgresql+psycopg://ongrid:{SECRET}@db.example:5433/ongrid",
            ("postgresql", "db.example", 5433, "ongrid", False),
        ),
        ("postgres://u@10.0.0.7/app", ("postgresql", "10.0.0.7", 5432, "app", False)),
        ("postgresql://u@localhost/app", ("postgresql", "localhost", 5432, "app", True)),
        ("postgresql://u@[::1]:5432/app", ("postgresql", "::1", 5432, "app", True)),
        ("postgresql://u@[fd00::7]/app", ("postgresql", "fd00::7", 5432, "app", False)),
        ("postgresql:///app", ("postgresql", None, None, "app", True)),
        (
            "postgresql:///app?host=/var/run/postgresql",
            ("postgresql", "/var/run/postgresql", 5432, "app", True),
        ),
        (
            "postgresql://u@/app?host=db1:5432&host=127.0.0.1:5432",
            ("postgresql", "db1,127.0.0.1", 5432, "app", False),
        ),
        ("mysql+pymysql://u:p@mysql.example/app", ("mysql", "mysql.example", 3306, "app", False)),
        ("sqlite:////srv/ongrid/ongrid.db", ("sqlite", None, None, "/srv/ongrid/ongrid.db", True)),
        ("sqlite:///relative.db", ("sqlite", None, None, "relative.db", True)),
        ("sqlite://", ("sqlite", None, None, None, True)),
        ("sqlite:///:memory:", ("sqlite", None, None, None, True)),
    ],
)
def test_database_urls(url: str, expected: tuple[Any, ...]) -> None:
    found = Topology.from_urls(url, REDIS_URL)
    got = (
        found.database_dialect,
        found.database_host,
        found.database_port,
        found.database_name,
        found.database_loopback,
    )
    assert got == expected
    assert SECRET not in found.model_dump_json()


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://127.0.0.1:6379/0", ("127.0.0.1", 6379, 0, False, True)),
        ("redis://localhost", ("localhost", 6379, 0, False, True)),
        ("redis://", ("localhost", 6379, 0, False, True)),
        (f"redis://:{SECRET}@10.0.0.5:6380/3", ("10.0.0.5", 6380, 3, False, False)),
        (f"rediss://ongrid:{SECRET}@redis.example/2", ("redis.example", 6379, 2, True, False)),
        ("redis://[::1]:6379/1", ("::1", 6379, 1, False, True)),
        ("redis://[fd00::5]:6379/1", ("fd00::5", 6379, 1, False, False)),
        ("redis://redis:6379?db=5", ("redis", 6379, 5, False, False)),
        ("unix:///run/redis/redis.sock?db=4", ("/run/redis/redis.sock", None, 4, False, True)),
    ],
)
def test_redis_urls(url: str, expected: tuple[Any, ...]) -> None:
    found = Topology.from_urls("sqlite://", url)
    got = (
        found.redis_host,
        found.redis_port,
        found.redis_db,
        found.redis_tls,
        found.redis_loopback,
    )
    assert got == expected
    assert SECRET not in found.model_dump_json()


def test_the_settings_default_to_a_sqlite_file_and_redis_on_loopback(tmp_path: Path) -> None:
    found = Topology.from_settings(Settings(data_dir=tmp_path / "data"))

    assert found.database_dialect == "sqlite" and found.database_loopback
    assert found.database_name == str((tmp_path / "data" / "ongrid.db").resolve())
    assert not (tmp_path / "data").exists()  # describing the settings creates nothing
    assert (found.redis_host, found.redis_port, found.redis_db) == ("127.0.0.1", 6379, 0)
    assert found.redis_loopback


def test_hints_are_urls_that_reach_the_same_place() -> None:
    remote = Topology.from_urls("postgresql://u:p@[fd00::7]:5433/app", "rediss://:p@[fd00::5]/2")
    assert remote.database_url_hint() == "postgresql://[fd00::7]:5433/app"
    assert remote.redis_url_hint() == "rediss://[fd00::5]:6379/2"
    socket = Topology.from_urls("postgresql:///app?host=/run/pg", "unix:///run/r.sock?db=1")
    assert Topology.from_urls(socket.database_url_hint(), socket.redis_url_hint()) == socket


# -- the rules -------------------------------------------------------------------------------


def test_a_sqlite_worker_is_refused_when_its_redis_holds_an_api_on_postgresql(
    redis_client: redis.Redis, sqlite_url: str, sqlite_engine: Engine
) -> None:
    api = f"postgresql+psycopg://ongrid:{SECRET}@db.example:5432/ongrid"
    _to_redis(redis_client, _announcement(api, f"redis://:{SECRET}@127.0.0.1:6379/9"))

    message = _refusal(_settings(sqlite_url), sqlite_engine, redis_client)

    assert message.startswith(f"this worker's database is the SQLite file {sqlite_url[10:]}")
    assert f"the API on {API_HOST} announced PostgreSQL at db.example:5432/ongrid" in message
    assert "read from this worker's Redis, announced at " in message and " s ago)" in message
    assert "a SQLite file is on one host" in message
    assert "other personas and plugins than the API" in message
    assert message.endswith(
        "set ONGRID_DATABASE_URL to the API's database, postgresql://db.example:5432/ongrid "
        "(with the user and password the API uses)"
    )
    assert isinstance(TopologyMismatch(message), UserError)


def test_a_worker_on_a_loopback_database_is_refused_when_the_apis_is_remote(
    redis_client: redis.Redis, pg_url: str, pg_engine: Engine
) -> None:
    api = f"postgresql://ongrid:{SECRET}@10.0.0.7:5432/ongrid"
    _to_redis(redis_client, _announcement(api, REDIS_URL))

    message = _refusal(_settings(pg_url), pg_engine, redis_client)

    assert "this worker's database is PostgreSQL at 127.0.0.1:5432/" in message
    assert "on this host only" in message
    assert "announced PostgreSQL at 10.0.0.7:5432/ongrid (read from this worker's Redis" in message
    assert "set ONGRID_DATABASE_URL to the API's database, postgresql://10.0.0.7:5432/ongrid" in (
        message
    )


def test_a_worker_on_loopback_redis_is_refused_by_the_row_in_its_database(
    redis_client: redis.Redis, pg_url: str, pg_engine: Engine
) -> None:
    # The database is shared (the API's row is there), the Redis is this host's own (empty).
    _to_database(pg_engine, _announcement(pg_url, f"redis://:{SECRET}@10.20.30.40:6379/9"))

    message = _refusal(_settings(pg_url), pg_engine, redis_client)

    assert message.startswith(
        f"this worker's Redis is 127.0.0.1:{redis_server.port()}/9, on this host only"
    )
    assert f"the API on {API_HOST} announced its Redis at 10.20.30.40:6379/9" in message
    assert "(read from this worker's database, announced at " in message
    assert "another Redis than the one the API enqueues them on" in message
    assert message.endswith(
        "set REDIS_URL=redis://10.20.30.40:6379/9 (with the password, if that Redis has one)"
    )


def test_the_database_row_refuses_a_loopback_redis_on_sqlite_too(
    redis_client: redis.Redis, sqlite_url: str, sqlite_engine: Engine
) -> None:
    _to_database(sqlite_engine, _announcement(sqlite_url, "rediss://redis.example:6380/0"))

    message = _refusal(_settings(sqlite_url), sqlite_engine, redis_client)

    assert "set REDIS_URL=rediss://redis.example:6380/0" in message


def test_both_mistakes_are_named_in_one_message(
    redis_client: redis.Redis, pg_url: str, pg_engine: Engine
) -> None:
    # The API's row in the worker's database names a remote Redis; the announcement in the
    # worker's Redis (another API's, on the same loopback Redis) names a remote database.
    _to_database(pg_engine, _announcement(pg_url, "redis://10.20.30.40:6379/9"))
    _to_redis(redis_client, _announcement("postgresql://u@10.0.0.7/ongrid", REDIS_URL))

    message = _refusal(_settings(pg_url), pg_engine, redis_client)

    assert "set REDIS_URL=redis://10.20.30.40:6379/9" in message
    assert "; and this worker's database is PostgreSQL at 127.0.0.1:5432/" in message
    assert "postgresql://10.0.0.7:5432/ongrid" in message


# -- what passes -------------------------------------------------------------------------------


def test_one_host_with_loopback_everywhere_passes(
    redis_client: redis.Redis, sqlite_url: str, sqlite_engine: Engine
) -> None:
    # `ongrid up`: the API and its workers share the settings; the API announced to both places.
    settings = _settings(sqlite_url)
    announcer = ApiAnnouncer(settings, Database(sqlite_engine))
    try:
        announcer.announce()
    finally:
        announcer.stop()
    assert redis_client.get(api_key()) is not None
    assert ClusterFacts(sqlite_engine).get(API_FACT) is not None

    check_worker(settings, sqlite_engine, redis_client)
    # Another loopback name for the same Redis: both loopback, allowed.
    check_worker(
        _settings(sqlite_url, f"redis://localhost:{redis_server.port()}/9"),
        sqlite_engine,
        redis_client,
    )


def test_nothing_announced_passes(
    redis_client: redis.Redis, sqlite_url: str, sqlite_engine: Engine
) -> None:
    check_worker(_settings(sqlite_url), sqlite_engine, redis_client)


def test_a_worker_that_matches_a_remote_api_passes(
    redis_client: redis.Redis, pg_url: str, pg_engine: Engine
) -> None:
    # The worker names the API's servers by their addresses; the API does too.
    made = _announcement("postgresql://u@10.0.0.7/ongrid", "redis://10.20.30.40:6379/9")
    _to_database(pg_engine, made)
    remote = _settings("postgresql://u@10.0.0.7/ongrid", "redis://10.20.30.40:6379/9")
    unanswered = redis.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=2)
    try:
        check_worker(remote, pg_engine, unanswered)
    finally:
        unanswered.close()


def test_the_apis_redis_reached_by_loopback_on_its_own_host_passes(
    redis_client: redis.Redis, pg_url: str, pg_engine: Engine
) -> None:
    # The API names its Redis by the host's address, a worker on that host by 127.0.0.1: the
    # worker's Redis holds the same announcement as its database, so it is the API's Redis.
    made = _announcement(pg_url, "redis://10.20.30.40:6379/9")
    _to_database(pg_engine, made)
    _to_redis(redis_client, made.model_copy(update={"announced_at": utcnow()}))

    check_worker(_settings(pg_url), pg_engine, redis_client)


def test_an_announcement_judges_the_other_place_not_its_own(
    redis_client: redis.Redis, pg_url: str, pg_engine: Engine
) -> None:
    # Read from this worker's Redis, an announcement of a remote Redis says this worker's
    # Redis is the API's (reached by another name): no Redis rule from it.
    _to_redis(redis_client, _announcement(pg_url, "redis://10.20.30.40:6379/9"))
    check_worker(_settings(pg_url), pg_engine, redis_client)
    redis_client.flushdb()
    # Likewise a row in this worker's database about a remote database.
    _to_database(pg_engine, _announcement("postgresql://u@10.0.0.7/ongrid", REDIS_URL))
    check_worker(_settings(pg_url), pg_engine, redis_client)


def test_an_old_local_row_in_a_sqlite_database_does_not_hide_the_announcement_in_redis(
    redis_client: redis.Redis, sqlite_url: str, sqlite_engine: Engine
) -> None:
    old = _announcement(sqlite_url, REDIS_URL, announced_at=utcnow() - timedelta(days=30))
    _to_database(sqlite_engine, old)  # from the days the API ran on this host
    _to_redis(redis_client, _announcement("postgresql://u@db.example/ongrid", REDIS_URL))

    message = _refusal(_settings(sqlite_url), sqlite_engine, redis_client)

    assert "announced PostgreSQL at db.example:5432/ongrid (read from this worker's Redis" in (
        message
    )


def test_a_redis_that_does_not_answer_leaves_the_database_to_judge(
    sqlite_url: str, sqlite_engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    unanswered = redis.Redis.from_url(
        "redis://127.0.0.1:1/0", socket_connect_timeout=2, socket_timeout=2
    )
    settings = _settings(sqlite_url, "redis://127.0.0.1:1/0")
    try:
        with caplog.at_level(logging.INFO, "coordinator.topology"):
            check_worker(settings, sqlite_engine, unanswered)  # not the check's error
        assert "cannot read the API's announcement from Redis 127.0.0.1:1/0" in caplog.text

        _to_database(sqlite_engine, _announcement(sqlite_url, "redis://10.20.30.40:6379/0"))
        message = _refusal(settings, sqlite_engine, unanswered)
        assert "set REDIS_URL=redis://10.20.30.40:6379/0" in message
    finally:
        unanswered.close()


def test_an_unreadable_announcement_is_ignored(
    redis_client: redis.Redis,
    sqlite_url: str,
    sqlite_engine: Engine,
    caplog: pytest.LogCaptureFixture,
) -> None:
    redis_client.set(api_key(), b"{not json")
    ClusterFacts(sqlite_engine).put(API_FACT, '{"topology": {}}')

    with caplog.at_level(logging.WARNING, "coordinator.topology"):
        check_worker(_settings(sqlite_url), sqlite_engine, redis_client)

    assert "ignoring an unreadable API announcement in the Redis" in caplog.text
    assert "ignoring an unreadable API announcement in the database" in caplog.text


# -- the announcer ------------------------------------------------------------------------------


def test_the_announcer_writes_both_places_without_the_password(
    redis_client: redis.Redis, pg_url: str
) -> None:
    with_password = pg_url.replace("postgres@", f"postgres:{SECRET}@")  # trust auth ignores it
    assert SECRET in with_password
    database = Database(make_engine(with_password))  # not migrated yet: the announcer does it
    announcer = ApiAnnouncer(_settings(with_password), database)
    try:
        made = announcer.announce()
    finally:
        announcer.stop()
        database.engine.dispose()

    raw = redis_client.get(api_key())
    assert raw is not None and SECRET.encode() not in raw
    assert 0 < redis_client.ttl(api_key()) <= ANNOUNCE_TTL
    assert Announcement.model_validate_json(raw) == made
    engine = make_engine(pg_url)
    try:
        fact = ClusterFacts(engine).get(API_FACT)
    finally:
        engine.dispose()
    assert fact is not None and SECRET not in fact.value
    assert Announcement.model_validate_json(fact.value) == made
    assert fact.updated_at == made.announced_at
    assert made.topology.database_dialect == "postgresql" and made.topology.database_loopback


def test_the_announcer_survives_both_places_down_and_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    down = "postgresql+psycopg://postgres@127.0.0.1:1/none?connect_timeout=2"
    announcer = ApiAnnouncer(_settings(down, "redis://127.0.0.1:1/0"), Database(make_engine(down)))
    try:
        with caplog.at_level(logging.WARNING, "coordinator.topology"):
            announcer.announce()
            announcer.announce()
    finally:
        announcer.stop()

    warnings = [r.getMessage() for r in caplog.records]
    assert len([w for w in warnings if "to Redis" in w]) == 1
    assert len([w for w in warnings if "to the database" in w]) == 1


def test_the_announcer_thread_repeats_until_stopped(
    redis_client: redis.Redis, sqlite_url: str, sqlite_engine: Engine
) -> None:
    announcer = ApiAnnouncer(_settings(sqlite_url), Database(sqlite_engine), every=0.05)
    announcer.start()
    try:
        first = wait_for(lambda: ClusterFacts(sqlite_engine).get(API_FACT), 30, "a first row")
        wait_for(
            lambda: ClusterFacts(sqlite_engine).get(API_FACT) != first, 30, "a newer announcement"
        )
    finally:
        announcer.stop()
    assert announcer._thread is not None and not announcer._thread.is_alive()


def test_the_api_announces_while_it_serves(redis_client: redis.Redis, tmp_path: Path) -> None:
    for name in ("agents", "marketplace"):
        (tmp_path / name).mkdir()
    settings = Settings(
        agents_dir=tmp_path / "agents",
        marketplace_root=tmp_path / "marketplace",
        data_dir=tmp_path / "data",
        redis_url=REDIS_URL,
        shipped_agents=False,
    )
    with TestClient(create_app(settings, console_dist=tmp_path / "no-console")):
        raw = wait_for(lambda: redis_client.get(api_key()), 30, "the API's announcement")
    found = Announcement.model_validate_json(raw)
    assert found.topology == Topology.from_settings(settings)
    assert found.topology.database_name == str((tmp_path / "data" / "ongrid.db").resolve())
