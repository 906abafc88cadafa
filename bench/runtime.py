"""Benchmarks of the distributed runtime: spawn overhead, spawns in flight, event latency.

    .venv/bin/python bench/runtime.py [--quick] [--stock-fake] [--redis-url URL]

Needs a Redis server; the database named by ``--redis-url`` (default db 12 on 127.0.0.1:6379) is
flushed before and after. Starts the scripted OpenAI-protocol server
(``workers.testing.fake_openai``, through ``bench/_fake.py`` for TCP_NODELAY unless
``--stock-fake``), Celery workers (``python -m coordinator worker``, threads pool) whose working
directory holds five bench personas on ``openai/gpt-4o-mini``, and, for the load test, a counting
TCP proxy (``bench/_proxy.py``) between the workers and the fake. Everything is stopped at the
end, also on error, Ctrl-C or SIGTERM. Before each measurement it waits up to 5 s for the machine
to be quiet and prints a NOTE when it was not: on a shared machine, read those figures as such.

1. Spawn overhead: a spawn whose model answers at once, enqueue → finished record, against a
   bare Celery round trip of ``ongrid.ping`` on the same worker; where the spawn's time goes.
2. In flight: N spawns submitted at once to one ``-c 256`` worker, the model taking 1 s per turn
   (1 turn, then 2 turns with a ``get_edge_summary`` call); peak spawns running and peak model
   requests open, wall time, throughput against concurrency ÷ latency, CPU per model turn; then
   a hold run (1 turn of 12 s, so starting the spawns is not the limit): how many one worker
   holds at once. Then the 1 s runs on two ``-c 128`` workers.
3. Event latency: raw Redis pub/sub against ``EventBus.publish`` → ``EventBus.subscribe``, and
   worker → subscriber for a real spawn's text deltas.

Every ratio printed is between figures measured in this one run. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import _harness as h
import httpx
import psutil
import redis
from _common import FULL, QUICK, SLOW_DELAY, Bench, Sizes, Summary, line, ms, pct, quiet
from _load import bench_load

from registry.settings import Settings
from workers.celery_app import PING_TASK, make_celery
from workers.client import SpawnClient
from workers.events import EventBus
from workers.messages import Message, TextDelta
from workers.model import ModelRequest, ToolSpec

# --- 3a/3b: event latency in one process ---------------------------------------------------------


def _paced(n: int, rate: float, send: Callable[[int], None]) -> None:
    """Call ``send(i)`` for i in 0..n-1 at ``rate`` per second (absolute schedule, no drift)."""
    interval = 1.0 / rate
    due = time.perf_counter()
    for i in range(n):
        due += interval
        send(i)
        wait = due - time.perf_counter()
        if wait > 0:
            time.sleep(wait)


def raw_pubsub_latency(r: redis.Redis, n: int, rate: float, warm: int) -> tuple[list, list]:
    """PUBLISH → a subscriber thread's ``get_message``; the payload is an event's JSON."""
    channel = f"bench:raw:{uuid.uuid4().hex}"
    body = TextDelta(session_id=uuid.uuid4().hex, spawn_id=uuid.uuid4().hex, text="word ")
    body_json = body.model_dump_json()
    total = warm + n
    sent, received = [0.0] * total, [0.0] * total
    sub = r.pubsub()
    sub.subscribe(channel)
    while (m := sub.get_message(timeout=5)) is None or m["type"] != "subscribe":
        pass

    def listen() -> None:
        got = 0
        while got < total:
            m = sub.get_message(timeout=5)
            if m is None:
                return
            if m["type"] == "message":
                now = time.perf_counter()
                received[json.loads(m["data"])["i"]] = now
                got += 1

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    publish_cost: list[float] = []

    def send(i: int) -> None:
        t = time.perf_counter()
        sent[i] = t
        r.publish(channel, f'{{"i":{i},{body_json[1:]}')
        publish_cost.append(time.perf_counter() - t)

    _paced(total, rate, send)
    thread.join(timeout=10)
    sub.close()
    lat = [received[i] - sent[i] for i in range(warm, total) if received[i]]
    return lat, publish_cost[warm:]


def bus_latency(bus: EventBus, n: int, rate: float, warm: int) -> tuple[list, list]:
    """``EventBus.publish`` (Lua: seq, stream, pub/sub) → ``EventBus.subscribe`` in a thread."""
    sid, spawn_id = uuid.uuid4().hex, uuid.uuid4().hex
    total = warm + n
    sent: dict[int, float] = {}
    received: dict[int, float] = {}
    first = threading.Event()

    def listen() -> None:
        for event in bus.subscribe(sid, timeout=10, until=lambda e: e.seq >= total):
            received[event.seq] = time.perf_counter()
            first.set()

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    publish_cost: list[float] = []

    def send(i: int) -> None:
        t = time.perf_counter()
        published = bus.publish(TextDelta(session_id=sid, spawn_id=spawn_id, text="word "))
        sent[published.seq] = t
        publish_cost.append(time.perf_counter() - t)
        if i == 0:
            first.wait(10)  # the subscriber is live before anything is measured

    _paced(total, rate, send)
    thread.join(timeout=15)
    lat = [received[s] - sent[s] for s in sorted(sent) if s > warm and s in received]
    return lat, publish_cost[warm:]


def bench_event_latency(b: Bench, sizes: Sizes) -> None:
    print(
        f"\n== 3. event latency, in one process ({sizes.events} messages at "
        f"{sizes.event_rate:.0f}/s, subscriber in a thread) =="
    )
    warm = 50
    quiet()
    raw, raw_pub = raw_pubsub_latency(b.r, sizes.events, sizes.event_rate, warm)
    bus, bus_pub = bus_latency(b.bus, sizes.events, sizes.event_rate, warm)
    line("(a) raw PUBLISH → get_message", raw)
    line("(b) EventBus.publish → subscribe", bus)
    line("    publisher's call: PUBLISH", raw_pub)
    line("    publisher's call: EventBus.publish (Lua)", bus_pub)
    s = b.summary
    s.latency("3a raw pub/sub publish → receive", raw)
    s.latency("3b EventBus.publish → subscribe", bus)
    s.latency("3b' publisher's call: raw PUBLISH", raw_pub)
    s.latency("3b' publisher's call: EventBus.publish", bus_pub)
    s.ratio(
        f"EventBus ÷ raw pub/sub latency: median {pct(bus, 50) / pct(raw, 50):.2f}x, "
        f"p95 {pct(bus, 95) / pct(raw, 95):.2f}x, p99 {pct(bus, 99) / pct(raw, 99):.2f}x"
    )
    if len(raw) < sizes.events or len(bus) < sizes.events:
        print(f"  note: received {len(raw)} raw / {len(bus)} bus of {sizes.events}")


# --- 1. spawn overhead -------------------------------------------------------------------------


def ping_round_trip(b: Bench) -> float:
    t = time.perf_counter()
    b.app.send_task(PING_TASK).get(timeout=30)
    return time.perf_counter() - t


@dataclass
class SpawnTiming:
    total: float  # client.spawn() called → finished record readable
    submit: float  # client.spawn() returned
    marks: dict[str, float]  # event type → its first ts, relative to the call (wall clock)


def _subscribed(r: redis.Redis, channel: str):
    sub = r.pubsub()
    sub.subscribe(channel)
    while (m := sub.get_message(timeout=5)) is None or m["type"] != "subscribe":
        pass
    return sub


def spawn_round_trip(b: Bench, persona: str = "bench_fast") -> SpawnTiming:
    """client.spawn → the task_notification on the session's channel → the finished record.

    The caller listens on the session's pub/sub channel before spawning, so "done" is seen when
    it happens rather than at the next poll; the notification is published just before the
    final record save, so the record is then read until it says finished.
    """
    sid = uuid.uuid4().hex
    sub = _subscribed(b.r, b.bus.keys(sid).channel)
    try:
        wall0, t0 = time.time(), time.perf_counter()
        record = b.client.spawn(persona, "Is this host healthy?", session_id=sid)
        submit = time.perf_counter() - t0
        while True:
            m = sub.get_message(timeout=30)
            if m is None:
                raise TimeoutError(f"spawn {record.spawn_id}: no task_notification in 30 s")
            if m["type"] == "message" and b'"type":"task_notification"' in m["data"]:
                break
        while not (done := b.client.store.get(record.spawn_id)) or not done.finished:
            time.sleep(0.0002)
        total = time.perf_counter() - t0
    finally:
        sub.close()
    if done.status != "ok":
        raise RuntimeError(f"bench spawn failed: {done.error}")
    marks: dict[str, float] = {}
    for event in b.bus.history(sid):
        marks.setdefault(event.type, event.ts - wall0)
    return SpawnTiming(total, submit, marks)


def spawn_with_wait(b: Bench) -> float:
    """The public API as it is: SpawnClient.spawn then SpawnClient.wait (a backing-off poll)."""
    t = time.perf_counter()
    record = b.client.spawn("bench_fast", "Is this host healthy?")
    b.client.wait(record.spawn_id, timeout=30)
    return time.perf_counter() - t


def _captured_request(b: Bench, marker: str) -> dict[str, Any]:
    """The last chat request the fake received from a spawn of the persona with ``marker``."""
    bodies = httpx.get(b.fake_url.rsplit("/v1", 1)[0] + "/_requests", timeout=30).json()
    for body in reversed(bodies):
        if marker in body["messages"][0]["content"]:
            return body
    raise RuntimeError(f"no request with {marker} captured")


def litellm_in_process(b: Bench, body: dict[str, Any], n: int) -> tuple[list, list, list, list]:
    """The worker's model call, alone: LitellmModel.stream on the request a spawn made; and the
    same request as a plain httpx stream (no litellm). Wall and this thread's CPU, each."""
    os.environ["OPENAI_API_BASE"] = b.fake_url
    os.environ["OPENAI_API_KEY"] = "sk-test"
    from workers._litellm import LitellmModel

    model = LitellmModel()
    request = ModelRequest(
        model=h.MODEL,
        messages=[Message.model_validate(m) for m in body["messages"]],
        tools=[ToolSpec(**t["function"]) for t in body.get("tools") or []],
    )

    async def call() -> None:
        async for _ in model.stream(request):
            pass

    loop = asyncio.new_event_loop()
    lit_wall, lit_cpu, raw_wall, raw_cpu = [], [], [], []
    with httpx.Client(base_url=b.fake_url, timeout=30) as http:
        for i in range(n + 3):
            w, c = time.perf_counter(), time.thread_time()
            loop.run_until_complete(call())
            w2, c2 = time.perf_counter(), time.thread_time()
            with http.stream("POST", "/chat/completions", json=body) as resp:
                for _ in resp.iter_lines():
                    pass
            w3, c3 = time.perf_counter(), time.thread_time()
            if i >= 3:
                lit_wall.append(w2 - w)
                lit_cpu.append(c2 - c)
                raw_wall.append(w3 - w2)
                raw_cpu.append(c3 - c2)
    loop.close()
    return lit_wall, lit_cpu, raw_wall, raw_cpu


