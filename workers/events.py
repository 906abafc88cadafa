"""The event bus: the events spawns emit, stored per session and delivered exactly once, in order.

Keys per session (``prefix`` defaults to ``ongrid:``):

* ``{prefix}events:{session_id}`` — a Redis Stream. Entry ``<seq>-0`` holds the event's JSON in the
  field ``event``; bounded by ``maxlen`` (approximate trimming) and a TTL refreshed on each publish.
* ``{prefix}seq:{session_id}`` — the counter that hands out ``seq`` 1, 2, 3, … for the session.
* ``{prefix}dedup:{session_id}`` — a hash a resumed spawn uses to avoid publishing an event twice.
* ``{prefix}db{N}:live:{session_id}`` — a pub/sub channel carrying the same JSON as the stream
  (channels are global to the server: the database number keeps stacks on others apart).

Publishing is one Lua script, so an event is numbered, stored and announced atomically. A subscriber
listens on the channel first, then reads the stream after the last ``seq`` it has, then follows the
channel. The stream is the truth; the channel is only a wake-up. A live event that skips numbers, a
reconnect, or a quiet channel (a message may have been lost with a dropped connection) sends the
subscriber back to the stream, and anything at or below the last delivered ``seq`` is dropped.

That protocol is written once, in :func:`_follow`, as a generator of I/O requests; the blocking
:meth:`EventBus.subscribe` and the asyncio :meth:`EventBus.asubscribe` only carry the requests out,
each on a pub/sub connection of its own. :meth:`EventBus.afollow` carries them out for a server
that follows many sessions at once: its live messages come from a subscription on a pub/sub
connection the process shares (:class:`SharedLive`, e.g. the HTTP API's stream hub), its stored
events from a shared connection pool; a subscription that lost messages (its queue overflowed,
the shared connection was re-established) says so with :data:`GAP`, and the subscriber reads the
stream.
Publishing is written once too: :meth:`EventBus.publish` runs the script for one event, and
:meth:`EventBus.apublish_many` runs it for many events in one pipeline (one round trip) on asyncio.
"""

from __future__ import annotations

import asyncio
import enum
import threading
import time
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Protocol

import redis
import redis.asyncio
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from registry.errors import UserError
from workers.channels import scoped
from workers.messages import EVENT_ADAPTER, Event

__all__ = ["GAP", "EventBus", "Gap", "Outgoing", "Published", "SessionKeys", "SharedLive"]

#: Stream entries read per XRANGE while catching up.
_CHUNK = 500
#: Longest wait on the channel before ``stop`` and the idle timeout are looked at again (seconds).
_POLL = 0.2
#: How long a subscriber waits for the server to confirm SUBSCRIBE (seconds).
_CONFIRM = 5.0
#: Errors after which a subscriber reconnects and resumes; anything else ends the subscription.
_RETRYABLE = (RedisConnectionError, RedisTimeoutError)

