"""The event bus against a real Redis (this test process's own, ``redis_server.py``): numbering,
history, dedup, retention and exactly-once, in-order delivery to late, concurrent, reconnecting
and asyncio subscribers."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from uuid import uuid4

import pytest
import redis
import redis.asyncio
import redis_server
from redis.backoff import NoBackoff
from redis.retry import Retry

from registry.errors import UserError
from workers.channels import database_of
from workers.events import EventBus, SessionKeys
from workers.messages import AgentTile, TaskNotification, TextDelta

HOST, PORT = "127.0.0.1", redis_server.port()
MODES = ["sync", "async"]
#: A recheck period no test lives to see: the subscriber's idle timeout (15 s) and the reader's
#: join (60 s) end it first, so whatever arrives came by reconnecting and gap filling alone.
RECHECK_OFF = 3600.0
#: How long a subscriber asked to stop may take before the test calls it stuck.
STUCK = 30.0


def finished_within(seconds: float, work: Callable[[], Any]) -> Any:
    """Run ``work`` in a thread; fail if it is still running after ``seconds`` (it is stuck)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(work).result(timeout=seconds)


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    with redis.Redis(host=HOST, port=PORT) as c:
        yield c


@pytest.fixture
def prefix(client: redis.Redis) -> Iterator[str]:
    p = f"test:{uuid4().hex}:"
    yield p
    keys = list(client.scan_iter(match=f"{p}*"))
    if keys:
        client.delete(*keys)


@pytest.fixture
def make_bus(client: redis.Redis, prefix: str) -> Callable[..., EventBus]:
    def make(**options: Any) -> EventBus:
        return EventBus(client, prefix, **{"recheck": 0.2, **options})

    return make


@pytest.fixture
def bus(make_bus: Callable[..., EventBus]) -> EventBus:
    return make_bus()


def text(session_id: str, body: str = "x", spawn_id: str = "") -> TextDelta:
    return TextDelta(session_id=session_id, spawn_id=spawn_id, text=body)


def publish_many(bus: EventBus, session_id: str, count: int, pause: float = 0.0) -> list[int]:
    seqs = []
    for i in range(count):
        seqs.append(bus.publish(text(session_id, str(i))).seq)
        if pause:
            time.sleep(pause)
    return seqs


def store_unannounced(bus: EventBus, client: redis.Redis, session_id: str) -> None:
    """Store the next event as :meth:`EventBus.publish` would, as if its PUBLISH were lost."""
    keys = bus.keys(session_id)
    seq = client.incr(keys.seq)
    event = text(session_id).model_copy(update={"seq": seq})
    client.xadd(keys.stream, {"event": event.model_dump_json()}, id=f"{seq}-0")


# --- subscribers in their own thread, blocking or asyncio -----------------------------------


class Faults:
    """Redis errors a test arms at points it chooses; each fires once, at the next call of its kind.

    ``kind`` is ``"xrange"`` (a stream read) or ``"read"`` (a pub/sub read, the SUBSCRIBE
    confirmation included). Arming and firing both happen in the subscriber's own thread (from its
    ``on_event`` callback and from its Redis calls), so which call fails does not depend on timing.
    ``fired`` records each fault's label with the last seq the subscriber had delivered when it
    fired; ``before`` runs just before the error is raised.
    """

    def __init__(self) -> None:
        self._armed: dict[str, deque[tuple[str, Callable[[], None] | None]]] = {
            "xrange": deque(),
            "read": deque(),
        }
        self.delivered = 0
        self.fired: list[tuple[int, str]] = []
        self.on_fire: Callable[[], None] = lambda: None

    def arm(self, kind: str, label: str, before: Callable[[], None] | None = None) -> None:
        self._armed[kind].append((label, before))

    def check(self, kind: str) -> None:
        if not self._armed[kind]:
            return
        label, before = self._armed[kind].popleft()
        self.fired.append((self.delivered, label))
        if before is not None:
            before()
        self.on_fire()
        raise redis.ConnectionError(f"injected: {label}")


