"""Fixtures of the integration tests: a real Redis, real worker processes, the fake LLM.

- ``redis_db``: a dedicated Redis database (its URL), flushed before and after each test;
- ``fake``: the scripted OpenAI-protocol server (:mod:`workers.testing.fake_openai`) in its own
  process, reached by litellm over a socket; the test writes its rules with ``fake.script``;
- ``cluster``: a working directory holding ``agents/`` (the personas the test writes), the
  workers' environment, ``start_worker`` (``python -m coordinator worker`` processes, forked
  from the test process's zygote, ``tests/zygote.py``; one log file each, printed when the test
  fails) and a :class:`~workers.client.SpawnClient`.

The helpers live in ``harness.py``, next to this file.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))  # harness.py, site_tools.py

from harness import Cluster, FakeLLM  # noqa: E402
from redis_server import claim_database  # noqa: E402


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


def _failed(request: pytest.FixtureRequest) -> bool:
    reports = (getattr(request.node, f"rep_{when}", None) for when in ("setup", "call"))
    return any(r is not None and r.failed for r in reports)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A database of this test process's own Redis server (see ``redis_server.py``)."""
    with claim_database() as url:
        yield url


@pytest.fixture
def redis_db(redis_url: str) -> Iterator[str]:
    """The database, flushed before and after the test."""
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    yield redis_url
    client.flushdb()
    client.close()


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeLLM]:
    server = FakeLLM(tmp_path / "fake-script.json")
    yield server
    server.stop()


@pytest.fixture
def cluster(
    tmp_path: Path, redis_db: str, fake: FakeLLM, request: pytest.FixtureRequest
) -> Iterator[Cluster]:
    root = tmp_path / "site"
    root.mkdir()
    made = Cluster(root, fake, redis_db)
    yield made
    made.close(_failed(request))
