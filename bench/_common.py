"""What the runtime benchmarks share: sizes, the context they run in, and how figures print."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _harness as h
import psutil
import redis

from workers.client import SpawnClient
from workers.events import EventBus

SLOW_DELAY = 1.0  # seconds the fake model waits before answering each turn of the load test
QUIET_WAIT, QUIET_BUSY = 5.0, 0.2  # wait up to 5 s for the machine to be under 20 % busy


@dataclass(frozen=True)
class Sizes:
    overhead: int  # sequential round trips of each kind
    load: int  # spawns submitted at once
    events: int  # messages per in-process event latency run
    event_rate: float  # messages per second
    stream_spawns: int  # spawns whose text deltas are timed end to end
    hold: float  # model delay of the "how many can one worker hold" run, seconds


FULL = Sizes(overhead=50, load=220, events=2000, event_rate=500.0, stream_spawns=10, hold=12.0)
QUICK = Sizes(overhead=15, load=60, events=400, event_rate=500.0, stream_spawns=3, hold=5.0)


# --- figures ----------------------------------------------------------------------------------


def pct(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0–100), linear between closest ranks; NaN when empty."""
    if not values:
        return float("nan")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:8.2f}"


@dataclass
class Summary:
    """Rows of the final table and the ratio lines, filled as the benchmarks run."""

    rows: list[tuple[str, str, str, str, str]] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)
    ratios: list[str] = field(default_factory=list)

    def latency(self, label: str, values: Sequence[float]) -> None:
        self.rows.append(
            (label, ms(pct(values, 50)), ms(pct(values, 95)), ms(pct(values, 99)), str(len(values)))
        )

    def figure(self, text: str) -> None:
        self.figures.append(text)
        print(f"  {text}")

    def ratio(self, text: str) -> None:
        self.ratios.append(text)
        print(f"  ratio: {text}")

    def print(self) -> None:
        print("\n== summary (latencies in ms) ==")
        print(f"{'measurement':<58} {'median':>8} {'p95':>8} {'p99':>8} {'n':>5}")
        for label, *cols in self.rows:
            print(f"{label:<58} {cols[0]} {cols[1]} {cols[2]} {cols[3]:>5}")
        for text in self.figures:
            print(text)
        for text in self.ratios:
            print(f"ratio: {text}")


def quiet() -> None:
    """Let other jobs on the machine finish first; say so when they did not."""
    busy = h.wait_quiet(max_wait=QUIET_WAIT, threshold=QUIET_BUSY)
    if busy >= QUIET_BUSY:
        print(
            f"  NOTE: the machine was {busy:.0%} busy before this measurement (waited "
            f"{QUIET_WAIT:.0f} s); other processes share the cores measured here"
        )


def line(label: str, values: Sequence[float]) -> None:
    print(
        f"  {label:<46} median {ms(pct(values, 50))} ms  p95 {ms(pct(values, 95))} ms  "
        f"p99 {ms(pct(values, 99))} ms  (n={len(values)})"
    )


# --- the shared context ---------------------------------------------------------------------


@dataclass
class Bench:
    """What every benchmark uses: the worker directory, the fake model, Redis and the clients."""

    site: Path  # the workers' cwd: agents/ with the bench personas
    fake_url: str  # the fake model's base URL (direct, not through the proxy)
    fake: psutil.Process
    r: redis.Redis  # the flushed bench database
    client: SpawnClient
    app: Any  # the Celery app, for ping and control
    summary: Summary
    cpu_per_fast_spawn: float = float("nan")  # worker CPU seconds, measured in benchmark 1

    @property
    def bus(self) -> EventBus:
        return self.client.bus
