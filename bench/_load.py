"""Benchmark 2: spawns held in flight at once and throughput, on one worker process and on two.

N spawns are submitted at once; the fake model waits ``delay`` seconds per turn. Spawns running
are counted from the records (sampled) and from the event timestamps (exact sweep); model requests
open at once are counted by ``bench/_proxy.py`` between the workers and the fake.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import _harness as h
import httpx
import psutil
import redis
from _common import SLOW_DELAY, Bench, Sizes, pct, quiet


class Sampler(threading.Thread):
    """Every 50 ms: how many of the submitted spawns' records say running, and how many finished."""

    def __init__(self, r: redis.Redis, period: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.r, self.period = r, period
        self.keys: list[str] = []
        self.samples: list[tuple[float, int, int]] = []
        self.finished = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.period):
            keys = list(self.keys)
            if not keys:
                continue
            values = self.r.mget(keys)
            running = sum(1 for v in values if v and b'"status":"running"' in v)
            finished = sum(
                1
                for v in values
                if v
                and (
                    b'"status":"ok"' in v
                    or b'"status":"failed"' in v
                    or b'"status":"cancelled"' in v
                )
            )
            self.finished = finished
            self.samples.append((time.time(), running, finished))


def _sweep_peak(spans: Sequence[tuple[float, float]]) -> int:
    points = sorted([(a, 1) for a, _ in spans] + [(z, -1) for _, z in spans])
    peak = level = 0
    for _, d in points:
        level += d
        peak = max(peak, level)
    return peak


@dataclass
class CpuMeter:
    """CPU seconds of each process involved, and of the machine, between start() and stop()."""

    workers: list[h.Worker]
    fake: psutil.Process
    proxy: psutil.Process
    r: redis.Redis
    before: dict[str, float] = field(default_factory=dict)
    delta: dict[str, float] = field(default_factory=dict)

    def _read(self) -> dict[str, float]:
        me = psutil.Process().cpu_times()

        def cpu(p: psutil.Process) -> float:
            t = p.cpu_times()
            return t.user + t.system

        out = {f"worker {w.name}": w.cpu_seconds() for w in self.workers}
        out.update(
            {
                "fake model": cpu(self.fake),
                "proxy": cpu(self.proxy),
                "redis": h.redis_cpu_seconds(self.r),
                "bench (submit, sampler)": me.user + me.system,
                "machine (all cores)": h.machine_busy_seconds(),
            }
        )
        return out

    def start(self) -> None:
        self.before = self._read()

    def stop(self) -> None:
        after = self._read()
        self.delta = {k: after[k] - self.before[k] for k in after}
        machine = self.delta["machine (all cores)"]
        self.delta["other processes"] = machine - sum(
            v for k, v in self.delta.items() if k != "machine (all cores)"
        )


def _submit_all(b: Bench, persona: str, n: int, sampler: Sampler) -> list[str]:
    ids = []
    for i in range(n):
        record = b.client.spawn(persona, f"load {i}")
        ids.append(record.spawn_id)
        sampler.keys.append(b.client.store._key(record.spawn_id))
    return ids


