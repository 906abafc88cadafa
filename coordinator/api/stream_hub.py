"""One Redis pub/sub connection per API process for every open event stream.

Every SSE stream of the API follows a session's events (:meth:`workers.events.EventBus.afollow`,
the approval feed's included). Were each stream to open a pub/sub connection of its own, and a
client for its reads, a few hundred streams of one person would use up the process's file
descriptors and Redis's connections. The hub holds one pub/sub connection for all of them and
one bounded pool (:attr:`StreamHub.client`) for the reads of stored events:

* a session's channel is SUBSCRIBEd while at least one stream of it is open and UNSUBSCRIBEd when
  the last one closes. Plain SUBSCRIBE, so ``PUBSUB NUMSUB`` of the channel, which a worker asks
  to decide whether to stream a model reply token by token, counts 1 exactly while someone
  watches;
* one task reads the connection and puts each message in the queue of every stream of its
  channel. A queue is bounded: a stream that falls behind loses its queue and reads the stream
  key instead (:data:`~workers.events.GAP`); it never holds up the hub or the other streams;
* a lost connection is re-established (redis-py subscribes the channels again on its own, and
  says so only through a connect callback), and once a channel's subscription is confirmed again,
  each of its streams reads the stream key for whatever was published meanwhile. A PING every
  :data:`_PING_EVERY` seconds finds a connection that went silent without closing.

Only the hub's task does I/O on the pub/sub connection: subscribing and unsubscribing are
requests it carries out between two reads (at most :data:`_POLL` seconds apart), so the connection
never has two writers, nor two tasks reconnecting it at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from types import TracebackType
from typing import Any, Literal

import redis
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from workers.events import GAP, Gap

__all__ = ["CLIENT_NAME", "StreamHub", "Subscription"]

log = logging.getLogger(__name__)

#: The name (``CLIENT SETNAME``) of every Redis connection of the hub, as ``CLIENT LIST`` shows.
CLIENT_NAME = "ongrid-api-streams"
#: Connections of the pool that reads stored events (and answers the streams' health checks).
POOL_SIZE = 8
#: Seconds a read waits for a free connection of the pool before it fails (and is retried). A
#: busy pool is a queue, not an outage (a Redis that is down fails at connect): with 5 s, a
#: thousand streams opened at once on a loaded 2-core machine were partly refused with 503
#: "Redis is unreachable: No connection available".
_POOL_WAIT = 30.0
#: Seconds a connection may take to connect, and a command to be answered.
_CONNECT_TIMEOUT, _SOCKET_TIMEOUT = 5.0, 10.0
#: Messages a stream may have waiting; past that it drops them and reads the stream key.
QUEUE_SIZE = 1000
#: Longest read of the pub/sub connection before subscription requests are looked at (seconds).
_POLL = 0.05
#: Seconds a stream waits for the server to confirm its channel's SUBSCRIBE.
_CONFIRM = 5.0
#: A PING goes out on the pub/sub connection every _PING_EVERY seconds; a connection that has
#: said nothing for _SILENT_FOR seconds is dropped and made again.
_PING_EVERY, _SILENT_FOR = 5.0, 15.0
#: Seconds :meth:`StreamHub.aclose` waits for the hub's task to stop.
_CLOSE_SECONDS = 5.0
#: Errors after which the pub/sub connection is made again.
_LOST = (redis.ConnectionError, redis.TimeoutError, OSError)


class _Channel:
    """One channel the hub follows, and the streams that read it."""

    __slots__ = ("confirmed", "missed", "name", "streams")

    def __init__(self, name: bytes) -> None:
        self.name = name
        self.streams: set[Subscription] = set()
        #: Set while the server has confirmed the channel's SUBSCRIBE on the current connection.
        self.confirmed = asyncio.Event()
        #: The connection was lost after the streams started listening: they read the stream
        #: key once the channel is confirmed again.
        self.missed = False


class Subscription:
    """One stream's place on the hub's connection (a :class:`~workers.events.SharedLive`).

    Live messages wait in a bounded queue until the stream takes them. A ``with`` block closes
    it; closing twice is harmless.
    """

    def __init__(self, hub: StreamHub, channel: _Channel, limit: int) -> None:
        self._hub, self._channel, self._limit = hub, channel, limit
        self._queue: deque[bytes] = deque()
        self._gap = False
        self._ready = asyncio.Event()
        self._closed = False
        #: Times this stream was sent to the stream key because live messages were dropped.
        self.gaps = 0

    @property
    def channel(self) -> str:
        return self._channel.name.decode()

    async def listen(self) -> None:
        """Return once the channel is subscribed on the hub's connection; ``ConnectionError``
        while that connection is down, ``TimeoutError`` if the server does not confirm in time."""
        if self._channel.confirmed.is_set():
            return
        if self._hub.down is not None:
            raise redis.ConnectionError(
                f"the shared pub/sub connection to Redis is down: {self._hub.down}"
            )
        try:
            async with asyncio.timeout(_CONFIRM):
                await self._channel.confirmed.wait()
        except TimeoutError:
            raise redis.TimeoutError(
                f"Redis did not confirm SUBSCRIBE {self.channel} within {_CONFIRM:g} s"
            ) from None

    async def receive(self, wait: float) -> bytes | Literal[Gap.GAP] | None:
        """The next message, :data:`~workers.events.GAP` after messages were dropped, or
        ``None`` when nothing came within ``wait`` seconds."""
        if not self._queue and not self._gap:
            self._ready.clear()
            try:
                async with asyncio.timeout(wait):
                    await self._ready.wait()
            except TimeoutError:
                return None
        if self._gap:
            self._gap = False
            self._queue.clear()
            return GAP
        return self._queue.popleft()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._hub._release(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- called by the hub's task ------------------------------------------------------------

    def _put(self, data: bytes) -> None:
        if self._gap:  # the stream key is read anyway, this message with it
            return
        if len(self._queue) >= self._limit:
            self._lose()
            return
        self._queue.append(data)
        self._ready.set()

    def _lose(self) -> None:
        self._queue.clear()
        self._gap = True
        self.gaps += 1
        self._ready.set()


class StreamHub:
    """The pub/sub connection and the read pool every event stream of one process shares.

    Start it (:meth:`start`) on the event loop that serves the streams and close it
    (:meth:`aclose`) on the same loop; :meth:`subscribe` starts it if needed.
    """

    def __init__(
        self,
        redis_url: str,
        *,
        pool_size: int = POOL_SIZE,
        queue_size: int = QUEUE_SIZE,
        client_name: str = CLIENT_NAME,
    ) -> None:
        common: dict[str, Any] = {
            "client_name": client_name,
            "socket_connect_timeout": _CONNECT_TIMEOUT,
            "socket_timeout": _SOCKET_TIMEOUT,
        }
        pool = redis.asyncio.BlockingConnectionPool.from_url(
            redis_url,
            max_connections=pool_size,
            timeout=_POOL_WAIT,
            retry=Retry(NoBackoff(), 1),  # a pooled connection Redis closed: once more, anew
            **common,
        )
        #: The bounded pool for stored events (XRANGE) and health checks.
        self.client = redis.asyncio.Redis(connection_pool=pool)
        # Not retried inside redis-py: a lost connection is this hub's to notice and repair.
        self._pubsub_client = redis.asyncio.Redis.from_url(
            redis_url, retry=Retry(NoBackoff(), 0), **common
        )
        self._pubsub = self._pubsub_client.pubsub()
        self._queue_size = queue_size
        self._channels: dict[bytes, _Channel] = {}
        #: Channels whose subscription may have to change (streams came or went).
        self._dirty: set[bytes] = set()
        #: Channels SUBSCRIBEd on the connection and not UNSUBSCRIBEd since.
        self._sent: set[bytes] = set()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        #: Why the pub/sub connection is down; ``None`` while it works.
        self.down: BaseException | None = None
        self._heard = self._pinged = time.monotonic()

    # -- the streams' side -------------------------------------------------------------------

    def start(self) -> None:
        """Start the task that reads the connection, on the running loop (once)."""
        if self._task is None and not self._closed:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="stream-hub")

    def subscribe(self, channel: str) -> Subscription:
        """A stream's subscription to ``channel``; the channel is SUBSCRIBEd if it is the first."""
        if self._closed:
            raise redis.ConnectionError("the API is shutting down: no new event stream")
        self.start()
        name = channel.encode()
        found = self._channels.get(name)
        if found is None:
            found = self._channels[name] = _Channel(name)
            self._dirty.add(name)
        subscription = Subscription(self, found, self._queue_size)
        found.streams.add(subscription)
        return subscription

    def _release(self, subscription: Subscription) -> None:
        channel = subscription._channel
        channel.streams.discard(subscription)
        if not channel.streams:
            self._dirty.add(channel.name)

    @property
    def streams(self) -> int:
        """Open subscriptions."""
        return sum(len(c.streams) for c in self._channels.values())

    @property
    def channels(self) -> int:
        """Channels followed (subscribed, or about to be)."""
        return sum(1 for c in self._channels.values() if c.streams)

    async def aclose(self) -> None:
        """Stop reading and close every connection of the hub (within :data:`_CLOSE_SECONDS`)."""
        self._closed = True
        if self._task is not None:
            # The task also stops at its next step when it sees the hub closed: a cancellation
            # that lands inside redis-py's read can be taken for the read's own timeout.
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=_CLOSE_SECONDS)
        closing = (
            self._pubsub.aclose(),
            self._pubsub_client.aclose(),
            self.client.aclose(close_connection_pool=True),
        )
        for step in closing:
            try:
                await asyncio.wait_for(step, _CLOSE_SECONDS)
            except (TimeoutError, redis.RedisError, OSError) as exc:
                log.warning("the stream hub's connections did not close cleanly: %r", exc)

    # -- the hub's task ----------------------------------------------------------------------

    async def _run(self) -> None:
        failures = 0
        while not self._closed:
            try:
                await self._step()
                failures = 0
            except _LOST as exc:
                self._lost(exc)
                failures += 1
                if failures == 1:
                    log.warning("the shared pub/sub connection to Redis is lost: %s", exc)
                await asyncio.sleep(min(1.0, 0.05 * 2**failures))
            except Exception:  # a bug must not stop every stream of the process for good
                log.exception("the stream hub failed; going on")
                await asyncio.sleep(1.0)

    async def _step(self) -> None:
        if self._pubsub.connection is None:  # the first connection
            await self._pubsub.connect()
            connection: Any = self._pubsub.connection
            connection.register_connect_callback(self._on_connect)
            self._heard = self._pinged = time.monotonic()
        await self._apply()
        await self._check_health()
        message = await self._pubsub.get_message(timeout=_POLL)
        if self.down is not None:
            log.warning("the shared pub/sub connection to Redis is back")
            self.down = None
        if message is not None:
            self._heard = time.monotonic()
            self._dispatch(message)

    async def _apply(self) -> None:
        """SUBSCRIBE the channels streams wait for, UNSUBSCRIBE those nobody reads any more."""
        if not self._dirty:
            return
        dirty, self._dirty = self._dirty, set()
        wanted, dropped = [], []
        for name in dirty:
            channel = self._channels.get(name)
            if channel is not None and channel.streams:
                if name not in self._sent:
                    wanted.append(name)
            else:
                self._channels.pop(name, None)
                if name in self._sent:
                    dropped.append(name)
        try:
            if wanted:
                await self._pubsub.subscribe(*wanted)
                self._sent.update(wanted)
            if dropped:
                await self._pubsub.unsubscribe(*dropped)
                self._sent.difference_update(dropped)
        except BaseException:
            self._dirty |= dirty
            raise

    async def _check_health(self) -> None:
        connection = self._pubsub.connection
        if connection is None or not connection.is_connected:
            return
        now = time.monotonic()
        if now - self._heard >= _SILENT_FOR:
            await connection.disconnect()
            raise redis.TimeoutError(f"no answer on the pub/sub connection for {_SILENT_FOR:g} s")
        if now - self._pinged >= _PING_EVERY:
            self._pinged = now
            await self._pubsub.ping()

    def _dispatch(self, message: dict[str, Any]) -> None:
        kind, name = message["type"], message["channel"]
        if kind == "message":
            channel = self._channels.get(name)
            if channel is not None:
                for subscription in channel.streams:
                    subscription._put(message["data"])
        elif kind == "subscribe":
            self._confirm(name)

    def _confirm(self, name: bytes) -> None:
        channel = self._channels.get(name)
        if channel is None or channel.confirmed.is_set():
            return
        if channel.missed:  # subscribed again after a lost connection: read the stream key
            channel.missed = False
            for subscription in channel.streams:
                subscription._lose()
        channel.confirmed.set()

    def _lost(self, cause: BaseException | None) -> None:
        """The connection went away: no channel is confirmed until the server says so again."""
        if cause is not None:
            self.down = cause
        for channel in self._channels.values():
            channel.missed = channel.missed or channel.confirmed.is_set()
            channel.confirmed.clear()

    def _on_connect(self, connection: Any) -> None:
        # redis-py has just sent SUBSCRIBE for every channel it knows (its own callback runs
        # first), those a stream let go whose UNSUBSCRIBE was not confirmed included.
        self._lost(None)
        self._sent = set(self._pubsub.channels)
        self._dirty |= self._sent | set(self._channels)
        self._heard = self._pinged = time.monotonic()
