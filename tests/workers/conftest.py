"""Fixtures of the workers' tests: the real sandbox the command tools run in, real backends."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
import redis_server
from servers import ClickHouse, start_clickhouse

from workers.sandbox import Sandbox
from workers.spawns import SpawnStore

#: The Redis database of the spawn store, lease and reaper tests (flushed around each test).
SPAWN_REDIS_URL = redis_server.url(4)


@pytest.fixture
def spawn_redis_url() -> str:
    """:data:`SPAWN_REDIS_URL`, for a test that needs clients of its own beside :func:`r`."""
    return SPAWN_REDIS_URL


@pytest.fixture
def r() -> Iterator[redis.Redis]:
    """A client of :data:`SPAWN_REDIS_URL`, its database flushed before and after the test."""
    client = redis.Redis.from_url(SPAWN_REDIS_URL)
    try:
        client.flushdb()
    except redis.ConnectionError as exc:
        pytest.fail(f"no Redis at {SPAWN_REDIS_URL}: {exc}")
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def store(r: redis.Redis) -> SpawnStore:
    return SpawnStore(r)


@pytest.fixture(scope="session")
def sandbox() -> Sandbox:
    """bubblewrap as the workers use it. Not skipped when missing: the command tools are part of
    what the suite proves, and ``./dev test`` installs bubblewrap."""
    box = Sandbox()
    why = box.unavailable()
    if why is not None:
        pytest.fail(f"the command sandbox is unavailable on this machine: {why}")
    return box


@pytest.fixture(scope="session")
def clickhouse(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClickHouse]:
    """A real ClickHouse server with the read-only diagnostics user (``servers.DIAG_USER``)."""
    try:
        server = start_clickhouse(tmp_path_factory.mktemp("clickhouse"))
    except RuntimeError as exc:
        pytest.fail(str(exc))
    yield server
    server.stop()
