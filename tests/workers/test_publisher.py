"""The event writer against a real Redis (DB 5): text coalesced per spawn and flushed on size, on
its timer and before any other event; every round one pipeline, in order; ``flushed`` only after
publication; failures surfaced, never dropped; dedup of replayed indexes kept."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
import redis_server
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from registry.errors import LeaseLost
from workers.events import EventBus, Outgoing, Published
from workers.messages import Event, TaskNotification, TextDelta, ToolCallEvent
from workers.publisher import EventWriter, PublishFailed

URL = redis_server.url(5)
SESSION = "s1"
#: How long a condition may take to come true before the test calls the writer stuck.
LIVENESS = 30.0
NEVER = 3600.0


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    with redis.Redis.from_url(URL) as c:
        c.flushdb()
        yield c
        c.flushdb()


@pytest.fixture
def bus(client: redis.Redis) -> EventBus:
    return EventBus(client)


def run(bus: EventBus, body: Callable[[EventWriter], Awaitable[Any]], **options: Any) -> Any:
    """Run ``body(writer)`` on a fresh event loop with a started writer, closed afterwards."""

    async def main() -> Any:
        aclient = redis.asyncio.Redis.from_url(URL)
        writer = EventWriter(bus, aclient, **options)
        writer.start()
        try:
            return await body(writer)
        finally:
            await writer.aclose()
            await aclient.aclose()

    return asyncio.run(main())


async def eventually(condition: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + LIVENESS
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)
    return value


def delta(text: str, spawn_id: str = "a", session_id: str = SESSION) -> TextDelta:
    return TextDelta(session_id=session_id, spawn_id=spawn_id, text=text)


def call(call_id: str, spawn_id: str = "a") -> ToolCallEvent:
    return ToolCallEvent(
        session_id=SESSION, spawn_id=spawn_id, call_id=call_id, name="t", arguments="{}"
    )


def note(spawn_id: str = "a") -> TaskNotification:
    return TaskNotification(session_id=SESSION, spawn_id=spawn_id, status="ok")


def shape(events: list[Event]) -> list[tuple[str, str, str]]:
    return [(e.spawn_id, e.type, getattr(e, "text", getattr(e, "call_id", ""))) for e in events]


def test_deltas_merge_in_order_and_never_behind_the_next_event(bus: EventBus, client: redis.Redis):
    async def body(writer: EventWriter) -> int:
        sink = writer.sink("a")
        for i, text in enumerate(["Hel", "lo ", "there"]):
            sink.emit(delta(text), i)
        sink.emit(call("c1"), 3)
        sink.emit(delta("after"), 4)
        sink.emit(note(), 5)
        await sink.flushed()
        return writer.batches

    batches = run(bus, body, text_flush_after=NEVER)

    events = bus.history(SESSION)
    assert shape(events) == [
        ("a", "text", "Hello there"),
        ("a", "tool_call", "c1"),
        ("a", "text", "after"),
        ("a", "task_notification", ""),
    ]
    assert [e.seq for e in events] == [1, 2, 3, 4]
    assert client.hget(bus.keys(SESSION).dedup, "max:spawn:a") == b"5"
    assert batches == 1  # everything emitted before the writer ran went in one pipeline


def test_the_merged_delta_carries_the_last_index(bus: EventBus, client: redis.Redis):
    async def body(writer: EventWriter) -> None:
        sink = writer.sink("a")
        for i in range(4):
            sink.emit(delta(str(i)), i)
        await sink.flushed()

    run(bus, body, text_flush_after=NEVER)

    dedup = bus.keys(SESSION).dedup
    assert client.hget(dedup, "max:spawn:a") == b"3"
    assert client.hget(dedup, "seq:spawn:a:3") == b"1"
    assert shape(bus.history(SESSION)) == [("a", "text", "0123")]


def test_text_is_published_when_the_buffer_reaches_its_size(bus: EventBus):
    async def body(writer: EventWriter) -> list[Event]:
        sink = writer.sink("a")
        sink.emit(delta("ab"), 0)
        sink.emit(delta("cd"), 1)  # four characters: out without a timer or flushed()
        sink.emit(delta("e"), 2)
        published = await eventually(lambda: bus.history(SESSION), "the size flush")
        await sink.flushed()
        return published

    published = run(bus, body, text_flush_chars=4, text_flush_after=NEVER)

    assert shape(published) == [("a", "text", "abcd")]
    assert shape(bus.history(SESSION)) == [("a", "text", "abcd"), ("a", "text", "e")]


def test_text_is_published_when_its_timer_expires(bus: EventBus):
    async def body(writer: EventWriter) -> list[Event]:
        sink = writer.sink("a")
        sink.emit(delta("x"), 0)
        sink.emit(delta("y"), 1)
        return await eventually(lambda: bus.history(SESSION), "the timer flush")

    published = run(bus, body, text_flush_chars=10_000, text_flush_after=0.01)

    assert shape(published) == [("a", "text", "xy")]


def test_two_spawns_of_a_session_interleave_each_in_its_own_order(bus: EventBus):
    async def body(writer: EventWriter) -> None:
        a, b = writer.sink("a"), writer.sink("b")
        a.emit(delta("a1", "a"), 0)
        b.emit(delta("b1", "b"), 0)
        b.emit(call("cb", "b"), 1)  # b's text goes out first; a's stays buffered
        a.emit(delta("a2", "a"), 1)
        a.emit(call("ca", "a"), 2)
        b.emit(delta("b2", "b"), 2)
        a.emit(note("a"), 3)
        await asyncio.gather(a.flushed(), b.flushed())

    run(bus, body, text_flush_after=NEVER)

    events = bus.history(SESSION)
    assert shape(events) == [
        ("b", "text", "b1"),
        ("b", "tool_call", "cb"),
        ("a", "text", "a1a2"),
        ("a", "tool_call", "ca"),
        ("a", "task_notification", ""),
        ("b", "text", "b2"),
    ]
    assert [e.seq for e in events] == list(range(1, len(events) + 1))


def test_flushed_returns_once_the_stream_holds_every_event(bus: EventBus):
    async def body(writer: EventWriter) -> list[list[Event]]:
        seen = []
        for spawn in ("a", "b"):
            sink = writer.sink(spawn)
            for i in range(20):
                sink.emit(delta(f"{spawn}{i} ", spawn), i)
            sink.emit(note(spawn), 20)
            await sink.flushed()
            seen.append(bus.history(SESSION))  # read at once: nothing may still be in flight
        return seen

    after_a, after_b = run(bus, body, text_flush_after=NEVER)

    assert shape(after_a)[-1] == ("a", "task_notification", "")
    assert "".join(e.text for e in after_a if isinstance(e, TextDelta)) == "".join(
        f"a{i} " for i in range(20)
    )
    assert shape(after_b)[-1] == ("b", "task_notification", "")


def test_closing_the_writer_publishes_buffered_text(bus: EventBus):
    async def body(writer: EventWriter) -> None:
        writer.sink("a").emit(delta("left in the buffer"), 0)

    run(bus, body, text_flush_after=NEVER)

    assert shape(bus.history(SESSION)) == [("a", "text", "left in the buffer")]


def test_replayed_indexes_are_dropped_and_not_reported(bus: EventBus):
    reported: list[Event] = []

    async def attempt(writer: EventWriter) -> None:
        sink = writer.sink("a")
        sink.emit(delta("one"), 0)
        sink.emit(call("c1"), 1)
        sink.emit(delta("two"), 2)
        sink.emit(call("c2"), 3)
        await sink.flushed()

    async def resumed(writer: EventWriter) -> None:
        await attempt(writer)  # the same events again, as a resumed attempt emits them
        sink = writer.sink("a")
        sink.emit(note(), 4)
        await sink.flushed()

    run(bus, attempt, text_flush_after=NEVER, on_published=reported.append)
    run(bus, resumed, text_flush_after=NEVER, on_published=reported.append)

    events = bus.history(SESSION)
    assert shape(events) == [
        ("a", "text", "one"),
        ("a", "tool_call", "c1"),
        ("a", "text", "two"),
        ("a", "tool_call", "c2"),
        ("a", "task_notification", ""),
    ]
    assert [e.seq for e in reported] == [1, 2, 3, 4, 5]


def test_an_event_redis_refuses_surfaces_in_flushed_and_spends_the_sink(
    bus: EventBus, client: redis.Redis
):
    client.set(bus.keys("broken").stream, "not a stream")  # XADD on it fails: WRONGTYPE

    async def body(writer: EventWriter) -> None:
        broken, fine = writer.sink("a"), writer.sink("b")
        broken.emit(delta("lost", session_id="broken"), 0)
        broken.emit(
            TaskNotification(session_id="broken", spawn_id="a", status="ok"), 1
        )  # queued behind the failure: never published
        fine.emit(note("b"), 0)
        with pytest.raises(PublishFailed, match="spawn a from index 0"):
            await broken.flushed()
        await fine.flushed()  # the other spawn of the batch is published all the same
        with pytest.raises(PublishFailed):
            broken.emit(delta("more", session_id="broken"), 2)
        with pytest.raises(PublishFailed):
            await broken.flushed()

        client.delete(bus.keys("broken").stream)
        again = writer.sink("a")  # the next attempt starts clean and resumes at index 0
        assert again is not broken
        again.emit(delta("found", session_id="broken"), 0)
        await again.flushed()

    run(bus, body, text_flush_after=NEVER)

    assert shape(bus.history(SESSION)) == [("b", "task_notification", "")]
    assert shape(bus.history("broken")) == [("a", "text", "found")]


def test_a_lost_connection_surfaces_in_flushed(bus: EventBus):
    async def main() -> None:
        # A real connection refused: nothing listens on port 1.
        unreachable = redis.asyncio.Redis(host="127.0.0.1", port=1, retry=Retry(NoBackoff(), 0))
        writer = EventWriter(bus, unreachable, text_flush_after=NEVER)
        writer.start()
        sink = writer.sink("a")
        sink.emit(delta("hello"), 0)
        with pytest.raises(PublishFailed) as failed:
            await sink.flushed()
        assert isinstance(failed.value.__cause__, redis.ConnectionError)
        await writer.aclose()
        await unreachable.aclose()

    asyncio.run(main())

    assert bus.history(SESSION) == []


def test_apublish_many_numbers_in_order_like_publish(bus: EventBus):
    async def main() -> list[Published | Exception]:
        aclient = redis.asyncio.Redis.from_url(URL)
        try:
            items = [Outgoing(delta(str(i)), "spawn:a", i) for i in range(3)]
            first = await bus.apublish_many(items, client=aclient)
            again = await bus.apublish_many(items[1:], client=aclient)
            return [*first, *again]
        finally:
            await aclient.aclose()

    results = asyncio.run(main())

    assert [(r.seq, r.duplicate) for r in results if isinstance(r, Published)] == [
        (1, False),
        (2, False),
        (3, False),
        (2, True),
        (3, True),
    ]
    assert bus.publish(delta("sync"), dedup_key="spawn:a", dedup_index=2).duplicate
    assert bus.publish(delta("sync"), dedup_key="spawn:a", dedup_index=3).seq == 4


def test_by_default_text_leaves_at_the_next_round_and_merges_while_one_is_in_flight(
    bus: EventBus,
):
    """An idle writer publishes a delta at once; the deltas that arrive while a round is in
    flight leave together in the next one."""

    async def body(writer: EventWriter) -> list[Event]:
        sink = writer.sink("a")
        sink.emit(delta("first"), 0)
        await eventually(lambda: writer.batches == 1, "the first round to start")
        # That round is on its way to Redis: what comes now waits for the next one.
        for i, text in enumerate([" and", " the", " rest"], start=1):
            sink.emit(delta(text), i)
        await eventually(lambda: len(bus.history(SESSION)) == 2, "the second round")
        return bus.history(SESSION)

    events = run(bus, body)

    assert [e.text for e in events if isinstance(e, TextDelta)] == ["first", " and the rest"]


def test_events_of_an_attempt_whose_lease_another_holds_are_never_stored(
    bus: EventBus, client: redis.Redis
):
    lease = "ongrid:lease:a"
    client.set(lease, "first-attempt")

    async def body(writer: EventWriter) -> None:
        first = writer.sink("a", fence=(lease, "first-attempt"))
        first.emit(call("c1"), 0)
        await first.flushed()
        client.set(lease, "second-attempt")  # the spawn was taken over
        first.emit(call("c2"), 1)
        first.emit(note(), 2)
        with pytest.raises(PublishFailed, match="spawn a from index 1") as failure:
            await first.flushed()
        assert isinstance(failure.value.__cause__, LeaseLost)
        second = writer.sink("a", fence=(lease, "second-attempt"))
        assert second is not first
        second.emit(call("c2"), 1)  # the attempt that holds the spawn publishes it, once
        await second.flushed()

    run(bus, body, text_flush_after=NEVER)

    assert shape(bus.history(SESSION)) == [("a", "tool_call", "c1"), ("a", "tool_call", "c2")]


def test_a_fenced_publish_stores_and_announces_nothing(bus: EventBus, client: redis.Redis):
    client.set("ongrid:lease:a", "theirs")

    async def main() -> list[Any]:
        aclient = redis.asyncio.Redis.from_url(URL)
        try:
            fenced = Outgoing(note(), "spawn:a", 0, ("ongrid:lease:a", "ours"))
            held = Outgoing(note(), "spawn:a", 0, ("ongrid:lease:a", "theirs"))
            return await bus.apublish_many([fenced, held], client=aclient)
        finally:
            await aclient.aclose()

    first, second = asyncio.run(main())
    assert isinstance(first, Published) and first.fenced and not first.duplicate
    assert isinstance(second, Published) and not second.fenced and second.seq == 1
    assert len(bus.history(SESSION)) == 1
