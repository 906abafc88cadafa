"""Fixtures of the staged incidents: a Redis database of their own and the integration harness.

The workers, the Redis database and the polling helpers are the integration tests' own
(``tests/integration/harness.py``); only the model differs: a recipe follower
(:mod:`workers.testing.recipe_model`) instead of fixed rules.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))  # harness.py
sys.path.insert(0, str(REPO / "tests"))  # processes.py, redis_server.py
sys.path.insert(0, str(REPO))  # the scenarios package, whatever the working directory

from redis_server import claim_database  # noqa: E402


@pytest.fixture
def redis_db() -> Iterator[str]:
    """A database of this test process's own Redis server, held for one scenario and flushed
    around it."""
    with claim_database() as url:
        client = redis.Redis.from_url(url)
        client.flushdb()
        yield url
        client.flushdb()
        client.close()