# KEYS: stream, counter, dedup hash[, lease]. ARGV: channel, body, maxlen, ttl, dedup key, dedup
# index[, lease token]. ``body`` is the event's JSON object without "seq"; the script writes "seq"
# as its first member, so the rest of the JSON (floats, unicode) is stored byte for byte as Python
# wrote it. With a lease, nothing is written unless the lease key holds the token: an attempt
# that lost its spawn to another (a worker cut off, then back) publishes nothing more.
# Returns {duplicate (0/1, or 2: fenced), seq}.
_PUBLISH_LUA = """
local stream, counter, dedup = KEYS[1], KEYS[2], KEYS[3]
local channel, body, maxlen, ttl, dkey, didx = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
if KEYS[4] and redis.call('GET', KEYS[4]) ~= ARGV[7] then
  return {2, 0}
end
if dkey ~= '' then
  local seen = redis.call('HGET', dedup, 'max:' .. dkey)
  if seen and tonumber(seen) >= tonumber(didx) then
    return {1, tonumber(redis.call('HGET', dedup, 'seq:' .. dkey .. ':' .. didx)) or 0}
  end
end
local function add(seq)
  local data = '{"seq":' .. seq .. ',' .. string.sub(body, 2)
  local res = redis.pcall('XADD', stream, 'MAXLEN', '~', maxlen, seq .. '-0', 'event', data)
  return res, data
end
local seq = redis.call('INCR', counter)
local res, data = add(seq)
if type(res) == 'table' and res.err then
  -- The counter is behind the stream (it was evicted or deleted on its own): carry on after the
  -- stream's last ID instead of failing every publish of the session from now on.
  local info = redis.call('XINFO', 'STREAM', stream)
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' then
      seq = tonumber(string.match(info[i + 1], '^%d+')) + 1
    end
  end
  redis.call('SET', counter, seq)
  res, data = add(seq)
  if type(res) == 'table' and res.err then
    return redis.error_reply(res.err)
  end
end
redis.call('PUBLISH', channel, data)
redis.call('EXPIRE', stream, ttl)
redis.call('EXPIRE', counter, ttl)
if dkey ~= '' then
  redis.call('HSET', dedup, 'max:' .. dkey, didx, 'seq:' .. dkey .. ':' .. didx, seq)
  redis.call('EXPIRE', dedup, ttl)
end
return {0, seq}
"""


@dataclass(frozen=True, slots=True)
class Published:
    """What :meth:`EventBus.publish` did with one event."""

    event: Event
    """The event with its ``seq`` set. For a duplicate: the ``seq`` the first attempt got (``0``
    if that is no longer known); the event itself is the one passed in, not the stored copy."""
    duplicate: bool = False
    """True when a previous attempt already published this (dedup key, index): nothing was sent."""
    fenced: bool = False
    """True when the lease given with it is not held by its token (any more): nothing was sent."""

    @property
    def seq(self) -> int:
        return self.event.seq


class Outgoing(NamedTuple):
    """One event to publish, with the dedup key and index :meth:`EventBus.publish` takes."""

    event: Event
    dedup_key: str | None = None
    dedup_index: int | None = None
    #: (lease key, token): publish only while that lease is the token's.
    fence: tuple[str, str] | None = None


class SessionKeys(NamedTuple):
    """Where one session's events are kept (see the module docstring)."""

    stream: str
    seq: str
    dedup: str
    channel: str


class _Flag(Protocol):
    def is_set(self) -> bool: ...


class Gap(enum.Enum):
    """What a :class:`SharedLive` hands out when live messages may have been lost."""

    GAP = "gap"


#: Live messages may have been lost since the last one: read the stream.
GAP = Gap.GAP


class SharedLive(Protocol):
    """One reader's subscription to a session's channel on a pub/sub connection that many
    readers share; :meth:`EventBus.afollow` follows the session through it."""

    async def listen(self) -> None:
        """Return once the channel is subscribed on the shared connection (at once if it is);
        raise a redis ``ConnectionError`` or ``TimeoutError`` when it is not within a bound."""

    async def receive(self, wait: float) -> bytes | Literal[Gap.GAP] | None:
        """The next message published on the channel (its data); :data:`GAP` when messages may
        have been lost since the last one; ``None`` when none came within ``wait`` seconds."""