def _wait_finished(sampler: Sampler, n: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sampler.finished >= n:
            return True
        time.sleep(0.05)
    return False


@dataclass
class LoadResult:
    label: str
    processes: int
    n: int
    turns: int
    delay: float  # the fake model's delay per turn
    slots: int
    statuses: dict[str, int]
    complete: bool  # every spawn finished before the timeout
    submitted: float  # seconds to submit all n
    window: float  # seconds from the first submit until all were seen finished
    wall: float  # seconds from the first submit until the last record's final save
    peak_running_sampled: int
    peak_running_events: int
    peak_requests: int
    requests_avg: float  # model requests open, averaged over the wall time
    request_durations: list[float]
    queue_waits: list[float]  # record created → agent_tile
    runs: list[float]  # agent_tile → task_notification
    starts: list[float]  # agent_tile ts of each spawn
    cpu: dict[str, float]  # CPU seconds over the window, per process and for the machine

    @property
    def throughput(self) -> float:
        return sum(v for k, v in self.statuses.items() if k in ("ok", "failed")) / self.wall

    @property
    def ideal(self) -> float:
        """concurrency ÷ latency: min(N, slots) spawns every ``turns × delay`` seconds."""
        return min(self.n, self.slots) / (self.turns * self.delay)

    @property
    def start_rate(self) -> float:
        """Spawns the worker(s) began (agent_tile) per second, first start to last."""
        if len(self.starts) < 2:
            return float("nan")
        return (len(self.starts) - 1) / (self.starts[-1] - self.starts[0])

    @property
    def worker_cpu(self) -> float:
        return sum(v for k, v in self.cpu.items() if k.startswith("worker"))

    @property
    def cpu_ms_per_turn(self) -> float:
        return self.worker_cpu / (self.n * self.turns) * 1000

    @property
    def worker_cpu_util(self) -> float:
        return self.worker_cpu / self.window


def _event_spans(b: Bench, records: list) -> tuple[list, list, list]:
    """Per finished spawn: (agent_tile ts, task_notification ts), queue wait, run time."""
    spans, waits, runs = [], [], []
    for rec in records:
        marks: dict[str, float] = {}
        for event in b.bus.history(rec.session_id):
            marks.setdefault(event.type, event.ts)
        if "agent_tile" in marks and "task_notification" in marks:
            spans.append((marks["agent_tile"], marks["task_notification"]))
            waits.append(marks["agent_tile"] - rec.created)
            runs.append(marks["task_notification"] - marks["agent_tile"])
    return spans, waits, runs


@dataclass(frozen=True)
class Load:
    persona: str
    turns: int
    delay: float


def run_load(
    b: Bench, label: str, load: Load, n: int, workers: list[h.Worker], proxy
) -> LoadResult:
    quiet()
    proxy.reset()
    sampler = Sampler(b.r)
    meter = CpuMeter(workers, b.fake, psutil.Process(proxy.proc.pid), b.r)
    meter.start()
    sampler.start()
    t0 = time.time()
    ids = _submit_all(b, load.persona, n, sampler)
    submitted = time.time() - t0
    complete = _wait_finished(sampler, n, timeout=60 + 0.5 * n * load.turns)
    window = time.time() - t0
    sampler.stop.set()
    sampler.join()
    meter.stop()
    stats = proxy.stats()
    records = [b.client.store.get(i) for i in ids]
    finished = [r for r in records if r and r.finished]
    wall = max(r.updated for r in finished) - t0 if finished else float("nan")
    spans, waits, runs = _event_spans(b, finished)
    requests = [(a, z) for a, z in stats["spans"]]
    result = LoadResult(
        label=label,
        processes=len(workers),
        n=n,
        turns=load.turns,
        delay=load.delay,
        slots=sum(w.concurrency for w in workers),
        statuses=dict(Counter(r.status if r else "missing" for r in records)),
        complete=complete,
        submitted=submitted,
        window=window,
        wall=wall,
        peak_running_sampled=max((s[1] for s in sampler.samples), default=0),
        peak_running_events=_sweep_peak(spans),
        peak_requests=int(stats["peak"]),
        requests_avg=sum(z - a for a, z in requests) / wall,
        request_durations=[z - a for a, z in requests],
        queue_waits=waits,
        runs=runs,
        starts=sorted(a for a, _ in spans),
        cpu=meter.delta,
    )
    _print_load(result)
    return result


def _print_load(res: LoadResult) -> None:
    cores = psutil.cpu_count() or 1
    req = res.request_durations
    print(
        f"\n-- {res.label}: {res.n} spawns × {res.turns} model turn(s) of {res.delay:.0f} s, "
        f"{res.processes} worker process(es), {res.slots} slots --"
    )
    print(f"  statuses: {res.statuses}{'' if res.complete else '  (TIMED OUT)'}")
    print(f"  submitting all {res.n} (client.spawn in a loop): {res.submitted:.2f} s")
    print(
        f"  wall, first submit → last record finished: {res.wall:.2f} s "
        f"(ideal {res.turns * res.delay:.0f} s + overhead)"
    )
    print(
        f"  peak spawns running: {res.peak_running_sampled} (records' status sampled every "
        f"50 ms), {res.peak_running_events} (sweep over agent_tile → task_notification ts)"
    )
    print(
        f"  peak model requests open at the fake (proxy): {res.peak_requests}; "
        f"time-averaged {res.requests_avg:.1f}; {len(req)} requests, duration median "
        f"{pct(req, 50):.2f} s, p95 {pct(req, 95):.2f} s"
    )
    if res.turns == 1 and res.peak_requests < 0.8 * res.peak_running_events:
        pool = getattr(getattr(httpx, "_config", None), "DEFAULT_LIMITS", None)
        print(
            f"  NOTE: {res.peak_running_events} one-turn spawns were running but at most "
            f"{res.peak_requests} model requests were open at the fake; httpx's default "
            "connection pool, which litellm's cached OpenAI client gets when none is "
            f"configured: {pool}"
        )
    print(
        f"  start rate: {res.start_rate:.1f} spawns/s began (agent_tile ts), the last "
        f"{res.starts[-1] - res.starts[0] if res.starts else float('nan'):.2f} s after the first"
    )
    print(
        f"  per spawn: queue wait (created → agent_tile) median {pct(res.queue_waits, 50):.2f} s,"
        f" max {max(res.queue_waits, default=float('nan')):.2f} s; run (agent_tile → "
        f"notification) median {pct(res.runs, 50):.2f} s, p95 {pct(res.runs, 95):.2f} s"
    )
    print(
        f"  throughput {res.throughput:.1f} spawns/s; concurrency ÷ latency = "
        f"{min(res.n, res.slots)} ÷ {res.turns * res.delay:.0f} s = {res.ideal:.1f} spawns/s"
    )
    cpu = ", ".join(f"{k} {v:.2f}" for k, v in res.cpu.items())
    print(f"  CPU seconds over the {res.window:.2f} s window: {cpu}")
    print(
        f"  machine: {res.cpu['machine (all cores)'] / (res.window * cores):.0%} of {cores} "
        f"cores busy; worker process(es): {res.worker_cpu_util:.0%} of one core; "
        f"{res.cpu_ms_per_turn:.1f} CPU-ms per model turn in the worker(s) (all the worker's "
        "CPU ÷ turns)"
    )


def _warm_workers(b: Bench, n: int, sampler_timeout: float = 120) -> None:
    """A burst of immediate spawns: imports litellm, starts pool threads and HTTP connections."""
    sampler = Sampler(b.r)
    sampler.start()
    _submit_all(b, "bench_fast", n, sampler)
    ok = _wait_finished(sampler, n, sampler_timeout)
    sampler.stop.set()
    sampler.join()
    if not ok:
        raise RuntimeError("warm-up spawns did not finish")


def bench_load(b: Bench, sizes: Sizes, env: dict[str, str], proxy) -> None:
    n = sizes.load
    print(
        f"\n== 2. in flight: {n} spawns submitted at once, fake model {SLOW_DELAY:.0f} s per "
        f"turn (and {sizes.hold:.0f} s in a hold run), workers → counting proxy → fake =="
    )
    one_turn = Load("bench_slow1", 1, SLOW_DELAY)
    two_turns = Load("bench_slow2", 2, SLOW_DELAY)
    hold = Load("bench_hold", 1, sizes.hold)
    plans = [
        ("1 worker -c 256", [("solo-c256", 256)], [one_turn, two_turns, hold]),
        ("2 workers -c 128", [("duo1-c128", 128), ("duo2-c128", 128)], [one_turn, two_turns]),
    ]
    results: list[LoadResult] = []
    for tag, plan, loads in plans:
        with h.workers(b.app, b.site, env, plan) as started:
            _warm_workers(b, min(n, 60))
            for load in loads:
                label = f"{tag}, {load.turns} turn(s) of {load.delay:.0f} s"
                results.append(run_load(b, label, load, n, started, proxy))
    s = b.summary
    print()
    for res in results:
        s.ratio(
            f"[{res.label}] throughput ÷ (concurrency ÷ latency) = {res.throughput:.1f} ÷ "
            f"{res.ideal:.1f} = {res.throughput / res.ideal:.2f} (target ≥ 0.90); held at once: "
            f"{res.peak_running_events} spawns running, {res.peak_requests} model requests open "
            f"(target ≥ 200); {res.cpu_ms_per_turn:.1f} CPU-ms/turn, worker CPU "
            f"{res.worker_cpu_util:.0%} of a core"
        )
    by = {(r.processes, r.turns, r.delay): r for r in results}
    for turns in (1, 2):
        one, two = by.get((1, turns, SLOW_DELAY)), by.get((2, turns, SLOW_DELAY))
        if one and two:
            s.ratio(
                f"{turns} turn(s): 2 workers ÷ 1 worker throughput = "
                f"{two.throughput / one.throughput:.2f}x"
            )