def idle_cpu_rate(worker: h.Worker, seconds: float = 2.0) -> float:
    """CPU seconds per second the worker burns with nothing to do (heartbeat, reaper, Celery)."""
    before = worker.cpu_seconds()
    time.sleep(seconds)
    return (worker.cpu_seconds() - before) / seconds


def worker_cpu_per_call(worker: h.Worker, call: Callable[[], object], n: int, idle: float) -> float:
    """Worker CPU seconds per ``call()``, run ``n`` times in a row, idle burn subtracted."""
    before, t = worker.cpu_seconds(), time.perf_counter()
    for _ in range(n):
        call()
    wall = time.perf_counter() - t
    return (worker.cpu_seconds() - before - idle * wall) / n


def bench_spawn_overhead(b: Bench, sizes: Sizes, worker: h.Worker) -> None:
    n = sizes.overhead
    print(
        f"\n== 1. spawn overhead: one worker (-c 256), fake model delay 0, {n} sequential "
        "round trips of each kind, interleaved (ping, spawn, spawn + wait()), after warm-up =="
    )
    for _ in range(5):
        ping_round_trip(b)
        spawn_round_trip(b)
    quiet()
    pings, spawns, waits = [], [], []
    for _ in range(n):
        pings.append(ping_round_trip(b))
        spawns.append(spawn_round_trip(b))
        waits.append(spawn_with_wait(b))
    spawn_totals = [s.total for s in spawns]
    line("ping: send_task('ongrid.ping').get()", pings)
    line("spawn: client.spawn → finished record", spawn_totals)
    line("spawn: client.spawn + client.wait()", waits)
    _spawn_split(b, spawns, n)
    idle = idle_cpu_rate(worker)
    cpu_ping = worker_cpu_per_call(worker, lambda: ping_round_trip(b), n, idle)
    cpu_spawn = worker_cpu_per_call(worker, lambda: spawn_round_trip(b), n, idle)
    b.cpu_per_fast_spawn = cpu_spawn
    s = b.summary
    s.figure(
        f"1 worker CPU (psutil, {n} in a row each, idle burn of {idle * 1000:.1f} ms/s "
        f"subtracted): {cpu_ping * 1000:.2f} ms per ping, {cpu_spawn * 1000:.2f} ms per spawn"
    )
    s.latency("1 ping round trip (send_task().get())", pings)
    s.latency("1 spawn round trip (event-driven, model answers at once)", spawn_totals)
    s.latency("1 spawn round trip via SpawnClient.wait()", waits)
    s.ratio(
        f"spawn ÷ ping round trip: median {pct(spawn_totals, 50) / pct(pings, 50):.2f}x, "
        f"p95 {pct(spawn_totals, 95) / pct(pings, 95):.2f}x"
    )
    s.ratio(
        f"SpawnClient.wait() ÷ event-driven spawn round trip: median "
        f"{pct(waits, 50) / pct(spawn_totals, 50):.2f}x"
    )
    s.ratio(f"worker CPU per spawn ÷ per ping: {cpu_spawn / cpu_ping:.1f}x")


