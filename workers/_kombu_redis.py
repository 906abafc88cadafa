"""kombu's Redis transport with one client per channel instead of one per operation.

kombu's Redis channel builds a new ``redis.Redis`` for every publish and acknowledgement
(``Channel.conn_or_acquire`` → ``_create_client``): a client object over the channel's shared
connection pool, whose construction (its table of response callbacks) cost more CPU than the
command it sends. Profiled, that was 7.7 % of the API's CPU per accepted chat (one publish each)
and a few hundred microseconds of a worker's per spawn (acknowledge, results). A ``redis.Redis``
over a pool is safe to share between threads (each command takes a connection from the pool), so
the channel builds it once. Selected by :func:`workers.celery_app.make_celery` for ``redis://``
and ``rediss://`` brokers; everything else is kombu's own.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from kombu.transport import redis as kombu_redis

__all__ = ["Channel", "Transport"]


class Channel(kombu_redis.Channel):  # type: ignore[misc]
    @cached_property
    def _shared_client(self) -> Any:
        return super()._create_client()

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            return super()._create_client(asynchronous=True)
        return self._shared_client


class Transport(kombu_redis.Transport):  # type: ignore[misc]
    Channel = Channel