class EventBus:
    """Per-session event streams on Redis with exactly-once, in-order delivery to subscribers.

    ``client`` publishes and serves :meth:`subscribe`; :meth:`asubscribe` needs ``async_client``
    (a ``redis.asyncio.Redis`` for the same server, used only from one event loop). Both clients
    stay the caller's to close. ``maxlen`` bounds each session's stream (trimmed approximately,
    so a stream may hold up to one stream node, 100 entries by default, more); ``ttl`` (seconds)
    is refreshed on every publish. A subscriber that loses Redis reconnects and resumes; it gives
    up, raising the last error, when reconnecting has failed for ``retry_for`` seconds. When the
    channel is silent for ``recheck`` seconds it reads the stream anyway, which bounds how late an
    event whose pub/sub message was lost can arrive.
    """

    def __init__(
        self,
        client: redis.Redis,
        prefix: str = "ongrid:",
        *,
        async_client: redis.asyncio.Redis | None = None,
        maxlen: int = 10_000,
        ttl: int = 7 * 24 * 3600,
        recheck: float = 1.0,
        retry_for: float = 30.0,
    ) -> None:
        if maxlen < 1:
            raise UserError(f"event bus maxlen must be at least 1, got {maxlen}")
        if ttl < 1:
            raise UserError(f"event bus ttl must be at least 1 second, got {ttl}")
        self._client = client
        self._aclient = async_client
        self.prefix = prefix
        self.maxlen = maxlen
        self.ttl = ttl
        self.recheck = recheck
        self.retry_for = retry_for
        self._publish = client.register_script(_PUBLISH_LUA)

    def keys(self, session_id: str) -> SessionKeys:
        """The Redis names the session's events live under."""
        p = self.prefix
        return SessionKeys(
            stream=f"{p}events:{session_id}",
            seq=f"{p}seq:{session_id}",
            dedup=f"{p}dedup:{session_id}",
            channel=scoped(self._client, p, f"live:{session_id}"),
        )

    # --- writing ------------------------------------------------------------------------------

    def publish(
        self, event: Event, *, dedup_key: str | None = None, dedup_index: int | None = None
    ) -> Published:
        """Number, store and announce ``event`` in its session; any ``seq`` it carries is ignored.

        A spawn that may run again after a crash passes ``dedup_key`` (e.g. ``spawn:<id>``) and
        ``dedup_index``, its own count of events (0, 1, 2, …). An index at or below the highest
        one already published under that key is a duplicate: nothing is stored or sent, and the
        result carries the earlier ``seq``. Indexes need not be contiguous, only increasing.
        """
        keys, args = self._script_call(Outgoing(event, dedup_key, dedup_index))
        return _published(event, self._publish(keys=keys, args=args))

    async def apublish_many(
        self, items: Sequence[Outgoing], *, client: redis.asyncio.Redis | None = None
    ) -> list[Published | ResponseError]:
        """:meth:`publish` for each item, in order, in one pipeline on ``client`` (default:
        ``async_client``): one round trip for the lot.

        The pipeline is not a transaction: each event is numbered, stored and announced atomically
        by the script, and an event the server refused (e.g. out of memory) is returned as its
        error in its place while the others go on. A lost connection raises; redis-py may then
        send the pipeline again, which only dedup keys make harmless, so pass them.
        """
        client = client if client is not None else self._aclient
        if client is None:
            raise UserError("EventBus.apublish_many needs async_client=redis.asyncio.Redis(...)")
        calls = [self._script_call(item) for item in items]
        replies = await self._evalsha_all(client, calls)
        if missing := [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]:
            # The server lost its script cache (restart, SCRIPT FLUSH): the refused events form
            # the tail of the pipeline, so running them again in order keeps the order.
            await client.script_load(_PUBLISH_LUA)
            again = await self._evalsha_all(client, [calls[i] for i in missing])
            for i, reply in zip(missing, again, strict=True):
                replies[i] = reply
        return [
            reply if isinstance(reply, ResponseError) else _published(item.event, reply)
            for item, reply in zip(items, replies, strict=True)
        ]

    def _script_call(self, item: Outgoing) -> tuple[list[str], list[Any]]:
        """The publish script's keys and arguments for one event."""
        event, dedup_key, dedup_index, fence = item
        if (dedup_key is None) != (dedup_index is None):
            raise ValueError("pass dedup_key and dedup_index together, or neither")
        keys = self.keys(event.session_id)
        args = [
            keys.channel,
            event.model_dump_json(exclude={"seq"}),
            self.maxlen,
            self.ttl,
            dedup_key or "",
            -1 if dedup_index is None else dedup_index,
        ]
        if fence is None:
            return [keys.stream, keys.seq, keys.dedup], args
        lease_key, token = fence
        return [keys.stream, keys.seq, keys.dedup, lease_key], [*args, token]

    async def _evalsha_all(
        self, client: redis.asyncio.Redis, calls: Sequence[tuple[list[str], list[Any]]]
    ) -> list[Any]:
        # EVALSHA directly rather than through a registered script: redis-py would add a round
        # trip (SCRIPT EXISTS) to every pipeline to check what a NOSCRIPT reply tells anyway.
        async with client.pipeline(transaction=False) as pipe:
            for keys, args in calls:
                pipe.evalsha(self._publish.sha, len(keys), *keys, *args)
            return list(await pipe.execute(raise_on_error=False))

    # --- reading ------------------------------------------------------------------------------

    def last_seq(self, session_id: str) -> int:
        """The highest ``seq`` handed out in the session, ``0`` before the first event."""
        value: Any = self._client.get(self.keys(session_id).seq)
        return int(value or 0)

    def last_event_of(self, session_id: str, dedup_key: str) -> Event | None:
        """The last event published under ``dedup_key`` in the session, if still stored."""
        dedup = self.keys(session_id).dedup
        index: Any = self._client.hget(dedup, f"max:{dedup_key}")
        if index is None:
            return None
        seq: Any = self._client.hget(dedup, f"seq:{dedup_key}:{int(index)}")
        if not seq:
            return None
        found = self.history(session_id, after_seq=int(seq) - 1, limit=1)
        return found[0] if found and found[0].seq == int(seq) else None

    def history(self, session_id: str, after_seq: int = 0, limit: int | None = None) -> list[Event]:
        """Stored events with ``seq > after_seq``, oldest first; events past retention are gone."""
        entries = self._client.xrange(self.keys(session_id).stream, *_after(after_seq), count=limit)
        return _decode_entries(entries)

    async def ahistory(self, session_id: str, client: redis.asyncio.Redis) -> list[Event]:
        """:meth:`history` of the whole session, read with ``client`` (an engine's)."""
        entries = await client.xrange(self.keys(session_id).stream, *_after(0))
        return _decode_entries(entries)

    def read_blocking(self, session_id: str, after_seq: int, block_seconds: float) -> list[Event]:
        """Stored events with ``seq > after_seq``; when there is none yet, wait up to
        ``block_seconds`` for the next ones (``XREAD BLOCK``).

        For a reader that only needs to know when something happened, not to show it as it
        streams: it is no subscriber of the live channel, so it does not count as someone
        watching the session (a worker streams model replies only to sessions watched live).
        """
        stream = self.keys(session_id).stream
        block = max(1, int(block_seconds * 1000))
        reply: Any = self._client.xread({stream: f"{after_seq}-0"}, count=_CHUNK, block=block)
        return [event for _name, entries in reply or () for event in _decode_entries(entries)]

    def subscribe(
        self,
        session_id: str,
        after_seq: int = 0,
        *,
        stop: threading.Event | _Flag | None = None,
        timeout: float | None = None,
        until: Callable[[Event], bool] | None = None,
    ) -> Iterator[Event]:
        """Yield every event with ``seq > after_seq`` exactly once, in order, then follow live.

        Ends when ``stop`` (anything with ``is_set()``, looked at every fraction of a second) is
        set, when ``timeout`` seconds pass without an event, or right after
        yielding an event for which ``until`` is true. Events trimmed by retention are skipped.
        """
        steps = _follow(after_seq, stop, timeout, until, self.recheck, self.retry_for)
        return _drive(steps, _BlockingIO(self, session_id))

    def asubscribe(
        self,
        session_id: str,
        after_seq: int = 0,
        *,
        stop: asyncio.Event | threading.Event | None = None,
        timeout: float | None = None,
        until: Callable[[Event], bool] | None = None,
    ) -> AsyncIterator[Event]:
        """:meth:`subscribe` for asyncio, on ``async_client``; cancelling ends only the reader."""
        if self._aclient is None:
            raise UserError("EventBus.asubscribe needs async_client=redis.asyncio.Redis(...)")
        steps = _follow(after_seq, stop, timeout, until, self.recheck, self.retry_for)
        return _adrive(steps, _AsyncIO(self, self._aclient, session_id))

    def afollow(
        self,
        session_id: str,
        after_seq: int,
        *,
        live: SharedLive,
        client: redis.asyncio.Redis,
        stop: asyncio.Event | threading.Event | None = None,
        timeout: float | None = None,
        until: Callable[[Event], bool] | None = None,
    ) -> AsyncIterator[Event]:
        """:meth:`asubscribe` on shared connections: live messages come from ``live``, a
        subscription to the channel of :meth:`keys` ``(session_id)`` that stays its owner's
        (it is neither opened nor closed here), stored events are read with ``client`` (a
        bounded pool many readers share). Same delivery: every event with ``seq > after_seq``
        exactly once, in order; a :data:`GAP` or a quiet channel sends the reader to the
        stream."""
        steps = _follow(after_seq, stop, timeout, until, self.recheck, self.retry_for)
        return _adrive(steps, _SharedIO(self, session_id, live, client))