def _spawn_split(b: Bench, spawns: list[SpawnTiming], n: int) -> None:
    def phase(start: str | None, end: str | None) -> list[float]:
        out = []
        for s in spawns:
            a = s.submit if start is None else s.marks.get(start)
            z = s.total if end is None else s.marks.get(end)
            if a is not None and z is not None:
                out.append(z - a)
        return out

    submit = [s.submit for s in spawns]
    split = [
        ("client.spawn() call (lookup, record, send_task)", submit),
        ("→ agent_tile ts (broker, pickup, lease, pin)", phase(None, "agent_tile")),
        ("agent_tile → first text delta ts (model call)", phase("agent_tile", "text")),
        ("first text → task_notification ts", phase("text", "task_notification")),
        ("task_notification → finished record read", phase("task_notification", None)),
    ]
    print("  where the spawn's time goes (medians; event ts are the worker's time.time()):")
    for label, values in split:
        print(f"    {label:<52} {ms(pct(values, 50))} ms")
    body = _captured_request(b, h.FAST)
    lit_wall, lit_cpu, raw_wall, raw_cpu = litellm_in_process(b, body, n)
    print("  the same model request made in this process, no worker (medians):")
    print(
        f"    {'LitellmModel.stream (litellm, streamed)':<52} {ms(pct(lit_wall, 50))} ms wall "
        f"{ms(pct(lit_cpu, 50))} ms CPU"
    )
    print(
        f"    {'plain httpx stream of the same body':<52} {ms(pct(raw_wall, 50))} ms wall "
        f"{ms(pct(raw_cpu, 50))} ms CPU"
    )
    s = b.summary
    s.latency("1 split: agent_tile → first text delta (in the worker)", phase("agent_tile", "text"))
    s.latency("1 in-process LitellmModel.stream, wall", lit_wall)
    s.latency("1 in-process LitellmModel.stream, CPU of the thread", lit_cpu)
    s.latency("1 in-process plain httpx stream, wall", raw_wall)
    spawn_med = pct([x.total for x in spawns], 50)
    s.ratio(
        f"in-process litellm call ÷ spawn round trip (medians): "
        f"{pct(lit_wall, 50) / spawn_med:.2f}; litellm ÷ plain httpx (wall): "
        f"{pct(lit_wall, 50) / pct(raw_wall, 50):.2f}x"
    )


