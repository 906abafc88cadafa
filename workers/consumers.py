"""Which queues have a live worker: workers advertise what they consume, callers check first.

A Celery message sent to a queue nobody consumes waits there in silence; the caller sees a spawn
``queued`` forever. So every worker advertises the queues it actually consumes (those of ``-Q``,
read from its consumer) in Redis: one sorted set per queue, ``ongrid:consumers:<queue>``, whose
members are the workers (``<hostname> pid <pid>``) and whose scores are the moments, in Redis
server time, their advertisement expires. A thread renews it every :data:`ADVERTISE_EVERY`
seconds; a clean shutdown withdraws it; a worker that dies drops out after :data:`CONSUMER_TTL`.
Readers count the members whose score is still in the future, with one round trip.

Server time on both sides, so the clocks of the hosts never matter.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable

import redis

from registry.errors import OngridError
from workers.presence import RENEW_FRACTION, live_members, renew_member, server_now

__all__ = [
    "ADVERTISE_EVERY",
    "CONSUMER_TTL",
    "NoConsumer",
    "QueueAdvertiser",
    "consumers_key",
    "live_consumers",
    "start_command",
]

log = logging.getLogger(__name__)

#: Seconds an advertisement lasts without renewal (a worker's: ``Settings.presence_ttl_seconds``):
#: a dead worker's queues count as unserved after at most this long.
CONSUMER_TTL = 10.0
#: Seconds between renewals: an advertisement survives four missed ones.
ADVERTISE_EVERY = CONSUMER_TTL * RENEW_FRACTION


def consumers_key(queue: str, prefix: str = "ongrid:") -> str:
    return f"{prefix}consumers:{queue}"


def start_command(queue: str) -> str:
    """The command that starts a worker for ``queue``."""
    if queue == "ongrid.coordinator":
        return "`ongrid worker --queues ongrid.coordinator --name coordinator`"
    return f"`ongrid worker --queues {queue}`"


class NoConsumer(OngridError):
    """No live worker consumes the queue a spawn would go to (or waits in): nothing would run it."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        super().__init__(
            f"no worker consumes {queue}: start one with {start_command(queue)} (a plain "
            "`ongrid worker` serves every queue; `ongrid up` starts a whole local runtime)"
        )


def live_consumers(
    client: redis.Redis, queues: Iterable[str], prefix: str = "ongrid:"
) -> dict[str, list[str]]:
    """The live workers of each queue (one round trip); an empty list: nobody consumes it."""
    names = list(queues)
    pipe = client.pipeline(transaction=False)
    pipe.time()
    for queue in names:
        pipe.zrange(consumers_key(queue, prefix), 0, -1, withscores=True)
    now_pair, *members = pipe.execute()
    now = server_now(now_pair)
    return {queue: live_members(found, now) for queue, found in zip(names, members, strict=True)}


class QueueAdvertiser:
    """A worker's advertisement of the queues ``queues()`` returns, renewed by one thread.

    ``queues`` is read at each renewal, so queues a worker starts or stops consuming at run time
    (Celery's ``add_consumer`` / ``cancel_consumer``) are followed.
    """

    def __init__(
        self,
        client: redis.Redis,
        worker: str,
        queues: Callable[[], Iterable[str]],
        *,
        ttl: float = CONSUMER_TTL,
        every: float = ADVERTISE_EVERY,
        prefix: str = "ongrid:",
    ) -> None:
        self.client = client
        self.prefix = prefix
        self.member = f"{worker} pid {os.getpid()}"
        self._queues, self._ttl, self._every = queues, ttl, every
        self._advertised: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Advertise now (a worker that says it is ready is findable), then keep renewing."""
        self.renew()
        self._thread = threading.Thread(target=self._run, name="queue-advertiser", daemon=True)
        self._thread.start()

    def renew(self) -> None:
        current = set(self._queues())
        now = server_now(self.client.time())
        pipe = self.client.pipeline(transaction=False)
        for queue in current:
            renew_member(pipe, consumers_key(queue, self.prefix), self.member, now, self._ttl)
        for queue in self._advertised - current:
            pipe.zrem(consumers_key(queue, self.prefix), self.member)
        pipe.execute()
        self._advertised = current

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            try:
                self.renew()
            except redis.RedisError as exc:
                log.warning("could not renew the queue advertisement: %s", exc)

    def stop(self) -> None:
        """Stop renewing and withdraw: the queues no longer count this worker."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._every + 5)
        pipe = self.client.pipeline(transaction=False)
        for queue in self._advertised:
            pipe.zrem(consumers_key(queue, self.prefix), self.member)
        try:
            pipe.execute()
        except redis.RedisError as exc:
            log.warning("could not withdraw the queue advertisement (it expires anyway): %s", exc)
        self._advertised = set()