# --- the subscriber protocol, free of I/O ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Listen:
    """(Re)subscribe to the live channel; done once the server has confirmed it."""


@dataclass(frozen=True, slots=True)
class _Read:
    """Reply with up to ``count`` stored events with ``seq > after``, oldest first."""

    after: int
    count: int


@dataclass(frozen=True, slots=True)
class _Receive:
    """Reply with the next live event, or ``None`` if none came within ``timeout`` seconds, or
    :data:`GAP` if live events may have been lost."""

    timeout: float


@dataclass(frozen=True, slots=True)
class _Pause:
    """Drop the subscription and wait ``seconds`` before the next attempt."""

    seconds: float


@dataclass(frozen=True, slots=True)
class _Deliver:
    """Hand ``event`` to the consumer."""

    event: Event


_Op = _Listen | _Read | _Receive | _Pause | _Deliver
_Steps = Generator[_Op, Any, None]


class _Cursor:
    """What a subscriber has delivered so far and when it should end."""

    def __init__(
        self,
        last: int,
        stop: _Flag | None,
        timeout: float | None,
        until: Callable[[Event], bool] | None,
    ) -> None:
        self.last, self.stop, self.timeout, self.until = last, stop, timeout, until
        self.done = False
        self._idle_since = time.monotonic()

    def over(self) -> bool:
        """True, and ``done`` from now on, once ``stop`` is set or the idle timeout has passed."""
        stopped = self.stop is not None and self.stop.is_set()
        idle = self.timeout is not None and time.monotonic() >= self._idle_since + self.timeout
        self.done = self.done or stopped or idle
        return self.done

    def wait_time(self) -> float | None:
        """How long to wait for the next live event; ``None`` when the subscription is over."""
        if self.over():
            return None
        if self.timeout is None:
            return _POLL
        return max(0.0, min(_POLL, self._idle_since + self.timeout - time.monotonic()))

    def deliver(self, events: Sequence[Event]) -> _Steps:
        """Deliver the events that come after ``last``; duplicates and stale ones are dropped."""
        for event in events:
            if self.done or (self.stop is not None and self.stop.is_set()):
                self.done = True
                return
            if event.seq <= self.last:
                continue
            self.last = event.seq
            yield _Deliver(event)
            self._idle_since = time.monotonic()
            if self.until is not None and self.until(event):
                self.done = True

    def catch_up(self) -> _Steps:
        """Deliver everything the stream holds after ``last``."""
        while not self.done:
            batch = yield _Read(self.last, _CHUNK)
            yield from self.deliver(batch)
            if len(batch) < _CHUNK:
                return

    def follow_live(self, recheck: float) -> _Steps:
        """Deliver live events; go back to the stream on a gap or after ``recheck`` s of quiet."""
        quiet_since = time.monotonic()
        while (wait := self.wait_time()) is not None:
            event = yield _Receive(wait)
            now = time.monotonic()
            if event is None:
                if now - quiet_since >= recheck:
                    yield from self.catch_up()
                    quiet_since = now
                continue
            quiet_since = now
            if event is GAP:  # the live messages in between are lost; the stream has them
                yield from self.catch_up()
                continue
            if event.seq > self.last + 1:
                yield from self.catch_up()
            # Also after a catch-up: the stream may have expired while the channel still talks.
            yield from self.deliver([event])


