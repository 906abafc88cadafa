"""Fixtures shared by the coordinator's tests."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

from harness import claim_database  # noqa: E402


@pytest.fixture(scope="module")
def claimed_redis_url() -> Iterator[str]:
    """A Redis database of this module's own (claimed across test processes), empty before and
    after."""
    with claim_database() as url:
        client = redis.Redis.from_url(url)
        client.flushdb()
        yield url
        client.flushdb()
        client.close()
