"""One writer per worker process for the events its spawns emit: text coalesced, publishes batched.

A streamed reply comes as dozens of small text deltas, and a process holds many spawns; one Redis
round trip per delta costs more CPU than the model call that produced it. So the spawns of an
engine's event loop emit into an :class:`EventWriter`:

* per spawn (:meth:`EventWriter.sink`), text deltas are buffered and leave as ONE delta, joined,
  carrying the dedup index of the last one merged: when the writer starts its next round (at once
  when it is idle, so a quiet process adds no delay; under load, the deltas that arrived while
  the previous round was in flight merge), when the buffer holds :data:`TEXT_FLUSH_CHARS`
  characters, and before any other event of the spawn is queued (a tool call never overtakes the
  text written before it). ``text_flush_after`` > 0 makes text wait up to that long instead;
* one writer task takes every event queued since its last round and publishes them, in the order
  they were queued, in one pipeline of the bus's publish script
  (:meth:`~workers.events.EventBus.apublish_many`). Each event is still numbered atomically in its
  session and de-duplicated under ``spawn:<id>`` exactly as :meth:`EventBus.publish` does.

A spawn's checkpoint awaits :meth:`SpawnSink.flushed` before it saves, so the event index it saves
never gets ahead of what was published. A batch that fails is never dropped silently: the error
comes out of ``flushed()`` (and out of the sink's next ``emit``), the sink publishes nothing more,
and the writer hands a fresh sink to the spawn's next attempt, which resumes from its last
checkpoint and re-emits what was lost (the dedup index drops what did get through).

A merged delta is published whole or dropped whole: a resumed attempt whose merged delta spans
the index the lost attempt reached publishes that text again.

Everything here runs on the engine's event loop; ``emit`` must be called from that loop's thread.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import redis
import redis.asyncio

from registry.errors import LeaseLost
from workers.events import EventBus, Outgoing, Published
from workers.messages import Event, TextDelta

__all__ = [
    "TEXT_FLUSH_AFTER",
    "TEXT_FLUSH_CHARS",
    "EventWriter",
    "PublishFailed",
    "SpawnSink",
]

log = logging.getLogger(__name__)

#: Buffered characters of a spawn's text that are published at once as one delta.
TEXT_FLUSH_CHARS = 512
#: Seconds after the first buffered delta of a spawn that its text is published anyway; 0: at the
#: writer's next round. Measured: a 40 ms linger put 20 ms on every delta's latency for no CPU
#: the next round does not save as well.
TEXT_FLUSH_AFTER = 0.0


class PublishFailed(redis.RedisError):
    """A spawn's events were not all published; its next checkpoint must not be saved.

    A :class:`redis.RedisError`, so the runtime treats it as the infrastructure failure it is:
    the attempt ends and the next one resumes from the last checkpoint.
    """


@dataclass(slots=True)
class _Queued:
    sink: SpawnSink
    event: Event
    index: int


class EventWriter:
    """The event loop's publisher: per-spawn sinks in, one pipelined batch per round out.

    ``client`` (a ``redis.asyncio.Redis`` for the bus's server) stays the caller's to close.
    ``on_published`` is called with each event stored (its ``seq`` set; not for duplicates);
    an exception it raises is logged and otherwise ignored.
    """

    def __init__(
        self,
        bus: EventBus,
        client: redis.asyncio.Redis,
        *,
        on_published: Callable[[Event], None] | None = None,
        text_flush_chars: int = TEXT_FLUSH_CHARS,
        text_flush_after: float = TEXT_FLUSH_AFTER,
    ) -> None:
        self.bus, self.client = bus, client
        self.on_published = on_published
        self.text_flush_chars, self.text_flush_after = text_flush_chars, text_flush_after
        self._queue: list[_Queued] = []
        #: Sinks holding text for the next round (a dict: ordered, no repeats).
        self._texts: dict[SpawnSink, None] = {}
        self._sinks: weakref.WeakValueDictionary[str, SpawnSink] = weakref.WeakValueDictionary()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        #: Round trips made to Redis so far (one per batch, plus a script reload if needed).
        self.batches = 0

    def start(self) -> None:
        """Start the writer task on the running event loop."""
        if self._task is not None:
            raise RuntimeError("the event writer is started already")
        self._task = asyncio.get_running_loop().create_task(self._run(), name="event-writer")

    async def aclose(self) -> None:
        """Publish everything emitted so far, buffered text included, then stop the writer."""
        for sink in list(self._sinks.values()):
            sink._flush_text()
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await self._task

    def sink(self, spawn_id: str, fence: tuple[str, str] | None = None) -> SpawnSink:
        """The sink of ``spawn_id``: the same one for as long as anything holds it, so every
        event of an attempt goes through one buffer, in order. ``fence`` (lease key, token):
        its events are published only while that lease is the attempt's; an attempt under
        another token gets a sink of its own."""
        sink = self._sinks.get(spawn_id)
        if sink is None or sink.fence != fence:
            sink = self._sinks[spawn_id] = SpawnSink(self, spawn_id, fence)
        return sink

    def _enqueue(self, sink: SpawnSink, event: Event, index: int) -> None:
        if self._closing or self._task is None:
            raise RuntimeError("the event writer is not running: start() it on the engine's loop")
        self._queue.append(_Queued(sink, event, index))
        sink._queued += 1
        self._wake.set()

    def _forget(self, sink: SpawnSink) -> None:
        if self._sinks.get(sink.spawn_id) is sink:
            del self._sinks[sink.spawn_id]

    def _text_waiting(self, sink: SpawnSink) -> None:
        self._texts[sink] = None
        self._wake.set()

    async def _run(self) -> None:
        try:
            while True:
                texts, self._texts = self._texts, {}
                for sink in texts:
                    sink._flush_text()
                if not self._queue:
                    if self._closing:
                        return
                    await self._wake.wait()
                    self._wake.clear()
                    continue
                batch, self._queue = self._queue, []
                await self._publish(batch)
        finally:
            # Cancelled or broken: nobody may wait for a publish that will not happen.
            stranded, self._queue = self._queue, []
            for queued in stranded:
                queued.sink._settle(queued, RuntimeError("the event writer stopped"))

    async def _publish(self, batch: list[_Queued]) -> None:
        # A sink that failed publishes nothing more: a later index getting through would make
        # the dedup mark jump over the lost events, and the next attempt could not fill them in.
        sending = [q.sink._error is None for q in batch]
        live = [q for q, send in zip(batch, sending, strict=True) if send]
        interrupted: BaseException | None = None
        outcomes: list[Published | BaseException]
        try:
            items = [
                Outgoing(q.event, f"spawn:{q.sink.spawn_id}", q.index, q.sink.fence) for q in live
            ]
            self.batches += 1
            outcomes = list(await self.bus.apublish_many(items, client=self.client))
        except BaseException as exc:  # whatever it is, the waiters must hear of it
            outcomes = [exc] * len(live)
            interrupted = None if isinstance(exc, Exception) else exc
        results = iter(outcomes)
        for queued, send in zip(batch, sending, strict=True):
            outcome = next(results) if send else queued.sink._error
            if isinstance(outcome, Published) and outcome.fenced:
                outcome = LeaseLost(queued.sink.spawn_id)  # another attempt owns the spawn
            queued.sink._settle(queued, outcome)
            if isinstance(outcome, Published) and not outcome.duplicate:
                self._announce(outcome.event)
        if interrupted is not None:
            raise interrupted  # cancelled: stop, now that nobody waits on this batch

    def _announce(self, event: Event) -> None:
        if self.on_published is None:
            return
        try:
            self.on_published(event)
        except Exception:  # noqa: BLE001 - a metrics hook must not stop the events
            log.exception("on_published hook failed for event %s", event.seq)


class SpawnSink:
    """Where one spawn emits its events: ``emit`` queues, ``flushed`` waits for publication."""

    def __init__(
        self, writer: EventWriter, spawn_id: str, fence: tuple[str, str] | None = None
    ) -> None:
        self.spawn_id = spawn_id
        self.fence = fence
        self._writer = writer
        self._text: list[str] = []
        self._text_chars = 0
        self._text_first: TextDelta | None = None
        self._text_index = 0
        self._timer: asyncio.TimerHandle | None = None
        self._queued = 0
        self._settled = 0
        self._error: BaseException | None = None
        self._failed_at = 0
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    def emit(self, event: Event, index: int) -> None:
        """Queue ``event`` (the spawn's ``index``-th); never blocks. Text is buffered (see the
        module docstring). Raises :class:`PublishFailed` once an earlier event was lost."""
        if self._error is not None:
            raise self._failure()
        first = self._text_first
        mergeable = isinstance(event, TextDelta) and (
            first is None or first.session_id == event.session_id
        )
        if not mergeable:
            self._flush_text()
        if isinstance(event, TextDelta):
            self._buffer(event, index)
        else:
            self._writer._enqueue(self, event, index)

    async def flushed(self) -> None:
        """Return once everything emitted so far is published; :class:`PublishFailed` if any of
        it could not be (the sink is then spent: the spawn's attempt must end)."""
        self._flush_text()
        target = self._queued
        if self._error is None and self._settled >= target:
            return
        if self._error is not None:
            raise self._failure()
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append((target, waiter))
        await waiter

    def _buffer(self, delta: TextDelta, index: int) -> None:
        if self._text_first is None:
            self._text_first = delta
            linger = self._writer.text_flush_after
            if linger > 0:
                self._timer = asyncio.get_running_loop().call_later(linger, self._flush_text)
            else:
                self._writer._text_waiting(self)
        self._text.append(delta.text)
        self._text_chars += len(delta.text)
        self._text_index = index
        if self._text_chars >= self._writer.text_flush_chars:
            self._flush_text()

    def _flush_text(self) -> None:
        """Queue the buffered text as one delta (the first's envelope, the last's index)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._writer._texts.pop(self, None)
        first = self._text_first
        if first is None:
            return
        merged = (
            first
            if len(self._text) == 1
            else first.model_copy(update={"text": "".join(self._text)})
        )
        index = self._text_index
        self._text, self._text_chars, self._text_first = [], 0, None
        if self._error is None:
            self._writer._enqueue(self, merged, index)

    def _settle(self, queued: _Queued, outcome: Published | BaseException | None) -> None:
        self._settled += 1
        if isinstance(outcome, BaseException) and self._error is None:
            self._error = outcome
            self._failed_at = queued.index
            self._writer._forget(self)  # the spawn's next attempt starts from a clean sink
        self._wake_waiters()

    def _wake_waiters(self) -> None:
        still = []
        for target, waiter in self._waiters:
            if waiter.done():
                continue
            if self._error is not None:
                waiter.set_exception(self._failure())
            elif self._settled >= target:
                waiter.set_result(None)
            else:
                still.append((target, waiter))
        self._waiters = still

    def _failure(self) -> PublishFailed:
        failure = PublishFailed(
            f"events of spawn {self.spawn_id} from index {self._failed_at} were not published: "
            f"{self._error}"
        )
        failure.__cause__ = self._error
        return failure