# --- 3c: worker → subscriber -----------------------------------------------------------------


def bench_worker_events(b: Bench, sizes: Sizes, worker: h.Worker) -> None:
    print(
        f"\n== 3c. worker → subscriber: text deltas of {sizes.stream_spawns} spawns "
        f"({len(h.STREAM_TEXT.split())} deltas each, model answers at once) =="
    )
    spawn_round_trip(b, "bench_stream")  # warm-up
    quiet()
    lat: list[float] = []
    gaps: list[float] = []
    count = 0
    idle = idle_cpu_rate(worker)
    before, t = worker.cpu_seconds(), time.perf_counter()
    for _ in range(sizes.stream_spawns):
        got = _stream_spawn(b)
        deltas = [(recv, e) for recv, e in got if e.type == "text" and e.spawn_id]
        count += len(deltas)
        lat.extend(recv - e.ts for recv, e in deltas)
        gaps.extend(b2.ts - a.ts for (_, a), (_, b2) in zip(deltas, deltas[1:], strict=False))
    cpu = (worker.cpu_seconds() - before - idle * (time.perf_counter() - t)) / sizes.stream_spawns
    line("event ts (worker) → subscriber receives", lat)
    line("spacing of consecutive deltas in the worker", gaps)
    b.summary.latency("3c worker event ts → subscriber (text deltas)", lat)
    b.summary.latency("3c worker: ts spacing of consecutive text deltas", gaps)
    # The model streams one chunk per word; the worker coalesces them into fewer events.
    chunks = len(h.STREAM_TEXT.split())
    per_spawn = count / sizes.stream_spawns
    per_chunk = (cpu - b.cpu_per_fast_spawn) / (chunks - 2)  # the fast reply has 2 chunks
    b.summary.figure(
        f"3c worker CPU: {cpu * 1000:.1f} ms per {chunks}-chunk streamed spawn ({per_spawn:.0f} "
        f"text events after coalescing) vs {b.cpu_per_fast_spawn * 1000:.1f} ms per 2-chunk "
        f"spawn → ≈{per_chunk * 1000:.2f} ms per streamed chunk (litellm chunk + coalescing)"
    )