class FaultyRedis(redis.Redis):
    """A client whose XRANGE and pub/sub reads fail when its :class:`Faults` say so."""

    def __init__(self, *args: Any, faults: Faults, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.faults = faults

    def xrange(self, *args: Any, **kwargs: Any) -> Any:
        self.faults.check("xrange")
        return super().xrange(*args, **kwargs)

    def pubsub(self, **kwargs: Any) -> Any:
        return _faulty_pubsub(super().pubsub(**kwargs), self.faults)


class AsyncFaultyRedis(redis.asyncio.Redis):
    """:class:`FaultyRedis` for asyncio."""

    def __init__(self, *args: Any, faults: Faults, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.faults = faults

    async def xrange(self, *args: Any, **kwargs: Any) -> Any:
        self.faults.check("xrange")
        return await super().xrange(*args, **kwargs)

    def pubsub(self, **kwargs: Any) -> Any:
        return _faulty_pubsub(super().pubsub(**kwargs), self.faults)


def _faulty_pubsub(pubsub: Any, faults: Faults) -> Any:
    get_message = pubsub.get_message

    def faulty_get_message(*args: Any, **kwargs: Any) -> Any:
        faults.check("read")  # raised before the call, also for the asyncio coroutine
        return get_message(*args, **kwargs)

    pubsub.get_message = faulty_get_message
    return pubsub


class Reader(threading.Thread):
    """Subscribes with its own clients until ``until``; records the seqs it got.

    A number for ``until`` means "until that seq". ``on_event`` runs in the reader's thread after
    each event, between two reads from Redis.
    """

    def __init__(
        self,
        prefix: str,
        session_id: str,
        until: int | Callable[[Any], bool],
        *,
        mode: str = "sync",
        after_seq: int = 0,
        name: str | None = None,
        faults: Faults | None = None,
        recheck: float = 0.2,
        on_event: Callable[[int], None] | None = None,
    ) -> None:
        super().__init__(daemon=True)
        self.prefix, self.session_id, self.after_seq = prefix, session_id, after_seq
        self.until = until if callable(until) else (lambda event: event.seq >= until)
        self.mode, self.faults, self.recheck, self.on_event = mode, faults, recheck, on_event
        self.options: dict[str, Any] = {"host": HOST, "port": PORT, "client_name": name}
        self.seqs: list[int] = []
        self.error: BaseException | None = None

    def _record(self, seq: int) -> None:
        self.seqs.append(seq)
        if self.faults is not None:
            self.faults.delivered = seq
        if self.on_event is not None:
            self.on_event(seq)

    def run(self) -> None:
        try:
            if self.mode == "sync":
                self._run_blocking()
            else:
                asyncio.run(self._run_async())
        except BaseException as exc:  # handed to the test by result()
            self.error = exc

    def _run_blocking(self) -> None:
        faulty = {"faults": self.faults} if self.faults is not None else {}
        with (FaultyRedis if faulty else redis.Redis)(**self.options, **faulty) as client:
            bus = EventBus(client, self.prefix, recheck=self.recheck)
            events = bus.subscribe(self.session_id, self.after_seq, timeout=15, until=self.until)
            for event in events:
                self._record(event.seq)

    async def _run_async(self) -> None:
        faulty = {"faults": self.faults} if self.faults is not None else {}
        async with (AsyncFaultyRedis if faulty else redis.asyncio.Redis)(
            **self.options, **faulty
        ) as aclient:
            with redis.Redis(host=HOST, port=PORT) as client:
                bus = EventBus(client, self.prefix, async_client=aclient, recheck=self.recheck)
                events = bus.asubscribe(
                    self.session_id, self.after_seq, timeout=15, until=self.until
                )
                async for event in events:
                    self._record(event.seq)

    def result(self) -> list[int]:
        self.join(60)
        assert not self.is_alive(), "subscriber did not finish"
        if self.error is not None:
            raise self.error
        return self.seqs


# --- publishing and reading -----------------------------------------------------------------


def test_key_layout(bus: EventBus, prefix: str) -> None:
    assert bus.keys("s1") == SessionKeys(
        stream=f"{prefix}events:s1",
        seq=f"{prefix}seq:s1",
        dedup=f"{prefix}dedup:s1",
        channel=f"{prefix}db{database_of(bus._client)}:live:s1",
    )


def test_seq_counts_per_session_from_one(bus: EventBus) -> None:
    seqs = {"a": [], "b": []}
    for session in ["a", "b", "a", "a", "b"]:
        seqs[session].append(bus.publish(text(session)).seq)
    assert seqs == {"a": [1, 2, 3], "b": [1, 2]}
    assert (bus.last_seq("a"), bus.last_seq("b"), bus.last_seq("nobody")) == (3, 2, 0)


def test_published_event_is_the_stored_one(bus: EventBus, client: redis.Redis) -> None:
    """The script splices in ``seq`` without reparsing: floats, unicode and nested keys survive."""
    tile = AgentTile(
        session_id="s-é",
        spawn_id="sp",
        ts=1712345678.1234567,
        persona="incident_investigator",
        description='Checks "why" — ünïcødé 🙂 \u2028 and back\\slashes',
        tools=[{"seq": 99, "tiny": 1.5e-7, "big": 12345678901234567890, "name": "é"}],
    )
    published = bus.publish(tile)
    assert published.seq == 1 and not published.duplicate
    (stored,) = bus.history("s-é")
    assert stored == published.event
    assert stored.ts == 1712345678.1234567
    assert stored.tools[0]["seq"] == 99
    ((_id, fields),) = client.xrange(bus.keys("s-é").stream)
    assert _id == b"1-0"
    assert fields[b"event"].startswith(b'{"seq":1,"session_id":"s-\xc3\xa9"')


def test_history_after_a_seq(bus: EventBus) -> None:
    publish_many(bus, "s", 5)
    assert [e.seq for e in bus.history("s")] == [1, 2, 3, 4, 5]
    assert [e.seq for e in bus.history("s", after_seq=2)] == [3, 4, 5]
    assert [e.seq for e in bus.history("s", after_seq=1, limit=2)] == [2, 3]
    assert bus.history("s", after_seq=5) == []
    assert [e.text for e in bus.history("s")] == ["0", "1", "2", "3", "4"]


def test_a_client_that_decodes_responses_works_too(prefix: str) -> None:
    with redis.Redis(host=HOST, port=PORT, decode_responses=True) as decoding:
        bus = EventBus(decoding, prefix)
        publish_many(bus, "s", 3)
        assert [e.seq for e in bus.history("s")] == [1, 2, 3]
        assert [e.seq for e in bus.subscribe("s", until=lambda e: e.seq == 3)] == [1, 2, 3]
        assert bus.last_seq("s") == 3


def test_lost_counter_continues_after_the_stream(bus: EventBus, client: redis.Redis) -> None:
    publish_many(bus, "s", 3)
    client.delete(bus.keys("s").seq)
    assert bus.publish(text("s")).seq == 4
    assert bus.last_seq("s") == 4
    assert [e.seq for e in bus.history("s")] == [1, 2, 3, 4]


# --- dedup for resumed spawns ---------------------------------------------------------------


def test_republished_events_of_a_resumed_spawn_are_dropped(
    bus: EventBus, client: redis.Redis
) -> None:
    first = [bus.publish(text("s", str(i)), dedup_key="spawn:a", dedup_index=i) for i in range(10)]
    assert [p.seq for p in first] == list(range(1, 11))
    assert not any(p.duplicate for p in first)

    with client.pubsub() as pubsub:
        pubsub.subscribe(bus.keys("s").channel)
        assert pubsub.get_message(timeout=2)["type"] == "subscribe"
        again = [bus.publish(text("s", "re"), dedup_key="spawn:a", dedup_index=i) for i in range(5)]
        assert [(p.seq, p.duplicate) for p in again] == [(i, True) for i in range(1, 6)]
        assert pubsub.get_message(timeout=0.3) is None  # nothing announced
        assert bus.last_seq("s") == 10
        assert len(bus.history("s")) == 10

        fresh = bus.publish(text("s", "new"), dedup_key="spawn:a", dedup_index=10)
        assert (fresh.seq, fresh.duplicate) == (11, False)
        assert pubsub.get_message(timeout=2)["type"] == "message"

    # Another key is independent; a key that looks like "<key>:<index>" does not collide.
    assert bus.publish(text("s"), dedup_key="spawn:b", dedup_index=0).seq == 12
    assert bus.publish(text("s"), dedup_key="spawn:a:1", dedup_index=0).seq == 13
    assert bus.publish(text("s"), dedup_key="spawn:a", dedup_index=1).duplicate


def test_dedup_needs_key_and_index_together(bus: EventBus) -> None:
    with pytest.raises(ValueError, match="together"):
        bus.publish(text("s"), dedup_key="spawn:a")
    with pytest.raises(ValueError, match="together"):
        bus.publish(text("s"), dedup_index=0)


# --- retention ------------------------------------------------------------------------------


def test_maxlen_trims_the_oldest_events(
    make_bus: Callable[..., EventBus], client: redis.Redis, prefix: str
) -> None:
    bus = make_bus(maxlen=10)
    publish_many(bus, "s", 300)
    node = int(client.config_get("stream-node-max-entries")["stream-node-max-entries"])
    length = client.xlen(bus.keys("s").stream)
    assert 10 <= length <= 10 + node < 300
    kept = [e.seq for e in bus.history("s")]
    assert kept == list(range(301 - length, 301))
    # A subscriber from the start gets what is retained, in order, once.
    reader = Reader(prefix, "s", 300)
    reader.start()
    assert reader.result() == kept


def test_ttl_is_set_and_refreshed(make_bus: Callable[..., EventBus], client: redis.Redis) -> None:
    bus = make_bus(ttl=120)
    bus.publish(text("s"), dedup_key="spawn:a", dedup_index=0)
    session = bus.keys("s")
    keys = [session.stream, session.seq, session.dedup]
    assert all(0 < client.ttl(key) <= 120 for key in keys)
    for key in keys:
        client.expire(key, 5)
    bus.publish(text("s"), dedup_key="spawn:a", dedup_index=1)
    assert all(100 < client.ttl(key) <= 120 for key in keys)


def test_bad_retention_settings_are_refused(client: redis.Redis) -> None:
    with pytest.raises(UserError, match="maxlen"):
        EventBus(client, maxlen=0)
    with pytest.raises(UserError, match="ttl"):
        EventBus(client, ttl=0)


# --- subscribing ----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_late_subscriber_gets_everything_once(bus: EventBus, prefix: str, mode: str) -> None:
    publish_many(bus, "s", 20)
    publish_many(bus, "other", 5)
    reader = Reader(prefix, "s", 20, mode=mode)
    reader.start()
    assert reader.result() == list(range(1, 21))


@pytest.mark.parametrize("mode", MODES)
def test_mid_stream_subscriber_while_two_threads_publish(
    bus: EventBus, prefix: str, mode: str
) -> None:
    publish_many(bus, "s", 100)
    reader = Reader(prefix, "s", 1100, mode=mode, after_seq=50)
    reader.start()
    with ThreadPoolExecutor(2) as pool:
        published = list(pool.map(lambda _: publish_many(bus, "s", 500), range(2)))
    assert sorted(published[0] + published[1]) == list(range(101, 1101))
    assert reader.result() == list(range(51, 1101))


def test_subscriber_ends_after_until(bus: EventBus) -> None:
    bus.publish(text("s", spawn_id="a"))
    bus.publish(text("s", spawn_id="b"))
    bus.publish(TaskNotification(session_id="s", spawn_id="b", status="ok"))
    bus.publish(TaskNotification(session_id="s", spawn_id="a", status="ok"))
    bus.publish(text("s", spawn_id="c"))

    def a_finished(event: Any) -> bool:
        return bool(event.type == "task_notification" and event.spawn_id == "a")

    got = list(bus.subscribe("s", until=a_finished, timeout=5))
    assert [e.seq for e in got] == [1, 2, 3, 4]


def test_subscriber_ends_on_idle_timeout_and_on_stop(bus: EventBus) -> None:
    publish_many(bus, "s", 2)
    started = time.monotonic()
    got = finished_within(STUCK, lambda: [e.seq for e in bus.subscribe("s", timeout=0.3)])
    assert got == [1, 2]
    assert time.monotonic() - started >= 0.3  # not before the idle timeout

    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    got = finished_within(
        STUCK, lambda: [e.seq for e in bus.subscribe("s", after_seq=1, stop=stop)]
    )
    assert got == [2] and stop.is_set()


def test_async_subscriber_ends_on_stop(make_bus: Callable[..., EventBus]) -> None:
    async def main() -> list[int]:
        async with redis.asyncio.Redis(host=HOST, port=PORT) as aclient:
            bus = make_bus(async_client=aclient)
            bus.publish(text("s"))
            stop = asyncio.Event()
            asyncio.get_running_loop().call_later(0.3, stop.set)
            return [e.seq async for e in bus.asubscribe("s", stop=stop)]

    assert finished_within(STUCK, lambda: asyncio.run(main())) == [1]


def test_async_subscriber_needs_an_async_client(bus: EventBus) -> None:
    with pytest.raises(UserError, match="async_client"):
        bus.asubscribe("s")


@pytest.mark.parametrize("mode", MODES)
def test_event_whose_announcement_was_lost_still_arrives(
    bus: EventBus, client: redis.Redis, prefix: str, mode: str
) -> None:
    """An event stored but never announced (its PUBLISH lost) is found on a quiet channel."""
    bus.publish(text("s"))
    following = threading.Event()
    reader = Reader(prefix, "s", 2, mode=mode, on_event=lambda seq: following.set())
    reader.start()
    assert following.wait(30)  # it delivered 1: from now on it follows the channel
    store_unannounced(bus, client, "s")
    assert reader.result() == [1, 2]


# --- connections that break -----------------------------------------------------------------


def kill_subscriber(admin: redis.Redis, name: str) -> int:
    """Close the server side of every pub/sub connection named ``name``; how many were closed."""
    ids = [c["id"] for c in admin.client_list(_type="pubsub") if c["name"] == name]
    return sum(int(admin.client_kill_filter(_id=i)) for i in ids)


@pytest.mark.parametrize("mode", MODES)
def test_live_events_arrive_and_a_gap_is_filled_from_the_stream(
    bus: EventBus, client: redis.Redis, prefix: str, mode: str
) -> None:
    """With the recheck off (RECHECK_OFF): 2 arrives live; live 4 right after 2 sends the
    subscriber to the stream for 3, whose announcement was lost."""
    bus.publish(text("s"))
    seen: defaultdict[int, threading.Event] = defaultdict(threading.Event)
    reader = Reader(
        prefix, "s", 4, mode=mode, recheck=RECHECK_OFF, on_event=lambda seq: seen[seq].set()
    )
    reader.start()
    assert seen[1].wait(10)
    bus.publish(text("s"))
    assert seen[2].wait(5)
    store_unannounced(bus, client, "s")
    bus.publish(text("s"))
    assert reader.result() == [1, 2, 3, 4]


@pytest.mark.parametrize("mode", MODES)
def test_subscriber_survives_its_connection_being_killed(
    bus: EventBus, client: redis.Redis, prefix: str, mode: str
) -> None:
    """Three times the reader kills its own pub/sub connection and publishes 5 events before it
    reads again, so those are surely lost on pub/sub; the stream must make up for them. The
    recheck is off (RECHECK_OFF): only reconnecting and gap filling can recover."""
    name = f"test-events-{uuid4().hex[:12]}"
    kills: list[int] = []  # the seq after which each kill happened
    recovered = threading.Event()

    def kill_and_publish(seq: int) -> None:
        # Between reads the reader may hold no subscription (it is catching up): try again later.
        if len(kills) < 3 and seq >= 150 * (len(kills) + 1) and kill_subscriber(client, name):
            kills.append(seq)
            publish_many(bus, "s", 5)
        elif len(kills) == 3 and seq > kills[-1] + 50:
            recovered.set()

    def finished(event: Any) -> bool:
        return bool(event.type == "task_notification")

    reader = Reader(
        prefix, "s", finished, mode=mode, name=name, recheck=RECHECK_OFF, on_event=kill_and_publish
    )
    reader.start()
    deadline = time.monotonic() + 30
    while not recovered.is_set() and reader.is_alive() and time.monotonic() < deadline:
        publish_many(bus, "s", 1, pause=0.001)
    last = bus.publish(TaskNotification(session_id="s", status="ok")).seq
    assert reader.result() == list(range(1, last + 1))
    assert len(kills) == 3


@pytest.mark.parametrize("mode", MODES)
def test_event_lost_while_reconnecting_arrives_at_once(
    bus: EventBus, client: redis.Redis, prefix: str, mode: str
) -> None:
    """The last event is published while the subscriber's connection is dead: noticing the
    reconnect (redis-py re-subscribes silently) must fetch it, without waiting for a recheck."""
    name = f"test-events-{uuid4().hex[:12]}"
    bus.publish(text("s"))
    kills: list[int] = []

    def kill_then_publish(seq: int) -> None:
        if seq == 1:
            kills.append(kill_subscriber(client, name))
            bus.publish(text("s"))

    reader = Reader(
        prefix, "s", 2, mode=mode, name=name, recheck=RECHECK_OFF, on_event=kill_then_publish
    )
    reader.start()
    assert reader.result() == [1, 2]
    assert kills == [1]


@pytest.mark.parametrize("mode", MODES)
def test_subscriber_resumes_after_redis_errors(bus: EventBus, prefix: str, mode: str) -> None:
    """600 events arrive exactly once, in order, across Redis errors injected at chosen points:
    the first catch-up, live reads, a recheck of a quiet channel, the catch-up and the SUBSCRIBE
    of a reconnect, and a live read while events are published. The publisher holds still after
    each planned seq until its faults have fired, so every fault fires exactly where planned."""
    faults = Faults()

    def publish_five() -> None:
        publish_many(bus, "s", 5)

    # seq delivered → faults armed right after it (kind, label, what runs as it fires).
    plan: dict[int, list[tuple[str, str, Callable[[], None] | None]]] = {
        0: [("xrange", "first catch-up", None)],
        100: [("read", "live read", None)],
        200: [("xrange", "recheck of a quiet channel", None)],
        300: [("read", "live read", None), ("xrange", "catch-up after reconnecting", None)],
        400: [("read", "live read, 5 events published meanwhile", publish_five)],
        500: [("read", "live read", None), ("read", "SUBSCRIBE after reconnecting", None)],
    }
    all_fired = {seq: threading.Event() for seq in plan}
    fired_per_seq: defaultdict[int, int] = defaultdict(int)

    def count_fired() -> None:
        seq = faults.delivered
        fired_per_seq[seq] += 1
        if fired_per_seq[seq] == len(plan[seq]):
            all_fired[seq].set()

    def arm(seq: int) -> None:
        for kind, label, before in plan.get(seq, []):
            faults.arm(kind, label, before)

    faults.on_fire = count_fired
    arm(0)
    reader = Reader(prefix, "s", 600, mode=mode, faults=faults, on_event=arm)
    reader.start()
    seq = 0
    while seq < 600:
        if seq in plan:
            assert all_fired[seq].wait(30), f"faults planned after seq {seq} did not all fire"
            seq = bus.last_seq("s")  # a fault may have published events of its own
            if seq >= 600:
                break
        seq = bus.publish(text("s")).seq
    assert reader.result() == list(range(1, 601))
    assert faults.fired == [(seq, label) for seq, steps in plan.items() for _, label, _ in steps]


def test_subscriber_gives_up_when_redis_stays_down() -> None:
    no_retry = Retry(NoBackoff(), 0)
    with redis.Redis(host=HOST, port=1, retry=no_retry) as down:
        bus = EventBus(down, retry_for=0.3)
        with pytest.raises(redis.ConnectionError):
            list(bus.subscribe("s", timeout=10))

    async def main() -> None:
        async with redis.asyncio.Redis(host=HOST, port=1, retry=no_retry) as adown:
            with redis.Redis(host=HOST, port=1) as down:
                abus = EventBus(down, async_client=adown, retry_for=0.3)
                with pytest.raises(redis.ConnectionError):
                    [e async for e in abus.asubscribe("s", timeout=10)]

    asyncio.run(main())
