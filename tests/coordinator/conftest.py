"""Fixtures shared by the coordinator's tests."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))  # harness.py

from redis_server import claim_database  # noqa: E402


@pytest.fixture(scope="module")
def claimed_redis_url() -> Iterator[str]:
    """A Redis database of this module's own (of this test process's own server), empty before and
    after."""
    with claim_database() as url:
        client = redis.Redis.from_url(url)
        client.flushdb()
        yield url
        client.flushdb()
        client.close()
