"""A worker set up for another database than the API is refused at start, saying what to set.

Real processes: an ``ongrid api`` on a fresh PostgreSQL database and Redis database 9 announces
where they are; an ``ongrid worker`` on a SQLite file exits with the reason in its log, and one
on the API's database that names Redis ``localhost`` (the API says ``127.0.0.1``: both loopback)
starts. The Redis rule needs a non-loopback Redis address, which this machine's Redis does not
listen on: it is covered in ``tests/coordinator/test_topology.py`` with a real row and a real
Redis, and across hosts by the multi-host tests.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
import redis_server
from harness import START_TIMEOUT, Proc, wait_for
from postgres import fresh_database
from procs import free_port, ongrid
from sqlalchemy import Engine

from coordinator.storage.cluster import ClusterFacts
from coordinator.storage.engine import make_engine
from coordinator.topology import API_FACT, Announcement, api_key

REDIS_URL = redis_server.url(9)
#: In the API's database URL (the test server trusts local connections and ignores it); it
#: must appear in no announcement and no worker's log.
SECRET = "s3cret-Pw"


@dataclass
class Site:
    root: Path
    env: dict[str, str]
    #: The API's database URL, with the password.
    database_url: str
    procs: list[Proc]

    def start(self, name: str, *args: str, **env: str) -> Proc:
        proc = Proc(name, ongrid(*args), self.root, {**self.env, **env})
        self.procs.append(proc)
        return proc


@pytest.fixture
def site(
    tmp_path: Path, postgres_admin: tuple[Engine | None, str], request: pytest.FixtureRequest
) -> Iterator[Site]:
    admin, reason = postgres_admin
    if admin is None:
        pytest.skip(reason)
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    for name in ("agents", "marketplace"):
        (tmp_path / name).mkdir()
    dropped = ("ONGRID_", "OPENAI_", "ANTHROPIC_", "REDIS_", "LITELLM_", "CELERY", "FAKE_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
    env.update(
        REDIS_URL=REDIS_URL,
        ONGRID_AGENTS_DIR=str(tmp_path / "agents"),
        ONGRID_MARKETPLACE_ROOT=str(tmp_path / "marketplace"),
        ONGRID_SHIPPED_AGENTS="0",
        ONGRID_DEFAULT_PROVIDER="openai",
        OPENAI_API_KEY="sk-test",
        PYTHONUNBUFFERED="1",
    )
    with fresh_database(admin, "ongrid_topology") as url:
        made = Site(tmp_path, env, url.replace("postgres@", f"postgres:{SECRET}@"), [])
        try:
            yield made
        finally:
            failed = any(
                getattr(request.node, f"rep_{when}", None) is not None
                and getattr(request.node, f"rep_{when}").failed
                for when in ("setup", "call")
            )
            for proc in made.procs:
                proc.kill()
                if failed:
                    print(f"\n===== {proc.name} (pid {proc.pid}) =====\n{proc.log()}")
            client.flushdb()
            client.close()


def _announced(site: Site, client: redis.Redis) -> Announcement:
    """The API's announcement, once it is in Redis and in the database."""
    raw = wait_for(lambda: client.get(api_key()), START_TIMEOUT, "the API's announcement in Redis")
    engine = make_engine(site.database_url)
    try:
        wait_for(lambda: ClusterFacts(engine).get(API_FACT), 30, "the API's row in the database")
    finally:
        engine.dispose()
    assert SECRET.encode() not in raw
    return Announcement.model_validate_json(raw)


def test_a_worker_on_sqlite_is_refused_while_one_on_the_apis_database_starts(site: Site):
    api = site.start("api", "api", f"--port={free_port()}", ONGRID_DATABASE_URL=site.database_url)
    client = redis.Redis.from_url(REDIS_URL)
    try:
        found = _announced(site, client)
    finally:
        client.close()
    assert api.alive(), api.log()
    assert found.topology.database_dialect == "postgresql"
    assert (found.topology.redis_host, found.topology.redis_db) == ("127.0.0.1", 9)

    sqlite_worker = site.start(
        "sqlite-worker",
        *("worker", "--queues=ongrid.interactive", "-c", "2", "--name=lost"),
        ONGRID_DATABASE_URL=f"sqlite:///{site.root / 'worker.db'}",
    )
    code = sqlite_worker.proc.wait(timeout=START_TIMEOUT)

    log = sqlite_worker.log()
    assert code != 0, log
    database_name = site.database_url.rsplit("/", 1)[1]
    assert "ongrid worker: cannot start: this worker's database is the SQLite file " in log
    assert f"announced PostgreSQL at 127.0.0.1:5432/{database_name}" in log
    assert "(read from this worker's Redis, announced at " in log
    assert "a SQLite file is on one host" in log
    assert (
        "set ONGRID_DATABASE_URL to the API's database, "
        f"postgresql://127.0.0.1:5432/{database_name}"
    ) in log
    assert SECRET not in log
    assert "Traceback" not in log  # a refused setting is the whole story

    # The API's database, and Redis by another loopback name than the API's: both on this
    # host, so allowed.
    worker = site.start(
        "worker",
        *("worker", "--queues=ongrid.interactive", "-c", "2", "--name=kept"),
        ONGRID_DATABASE_URL=site.database_url,
        REDIS_URL=f"redis://localhost:{redis_server.port()}/9",
    )
    wait_for(
        lambda: " ready." in worker.log() or not worker.alive(),
        START_TIMEOUT,
        "the worker on the API's database to be ready",
        every=0.2,
    )
    assert worker.alive(), worker.log()
    assert (
        "the API's announcement (read from this worker's database and Redis) agrees" in worker.log()
    )
    assert SECRET not in worker.log()