def _follow(
    after_seq: int,
    stop: _Flag | None,
    timeout: float | None,
    until: Callable[[Event], bool] | None,
    recheck: float,
    retry_for: float,
) -> _Steps:
    """The whole subscriber: listen, catch up, follow; on a Redis error reconnect and resume."""
    cursor = _Cursor(after_seq, stop, timeout, until)
    failing_since: float | None = None
    failures = 0
    while not cursor.done:
        try:
            # Listen before reading: an event stored after the read is then surely announced.
            yield _Listen()
            yield from cursor.catch_up()
            failing_since, failures = None, 0
            yield from cursor.follow_live(recheck)
        except _RETRYABLE:
            now = time.monotonic()
            failing_since = now if failing_since is None else failing_since
            if now - failing_since >= retry_for:
                raise
            failures += 1
            yield _Pause(min(1.0, 0.05 * 2**failures))
            cursor.over()  # ``stop`` and the idle timeout also end a subscriber that is down


# --- carrying the protocol out ----------------------------------------------------------------


def _drive(steps: _Steps, io: _BlockingIO) -> Iterator[Event]:
    reply: Any = None
    failure: BaseException | None = None
    try:
        while True:
            try:
                op = steps.send(reply) if failure is None else steps.throw(failure)
            except StopIteration:
                return
            reply, failure = None, None
            if isinstance(op, _Deliver):
                yield op.event
                continue
            try:
                reply = io.run(op)
            except _RETRYABLE as exc:
                failure = exc
    finally:
        steps.close()
        io.close()


