"""Server-Sent Events: a thin layer over :meth:`workers.events.EventBus.asubscribe`.

Each event becomes one SSE message: ``id:`` its per-session ``seq`` (what a reconnecting client
sends back as ``Last-Event-ID``), ``event:`` its type, ``data:`` its JSON envelope. A comment line
goes out every :data:`KEEPALIVE_SECONDS` of silence so proxies keep the connection open.

A client disconnect sets the subscription's ``stop`` flag: the subscription ends and closes its
own Redis connections; the spawns behind the stream run on, their events wait in Redis.
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
import redis.asyncio
from fastapi import Depends, Header, Query
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

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
    client: redis.Redis,
    redis_url: str,
    session_id: str,
    after: int,
    stop: asyncio.Event,
    *,
    until: Callable[[Event], bool] | None = None,
    idle: float | None = None,
    on_event: Callable[[Event], Awaitable[None]] | None = None,
    keep: Callable[[Event], bool] | None = None,
    bus_type: type[EventBus] = EventBus,
    keepalive: float = KEEPALIVE_SECONDS,
    give_up_after: float = REDIS_GIVE_UP_SECONDS,
) -> AsyncIterator[bytes]:
    """SSE messages for the session's events after ``after``, live, until ``stop`` is set, an
    event satisfies ``until``, or (with ``idle``) nothing came for ``idle`` seconds.
    ``on_event`` runs before an event is sent (e.g. to store a final answer first); an event
    ``keep`` rejects is not sent. ``bus_type``: the bus the events are on (a session's, or a
    feed of its own such as the approval feed). Ends, with a warning logged, once Redis has not
    answered for ``give_up_after`` seconds (no keepalive is sent meanwhile)."""
    aclient = redis.asyncio.Redis.from_url(redis_url)
    bus = bus_type(client, async_client=aclient)
    last, quiet_since = after, time.monotonic()
    failing_since: float | None = None
    try:
        while not stop.is_set():
            wait = keepalive
            if idle is not None:
                wait = min(wait, idle - (time.monotonic() - quiet_since))
                if wait <= 0:
                    return
            events = bus.asubscribe(session_id, last, stop=stop, timeout=wait, until=until)
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
                await asyncio.wait_for(aclient.ping(), _PING_TIMEOUT)
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
    finally:
        with anyio.CancelScope(shield=True):
            await aclient.aclose()


class EventStreamResponse(StreamingResponse):
    """``text/event-stream`` whose producer is told about a disconnect instead of cancelled.

    Starlette's StreamingResponse cancels the producer when the client goes away, which can
    interrupt the subscription in the middle of a Redis call; here the producer gets a ``stop``
    flag and winds down on its own, closing its connections.
    """

    media_type = "text/event-stream"

    def __init__(self, factory: StreamFactory, headers: dict[str, str] | None = None) -> None:
        self._stop = asyncio.Event()
        base = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        super().__init__(factory(self._stop), headers={**base, **(headers or {})})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            self._stop.set()

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(watch)
            try:
                await self.stream_response(send)
            finally:
                tasks.cancel_scope.cancel()
                with anyio.CancelScope(shield=True):
                    await self.body_iterator.aclose()  # type: ignore[attr-defined]