def _stream_spawn(b: Bench) -> list[tuple[float, Any]]:
    sid = uuid.uuid4().hex
    got: list[tuple[float, Any]] = []
    ready = threading.Event()

    def listen() -> None:
        for event in b.bus.subscribe(
            sid, timeout=30, until=lambda e: e.type == "task_notification"
        ):
            got.append((time.time(), event))
            if not event.spawn_id:
                ready.set()

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    b.bus.publish(TextDelta(session_id=sid, text="ready"))  # the subscriber is live after this
    if not ready.wait(10):
        raise RuntimeError("subscriber did not start")
    b.client.spawn("bench_stream", "Report.", session_id=sid)
    thread.join(timeout=60)
    return got


# --- main ---------------------------------------------------------------------------------------


def _header(r: redis.Redis, fake_url: str, stock: bool) -> None:
    print(
        f"python {platform.python_version()}, {psutil.cpu_count()} CPUs, redis server "
        f"{r.info('server')['redis_version']}, celery {version('celery')}, "
        f"litellm {version('litellm')}, redis-py {version('redis')}"
    )
    gap = h.response_gap(fake_url, h.FAST)
    how = "as shipped (start_subprocess)" if stock else "with TCP_NODELAY (bench/_fake.py)"
    print(
        f"fake model server {how}: response headers → first body bytes {gap * 1000:.2f} ms "
        "(median of 7; ~40 ms means Nagle + delayed ACK hold every streamed reply)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--quick", action="store_true", help="smaller N everywhere (about half as long)"
    )
    ap.add_argument(
        "--stock-fake",
        action="store_true",
        help="run the fake model exactly as start_subprocess does (no TCP_NODELAY)",
    )
    ap.add_argument(
        "--redis-url",
        default="redis://127.0.0.1:6379/12",
        help="a Redis database this benchmark may flush (default: db 12)",
    )
    args = ap.parse_args()
    sizes = QUICK if args.quick else FULL
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: stop what was started
    started = time.perf_counter()
    with ExitStack() as stack:
        site = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ongrid-bench-")))
        script = h.write_site(site, SLOW_DELAY, sizes.hold)
        r = stack.enter_context(h.flushed_db(args.redis_url))
        fake, fake_url = stack.enter_context(h.fake_model(script, stock=args.stock_fake))
        _header(r, fake_url, args.stock_fake)
        settings = Settings.load(
            environ={
                "REDIS_URL": args.redis_url,
                "ONGRID_AGENTS_DIR": str(site / "agents"),
                "ONGRID_MARKETPLACE_ROOT": str(site / "marketplace"),
            }
        )
        app = make_celery(settings)
        b = Bench(
            site=site,
            fake_url=fake_url,
            fake=fake,
            r=r,
            client=SpawnClient(settings),
            app=app,
            summary=Summary(),
        )
        bench_event_latency(b, sizes)
        direct = h.worker_env(args.redis_url, fake_url, site)
        with h.workers(app, site, direct, [("direct-c256", 256)]) as (worker,):
            bench_spawn_overhead(b, sizes, worker)
            bench_worker_events(b, sizes, worker)
        proxy = stack.enter_context(h.counting_proxy(fake_url))
        bench_load(b, sizes, h.worker_env(args.redis_url, proxy.base_url, site), proxy)
        b.summary.print()
    print(
        f"\ntotal time {time.perf_counter() - started:.0f} s; every process stopped, "
        f"{args.redis_url} flushed"
    )


if __name__ == "__main__":
    sys.exit(main())
