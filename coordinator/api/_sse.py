"""Server-Sent Events: a thin layer over :meth:`workers.events.EventBus.afollow`.

Each event becomes one SSE message: ``id:`` its per-session ``seq`` (what a reconnecting client
sends back as ``Last-Event-ID``), ``event:`` its type, ``data:`` its JSON envelope. A comment line
goes out every :data:`KEEPALIVE_SECONDS` of silence so proxies keep the connection open.

Streams open no Redis connection of their own: they share the process's
:class:`~coordinator.api.stream_hub.StreamHub` (one pub/sub connection, one bounded pool). Each
holds a slot of :class:`~coordinator.api.limits.StreamSlots` from before it is answered until it
ends, however it ends.

A client disconnect sets the subscription's ``stop`` flag: the subscription ends and lets go of
its channel; the spawns behind the stream run on, their events wait in Redis.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Annotated, cast

import anyio
import redis
from fastapi import Depends, Header, Query
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from coordinator.api.limits import StreamSlot
from coordinator.api.stream_hub import StreamHub
from workers.events import EventBus
from workers.messages import Event

log = logging.getLogger(__name__)

__all__ = [
    "KEEPALIVE_SECONDS",
    "EventStreamResponse",
    "ResumeAfter",
    "UntilIdle",
    "follow",
    "sse_message",
]

KEEPALIVE_SECONDS = 15.0
#: Seconds Redis may fail to answer before an open stream is ended: the client's reconnect then
#: gets the 503 that names the cause, instead of keepalives from a stream that can deliver
#: nothing. Short outages (a Redis restart) pass unnoticed: the bus retries meanwhile.
REDIS_GIVE_UP_SECONDS = 30.0
#: Seconds one Redis health check of an open stream may take.
_PING_TIMEOUT = 5.0

StreamFactory = Callable[[asyncio.Event], AsyncIterator[bytes]]


def _resume_after(
    after: Annotated[int | None, Query(ge=0, description="Resume after this seq.")] = None,
    last_event_id: Annotated[
        int | None,
        Header(alias="Last-Event-ID", ge=0, description="Resume after this seq (wins over after)."),
    ] = None,
) -> int:
    return last_event_id if last_event_id is not None else (after or 0)


#: Where a stream starts: after the ``Last-Event-ID`` a reconnecting client sends, else after
#: the ``after`` query parameter, else from the beginning.
ResumeAfter = Annotated[int, Depends(_resume_after)]
#: ``until_idle``: end the stream after this many quiet seconds (``None``: at disconnect).
UntilIdle = Annotated[
    float | None,
    Query(gt=0, le=86_400, description="End the stream after this many quiet seconds."),
]


def sse_message(event: Event) -> bytes:
    """One SSE message; the JSON is a single line (newlines in strings are escaped)."""
    return f"id: {event.seq}\nevent: {event.type}\ndata: {event.model_dump_json()}\n\n".encode()


async def follow(
    hub: StreamHub,
    bus: EventBus,
    session_id: str,
    after: int,
    stop: asyncio.Event,
    *,
    until: Callable[[Event], bool] | None = None,
    idle: float | None = None,
    on_event: Callable[[Event], Awaitable[None]] | None = None,
    keep: Callable[[Event], bool] | None = None,
    keepalive: float = KEEPALIVE_SECONDS,
    give_up_after: float = REDIS_GIVE_UP_SECONDS,
) -> AsyncIterator[bytes]:
    """SSE messages for the session's events after ``after``, live, until ``stop`` is set, an
    event satisfies ``until``, or (with ``idle``) nothing came for ``idle`` seconds.
    ``on_event`` runs before an event is sent (e.g. to store a final answer first); an event
    ``keep`` rejects is not sent. ``bus``: the bus the events are on (a session's, or a feed
    of its own such as the approval feed). Live messages come through ``hub``, stored events
    from its pool. Ends, with a warning logged, once Redis has not answered for
    ``give_up_after`` seconds (no keepalive is sent meanwhile)."""
    last, quiet_since = after, time.monotonic()
    failing_since: float | None = None
    with hub.subscribe(bus.keys(session_id).channel) as live:
        while not stop.is_set():
            wait = keepalive
            if idle is not None:
                wait = min(wait, idle - (time.monotonic() - quiet_since))
                if wait <= 0:
                    return
            events = bus.afollow(
                session_id,
                last,
                live=live,
                client=hub.client,
                stop=stop,
                timeout=wait,
                until=until,
            )
            async with aclosing(cast(AsyncGenerator[Event, None], events)) as stream:
                async for event in stream:
                    last = event.seq
                    if keep is not None and not keep(event):
                        continue
                    quiet_since = time.monotonic()
                    if on_event is not None:
                        await on_event(event)
                    yield sse_message(event)
                    if until is not None and until(event):
                        return
            if stop.is_set():
                break
            try:
                await asyncio.wait_for(hub.client.ping(), _PING_TIMEOUT)
                failing_since = None
            except (redis.RedisError, OSError, TimeoutError) as exc:
                now = time.monotonic()
                failing_since = now if failing_since is None else failing_since
                if now - failing_since >= give_up_after:
                    log.warning(
                        "ending the event stream of %s: Redis has not answered for %.0f s (%s)",
                        session_id,
                        now - failing_since,
                        exc,
                    )
                    return
                continue
            if idle is None or time.monotonic() - quiet_since < idle:
                yield b": keepalive\n\n"


class EventStreamResponse(StreamingResponse):
    """``text/event-stream`` whose producer is told about a disconnect instead of cancelled.

    Starlette's StreamingResponse cancels the producer when the client goes away, which can
    interrupt the subscription in the middle of a Redis call; here the producer gets a ``stop``
    flag and winds down on its own, letting go of its channel.

    ``slot``: the stream's place in the per-user and per-process bounds, given back when the
    response ends, whether the stream ended, the client went away or anything failed.
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        factory: StreamFactory,
        headers: dict[str, str] | None = None,
        *,
        slot: StreamSlot | None = None,
    ) -> None:
        self._stop = asyncio.Event()
        self._slot = slot
        base = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        super().__init__(factory(self._stop), headers={**base, **(headers or {})})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            self._stop.set()

        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(watch)
                try:
                    await self.stream_response(send)
                finally:
                    tasks.cancel_scope.cancel()
                    with anyio.CancelScope(shield=True):
                        await self.body_iterator.aclose()  # type: ignore[attr-defined]
        finally:
            if self._slot is not None:
                self._slot.release()