class _AsyncRunner(Protocol):
    async def run(self, op: _Op) -> Any: ...

    async def aclose(self) -> None: ...


async def _adrive(steps: _Steps, io: _AsyncRunner) -> AsyncIterator[Event]:
    reply: Any = None
    failure: BaseException | None = None
    try:
        while True:
            try:
                op = steps.send(reply) if failure is None else steps.throw(failure)
            except StopIteration:
                return
            reply, failure = None, None
            if isinstance(op, _Deliver):
                yield op.event
                continue
            try:
                reply = await io.run(op)
            except _RETRYABLE as exc:
                failure = exc
    finally:
        steps.close()
        await io.aclose()


class _PubSubIO:
    """What both drivers share: the session, the subscription, and noticing silent reconnects."""

    def __init__(self, bus: EventBus, session_id: str) -> None:
        self._bus, self._keys = bus, bus.keys(session_id)
        self._pubsub: Any = None
        self._reconnected = False

    def _watch(self) -> None:
        self._reconnected = False
        self._pubsub.connection.register_connect_callback(self._on_connect)

    def _on_connect(self, connection: Any) -> None:
        # redis-py re-subscribes on its own after a dropped connection and does not say so;
        # whatever was published meanwhile is lost on the channel. Treat it as the error it hides.
        self._reconnected = True

    def _live_event(self, message: dict[str, Any] | None) -> Event | None:
        if self._reconnected:
            raise RedisConnectionError("pub/sub connection was re-established; resuming")
        return _decode_message(message)

    def _detach(self) -> Any:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None and pubsub.connection is not None:
            pubsub.connection.deregister_connect_callback(self._on_connect)
        return pubsub


