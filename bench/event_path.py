"""The event path's two costs, measured on a real Redis: publishing streamed text, and waiting.

1. Publishing: ``--spawns`` spawns each stream ``--deltas`` short text deltas, interleaved as they
   would arrive, then a notification. Published one by one with the blocking
   ``EventBus.publish`` (one round trip each), through the ``EventWriter`` with coalescing
   switched off (batching alone), and through the writer as the engine uses it. Reports Redis
   round trips, events stored and CPU seconds of this process.
2. Waiting: the time from a spawn's final record write to ``SpawnClient.wait`` returning, for the
   record-polling wait this replaced and for the event-driven one (median and p90 of
   ``--waits``), beside the raw publish → subscriber latency of the same Redis.

    python -m bench.event_path [--redis redis://127.0.0.1:6379/5]

The database given is flushed before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
import redis.asyncio

from registry.settings import Settings
from workers.client import SpawnClient
from workers.events import EventBus
from workers.messages import TaskNotification, TextDelta
from workers.publisher import EventWriter
from workers.spawns import SpawnRecord

CHUNK = "tok "  # a streamed chunk is a token or two


def _events(spawns: int, deltas: int) -> list[tuple[str, int, TextDelta | TaskNotification]]:
    """(spawn, index, event) in arrival order: one delta of each spawn per round."""
    out: list[tuple[str, int, TextDelta | TaskNotification]] = []
    for i in range(deltas):
        for s in range(spawns):
            out.append((f"sp{s}", i, TextDelta(session_id=f"se{s}", spawn_id=f"sp{s}", text=CHUNK)))
    for s in range(spawns):
        note = TaskNotification(session_id=f"se{s}", spawn_id=f"sp{s}", status="ok")
        out.append((f"sp{s}", deltas, note))
    return out


def publish_sync(bus: EventBus, spawns: int, deltas: int) -> tuple[int, float]:
    events = _events(spawns, deltas)
    cpu = time.process_time()
    for spawn, index, event in events:
        bus.publish(event, dedup_key=f"spawn:{spawn}", dedup_index=index)
    return len(events), time.process_time() - cpu


def publish_writer(
    bus: EventBus, url: str, spawns: int, deltas: int, coalesce: bool
) -> tuple[int, float]:
    events = _events(spawns, deltas)

    async def main() -> tuple[int, float]:
        aclient = redis.asyncio.Redis.from_url(url)
        options = {} if coalesce else {"text_flush_chars": 1}
        writer = EventWriter(bus, aclient, **options)  # type: ignore[arg-type]
        writer.start()
        cpu = time.process_time()
        sinks = {f"sp{s}": writer.sink(f"sp{s}") for s in range(spawns)}
        for n, (spawn, index, event) in enumerate(events):
            sinks[spawn].emit(event, index)
            if n % spawns == spawns - 1:
                await asyncio.sleep(0)  # the next chunk of each stream arrives later
        await asyncio.gather(*(sink.flushed() for sink in sinks.values()))
        spent = time.process_time() - cpu
        await writer.aclose()
        await aclient.aclose()
        return writer.batches, spent

    return asyncio.run(main())


def stored(r: redis.Redis, spawns: int) -> int:
    lengths: list[Any] = [r.xlen(f"ongrid:events:se{s}") for s in range(spawns)]
    return sum(int(n) for n in lengths)


def poll_wait(client: SpawnClient, spawn_id: str) -> SpawnRecord:
    """The wait this replaced: read the record, sleep 50 ms growing to 500 ms, read again."""
    delay = 0.05
    while True:
        record = client.store.get(spawn_id)
        assert record is not None
        if record.finished or record.status == "waiting":
            return record
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)


def wait_latency(client: SpawnClient, wait: Callable[[str], SpawnRecord], runs: int) -> list[float]:
    """Seconds from the final record write to ``wait`` returning, once per run."""
    latencies = []
    for _ in range(runs):
        record = client.store.create(SpawnRecord(session_id="w", persona="p", prompt="p"))
        record.status = "running"
        client.store.save_unfenced(record)
        returned: list[float] = []

        def waiting(spawn_id: str = record.spawn_id, returned: list[float] = returned) -> None:
            wait(spawn_id)
            returned.append(time.perf_counter())

        waiter = threading.Thread(target=waiting)
        waiter.start()
        time.sleep(random.uniform(0.2, 1.2))  # the spawn runs a while: any phase of a poll
        note = TaskNotification(session_id="w", spawn_id=record.spawn_id, status="ok")
        client.bus.publish(note, dedup_key=f"spawn:{record.spawn_id}", dedup_index=0)
        time.sleep(0.001)  # the worker's final write follows its notification
        record.status = "ok"
        client.store.save_unfenced(record)
        written = time.perf_counter()
        waiter.join()
        latencies.append(returned[0] - written)
    return latencies


def pubsub_latency(r: redis.Redis, runs: int) -> list[float]:
    """Seconds from PUBLISH to a subscriber holding the message, once per run."""
    pubsub = r.pubsub()
    pubsub.subscribe("bench:ping")
    pubsub.get_message(timeout=5)
    out = []
    for _ in range(runs):
        sent = time.perf_counter()
        r.publish("bench:ping", "x")
        while pubsub.get_message(timeout=5) is None:
            pass
        out.append(time.perf_counter() - sent)
    pubsub.close()
    return out


def _ms(values: list[float]) -> str:
    values = sorted(values)
    p90 = values[int(len(values) * 0.9) - 1]
    return f"median {statistics.median(values) * 1000:7.2f} ms   p90 {p90 * 1000:7.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/5")
    parser.add_argument("--spawns", type=int, default=50)
    parser.add_argument("--deltas", type=int, default=1000)
    parser.add_argument("--waits", type=int, default=50)
    args = parser.parse_args()
    r = redis.Redis.from_url(args.redis)
    bus = EventBus(r)

    print(f"publishing {args.deltas} deltas + 1 notification for each of {args.spawns} spawns")
    rows = []
    r.flushdb()
    events, cpu = publish_sync(bus, args.spawns, args.deltas)
    rows.append(("one by one (EventBus.publish)", events, stored(r, args.spawns), cpu))
    for coalesce, name in ((False, "writer, batching only"), (True, "writer, coalesced")):
        r.flushdb()
        trips, cpu = publish_writer(bus, args.redis, args.spawns, args.deltas, coalesce)
        rows.append((name, trips, stored(r, args.spawns), cpu))
    print(f"{'':32}{'round trips':>12}{'events stored':>15}{'CPU s':>9}{'CPU/delta':>12}")
    total = args.spawns * (args.deltas + 1)
    for name, trips, kept, cpu in rows:
        print(f"{name:32}{trips:12d}{kept:15d}{cpu:9.2f}{cpu / total * 1e6:9.1f} µs")

    r.flushdb()
    with tempfile.TemporaryDirectory() as agents:
        client = SpawnClient(Settings(redis_url=args.redis, agents_dir=Path(agents)))
        print(f"\nfinal record write → wait() returns ({args.waits} runs each)")
        polled = wait_latency(client, lambda s: poll_wait(client, s), args.waits)
        print(f"  record polling       {_ms(polled)}")
        print(f"  event-driven wait()  {_ms(wait_latency(client, client.wait, args.waits))}")
        print(f"  raw pub/sub latency  {_ms(pubsub_latency(r, args.waits * 10))}")
    r.flushdb()


if __name__ == "__main__":
    main()
