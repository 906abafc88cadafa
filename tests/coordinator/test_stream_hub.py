"""The API's stream hub against a real Redis: many streams of many sessions on one pub/sub
connection, every event exactly once and in order across a killed connection and past a slow
reader, and ``PUBSUB NUMSUB`` of a channel 1 exactly while someone watches it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator
from uuid import uuid4

import pytest
import redis

from coordinator.api.stream_hub import POOL_SIZE, StreamHub, Subscription
from workers.events import EventBus
from workers.messages import Event, TaskNotification, TextDelta

#: Seconds of silence after which a reader gives up: only so that a broken hub fails the test
#: instead of hanging it.
STUCK = 30.0
#: Liveness bound of one wait of a test.
DEADLINE = 60.0
#: A recheck period no test lives to see: what arrives came by the hub's own signals.
RECHECK_OFF = 3600.0


@pytest.fixture
def admin(claimed_redis_url: str) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(claimed_redis_url) as client:
        yield client


@pytest.fixture
def prefix(admin: redis.Redis) -> Iterator[str]:
    p = f"test:{uuid4().hex}:"
    yield p
    keys = list(admin.scan_iter(match=f"{p}*"))
    if keys:
        admin.delete(*keys)


def finished(event: Event) -> bool:
    return event.type == "task_notification"


def publish_text(bus: EventBus, session_id: str, count: int) -> list[int]:
    return [bus.publish(TextDelta(session_id=session_id, text=str(i))).seq for i in range(count)]


def publish_end(bus: EventBus, session_id: str) -> int:
    return bus.publish(TaskNotification(session_id=session_id, status="ok")).seq


def numsub(admin: redis.Redis, channels: list[str]) -> list[int]:
    return [int(n) for _name, n in admin.pubsub_numsub(*channels)]


def hub_connections(admin: redis.Redis, name: str) -> int:
    return sum(1 for c in admin.client_list() if c["name"] == name)


def kill_hub_subscriber(admin: redis.Redis, name: str) -> int:
    """Close the server side of the hub's pub/sub connection; how many connections closed."""
    ids = [c["id"] for c in admin.client_list(_type="pubsub") if c["name"] == name]
    return sum(int(admin.client_kill_filter(_id=i)) for i in ids)


async def until_true(check: Callable[[], bool], what: str) -> None:
    """Poll ``check`` (a blocking call, run off the loop) until true, within DEADLINE."""
    async with asyncio.timeout(DEADLINE):
        while not await asyncio.to_thread(check):  # noqa: ASYNC110 - polls Redis itself
            await asyncio.sleep(0.02)
    assert await asyncio.to_thread(check), what


class Reader:
    """One stream through the hub: the seqs it got, and its subscription's gap count."""

    def __init__(
        self,
        hub: StreamHub,
        bus: EventBus,
        session_id: str,
        on_event: Callable[[int], Awaitable[None]] | None = None,
    ) -> None:
        self.seqs: list[int] = []
        self.live: Subscription = hub.subscribe(bus.keys(session_id).channel)
        self.task = asyncio.create_task(self._read(hub, bus, session_id, on_event))

    async def _read(
        self,
        hub: StreamHub,
        bus: EventBus,
        session_id: str,
        on_event: Callable[[int], Awaitable[None]] | None,
    ) -> list[int]:
        with self.live:
            events = bus.afollow(
                session_id, 0, live=self.live, client=hub.client, timeout=STUCK, until=finished
            )
            async for event in events:
                self.seqs.append(event.seq)
                if on_event is not None:
                    await on_event(event.seq)
        return self.seqs

    async def result(self) -> list[int]:
        return await asyncio.wait_for(self.task, DEADLINE)


def test_many_streams_of_many_sessions_share_one_subscription(
    claimed_redis_url: str, admin: redis.Redis, prefix: str
) -> None:
    """75 streams of 25 sessions, some events stored before they start and the rest published
    while they follow: each gets all, once, in order; each channel counts one subscriber while
    watched and none after; the hub holds at most its pool and one pub/sub connection."""
    name = f"test-hub-{uuid4().hex[:12]}"
    bus = EventBus(admin, prefix, recheck=RECHECK_OFF)
    sessions = [f"s{i}" for i in range(25)]
    channels = [bus.keys(s).channel for s in sessions]
    for session in sessions:
        publish_text(bus, session, 10)

    def publish_rest() -> None:
        for _ in range(40):
            for session in sessions:
                publish_text(bus, session, 1)
        for session in sessions:
            publish_end(bus, session)

    async def scenario() -> list[list[int]]:
        hub = StreamHub(claimed_redis_url, client_name=name)
        try:
            readers = [Reader(hub, bus, s) for s in sessions for _ in range(3)]
            await until_true(
                lambda: numsub(admin, channels) == [1] * len(channels), "one subscriber each"
            )
            assert hub.streams == 75 and hub.channels == 25
            await asyncio.to_thread(publish_rest)
            results = [await r.result() for r in readers]
            assert hub_connections(admin, name) <= POOL_SIZE + 1
            await until_true(lambda: numsub(admin, channels) == [0] * len(channels), "none")
            return results
        finally:
            await hub.aclose()

    results = asyncio.run(scenario())
    assert results == [list(range(1, 52))] * 75
    assert hub_connections(admin, name) == 0  # closed with the hub