class _BlockingIO(_PubSubIO):
    def run(self, op: _Op) -> Any:
        keys = self._keys
        match op:
            case _Listen():
                self.close()
                self._pubsub = self._bus._client.pubsub()
                self._pubsub.subscribe(keys.channel)
                deadline = time.monotonic() + _CONFIRM
                while not _is_confirmation(self._pubsub.get_message(timeout=_left(deadline))):
                    pass
                self._watch()
            case _Read(after, count):
                return _decode_entries(
                    self._bus._client.xrange(keys.stream, *_after(after), count=count)
                )
            case _Receive(wait):
                return self._live_event(self._pubsub.get_message(timeout=wait))
            case _Pause(seconds):
                self.close()
                time.sleep(seconds)
        return None

    def close(self) -> None:
        if (pubsub := self._detach()) is not None:
            pubsub.close()


class _AsyncIO(_PubSubIO):
    def __init__(self, bus: EventBus, client: redis.asyncio.Redis, session_id: str) -> None:
        super().__init__(bus, session_id)
        self._client = client

    async def run(self, op: _Op) -> Any:
        keys = self._keys
        match op:
            case _Listen():
                await self.aclose()
                self._pubsub = self._client.pubsub()
                await self._pubsub.subscribe(keys.channel)
                deadline = time.monotonic() + _CONFIRM
                while not _is_confirmation(await self._pubsub.get_message(timeout=_left(deadline))):
                    pass
                self._watch()
            case _Read(after, count):
                return _decode_entries(
                    await self._client.xrange(keys.stream, *_after(after), count=count)
                )
            case _Receive(wait):
                return self._live_event(await self._pubsub.get_message(timeout=wait))
            case _Pause(seconds):
                await self.aclose()
                await asyncio.sleep(seconds)
        return None

    async def aclose(self) -> None:
        if (pubsub := self._detach()) is not None:
            await pubsub.aclose()


class _SharedIO:
    """The asyncio driver on shared connections: live messages from a :class:`SharedLive`,
    stored events read on a shared pool. Holds nothing of its own to close."""

    def __init__(
        self, bus: EventBus, session_id: str, live: SharedLive, client: redis.asyncio.Redis
    ) -> None:
        self._stream, self._live, self._client = bus.keys(session_id).stream, live, client

    async def run(self, op: _Op) -> Any:
        match op:
            case _Listen():
                await self._live.listen()
            case _Read(after, count):
                return _decode_entries(
                    await self._client.xrange(self._stream, *_after(after), count=count)
                )
            case _Receive(wait):
                data = await self._live.receive(wait)
                return data if data is None or data is GAP else EVENT_ADAPTER.validate_json(data)
            case _Pause(seconds):
                await asyncio.sleep(seconds)
        return None

    async def aclose(self) -> None:
        return None


# --- small helpers ----------------------------------------------------------------------------


def _published(event: Event, reply: Any) -> Published:
    """The publish script's reply ``{duplicate, seq}`` as a :class:`Published`."""
    outcome, seq = reply
    fenced = int(outcome) == 2
    return Published(
        event.model_copy(update={"seq": int(seq)}),
        duplicate=int(outcome) == 1,
        fenced=fenced,
    )


def _after(seq: int) -> tuple[str, str]:
    """XRANGE bounds for every entry with ``seq`` greater than the given one."""
    return f"{seq + 1}-0", "+"


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise RedisTimeoutError(f"no SUBSCRIBE confirmation within {_CONFIRM}s")
    return left


def _is_confirmation(message: dict[str, Any] | None) -> bool:
    return message is not None and message["type"] == "subscribe"


def _decode_message(message: dict[str, Any] | None) -> Event | None:
    if message is None or message["type"] != "message":
        return None
    return EVENT_ADAPTER.validate_json(message["data"])


def _decode_entries(entries: Any) -> list[Event]:
    """Stream entries to events; field names are bytes or str depending on ``decode_responses``."""
    return [
        EVENT_ADAPTER.validate_json(fields[b"event"] if b"event" in fields else fields["event"])
        for _id, fields in entries
    ]