def test_streams_get_everything_once_across_a_killed_pubsub_connection(
    claimed_redis_url: str, admin: redis.Redis, prefix: str
) -> None:
    """Three times the hub's pub/sub connection is closed by the server and 5 events are
    published before it can be made again, so they are surely lost on pub/sub; the last time,
    the session's final event is among them and nothing follows. With the recheck off, only
    the hub noticing the reconnect can bring them: each stream reads the stream key once the
    channel is subscribed again."""
    name = f"test-hub-{uuid4().hex[:12]}"
    bus = EventBus(admin, prefix, recheck=RECHECK_OFF)
    channel = bus.keys("s").channel
    kills: list[int] = []

    async def kill_and_publish(seq: int) -> None:
        if len(kills) < 3 and seq >= 100 * (len(kills) + 1) and kill_hub_subscriber(admin, name):
            kills.append(seq)
            publish_text(bus, "s", 5 if len(kills) < 3 else 4)
            if len(kills) == 3:
                publish_end(bus, "s")

    async def scenario() -> tuple[list[int], list[int], int]:
        hub = StreamHub(claimed_redis_url, client_name=name)
        try:
            bystander = hub.subscribe(channel)  # stays open: the channel's subscription too
            killer = Reader(hub, bus, "s", on_event=kill_and_publish)
            other = Reader(hub, bus, "s")
            await until_true(lambda: numsub(admin, [channel]) == [1], "the channel subscribed")
            while len(kills) < 3 and not killer.task.done():
                publish_text(bus, "s", 1)
                await asyncio.sleep(0.001)
            got, also = await killer.result(), await other.result()
            gaps = killer.live.gaps
            await until_true(lambda: numsub(admin, [channel]) == [1], "subscribed again")
            bystander.close()
            await until_true(lambda: numsub(admin, [channel]) == [0], "unsubscribed")
            return got, also, gaps
        finally:
            await hub.aclose()

    got, also, gaps = asyncio.run(scenario())
    last = bus.last_seq("s")
    assert len(kills) == 3
    assert got == also == list(range(1, last + 1))
    assert gaps >= 3  # each reconnect sent the stream to the stream key


def test_a_slow_stream_falls_back_to_the_stream_key_without_holding_up_the_others(
    claimed_redis_url: str, admin: redis.Redis, prefix: str
) -> None:
    """A stream that stops reading (its client is slow) while 200 events are published: its
    queue of 8 overflows and is dropped; the other stream of the session gets everything
    meanwhile, and the slow one, once it reads again, gets everything too, from the stream
    key."""
    bus = EventBus(admin, prefix, recheck=RECHECK_OFF)
    publish_text(bus, "s", 1)

    async def scenario() -> tuple[list[int], list[int], int]:
        hub = StreamHub(claimed_redis_url, queue_size=8)
        try:
            parked, go_on = asyncio.Event(), asyncio.Event()

            async def slow_client(seq: int) -> None:
                if seq == 1:
                    parked.set()
                    await go_on.wait()

            slow = Reader(hub, bus, "s", on_event=slow_client)
            fast = Reader(hub, bus, "s")
            await asyncio.wait_for(parked.wait(), DEADLINE)
            await until_true(lambda: fast.seqs == [1], "the fast stream at seq 1")
            published = threading.Thread(
                target=lambda: (publish_text(bus, "s", 200), publish_end(bus, "s"))
            )
            published.start()
            fast_seqs = await fast.result()  # while the slow one still reads nothing
            assert not slow.task.done()
            go_on.set()
            slow_seqs = await slow.result()
            published.join(DEADLINE)
            return fast_seqs, slow_seqs, slow.live.gaps
        finally:
            await hub.aclose()

    fast_seqs, slow_seqs, gaps = asyncio.run(scenario())
    assert fast_seqs == slow_seqs == list(range(1, 203))
    assert gaps >= 1
