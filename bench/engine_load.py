"""The floor's load through the real system: N chats submitted to the API, one worker.

    .venv/bin/python bench/engine_load.py [--n 200] [--turns 5] [--delay 10,5,2] [--chunks 40]
                                          [--floor cheapest,default] [--profile]
                                          [--processes N] [--margin 64] [--redis-url URL]
                                          [--postgres postgresql+psycopg://user@host/db]
                                          [--submit async|stream] [--bracket]

What a user's load costs on the runtime, beside what it costs on bare litellm (``bench/floor.py``,
with ``--floor``, measured in the same run against the same server). It starts
``bench/fast_fake.py``, ``ongrid api`` and one ``ongrid worker -c N+margin [--processes N]`` on
the interactive queue, in a directory whose ``agents/`` holds a persona per turn delay on
``openai/<model>`` that calls ``get_edge_summary`` until its last turn; ``OPENAI_API_BASE``
points at the fake. The worker is first warmed with N short spawns in flight at once (its pool's
threads exist, as in a worker that has been up a while). Then, for each delay, the N chats go
through ``POST /api/v1/chat`` with ``agent`` set (a direct spawn: no coordinator model) and
``Prefer: respond-async`` (``--submit stream``: each turn's stream, closed once its headers name
the spawn), and the floor runs the same load.

Only the CLI, the HTTP API and the fake's counters are read, so the worker's internals may change
freely: the fake says when every model turn has been answered (its ``/_stats``, polled), then each
spawn's transcript (``GET /api/v1/spawns/{id}``) gives its status and final save time. Figures:
chats accepted per second and the API's CPU per chat (to a second after the last was accepted);
per-spawn efficiency = ideal (T × D) ÷ (final save − submission), median and p10; worker CPU per
model turn and its ratio to the floor's per call; worker RSS per spawn in flight ((peak − idle) ÷
N); peak model calls in flight, repeats, streamed calls and connections opened at the fake; model
turns per second; the API's, the fake's and Redis's CPU beside the worker's. ``--profile``
samples the worker and the API with py-spy during each load and prints the ten places with most
of each one's samples (a library, a runtime module, the event loop) and that share of a turn's
(the API: of an accepted chat's) CPU. ``--bracket`` measures each floor before the runtime's
load as well as after it and compares with their mean: this machine's speed drifts by up to a
third from one minute to the next.
A summary table closes the run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _harness as h  # noqa: E402 - bench/ is not a package; its modules import each other by path
import fast_fake  # noqa: E402
import floor  # noqa: E402
import httpx  # noqa: E402
import psutil  # noqa: E402

from workers.testing.backends import free_port  # noqa: E402

PERSONA, WARM_PERSONA = "bench_load", "bench_warm"
FINAL = {"ok", "failed", "cancelled"}
#: The warm-up spawns' turn: long enough for all of them to be in flight at once, so the worker
#: has made every thread of its pool (and each thread's result-backend client) before the
#: measurement, as a worker that has been up a while has: their creation is not a turn's cost.
WARM_DELAY = 3.0
SUBMITTERS = 32  # chats submitted at once; a browser-like client load, not a flood


def _persona(name: str, model: str, directive: str, max_turns: int) -> str:
    return f"""---
name: {name}
description: Load benchmark persona {name}.
when_to_use: Only in bench/engine_load.py.
tools: [{floor.TOOL}]
permission_mode: read-only
max_turns: {max_turns}
model: {model}
---

# {name}
Investigate briefly. {directive}
"""


def load_persona(index: int) -> str:
    """The load persona of the ``index``-th turn delay of a run (:data:`PERSONA` for the first)."""
    return PERSONA if index == 0 else f"{PERSONA}_{index}"


def write_site(
    root: Path, model: str, turns: int, delay: float, chunks: int, more: Sequence[float] = ()
) -> Path:
    """The processes' working directory: a load persona per turn delay (``delay``, then
    ``more``; see :func:`load_persona`) and the warm-up persona."""
    (root / "agents").mkdir(parents=True, exist_ok=True)
    (root / "marketplace").mkdir(exist_ok=True)
    for index, each in enumerate((delay, *more)):
        load = f"fastfake: delay={each} chunks={chunks} turns={turns} tool={floor.TOOL}"
        name = load_persona(index)
        (root / "agents" / f"{name}.md").write_text(_persona(name, model, load, turns + 2))
    warm = f"fastfake: delay={WARM_DELAY:g} chunks={chunks} turns=2 tool={floor.TOOL}"
    (root / "agents" / f"{WARM_PERSONA}.md").write_text(_persona(WARM_PERSONA, model, warm, 4))
    return root


@dataclass
class Stack:
    api_url: str
    token: str
    fake: fast_fake.Running
    api: psutil.Process
    worker: h.Worker
    #: The worker's RSS once it serves, before any load (its warm-up grows it for good).
    cold_rss: int = 0


@contextmanager
def _process(argv: list[str], site: Path, env: dict[str, str], log: Path) -> Iterator[Any]:
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=site, env=env, stdout=out, stderr=out)
    try:
        yield proc
    finally:
        h._stop(proc)


def _wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout:.0f} s")


def _wait_consumer(
    api_url: str, token: str, worker: h.Worker, processes: int = 1, timeout: float = 60.0
) -> None:
    """Until the API sees ``processes`` live consumers of the interactive queue (it refuses
    chats without one; the load would land on fewer processes than asked before)."""
    deadline = time.monotonic() + timeout
    auth = {"Authorization": f"Bearer {token}"}
    while time.monotonic() < deadline:
        if worker.proc.poll() is not None:
            raise RuntimeError(f"the worker exited:\n{worker.log_tail()}")
        try:
            ready = httpx.get(f"{api_url}/readyz", headers=auth, timeout=5).json()
            queue = (ready.get("queues") or {}).get("ongrid.interactive") or {}
            if (queue.get("consumers") or 0) >= processes:
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"no live consumer of ongrid.interactive after {timeout:.0f} s")


@contextmanager
def stack(
    site: Path,
    redis_url: str,
    concurrency: int,
    fake: fast_fake.Running,
    source: Path | None = None,
    stream_replies: str = "watched",
    processes: int = 1,
    database_url: str = "",
) -> Iterator[Stack]:
    """The API and one worker; ``source``: run them from that tree (e.g. an exported commit);
    ``stream_replies``: the worker's setting (``always`` streams every reply, as if each spawn
    were watched)."""
    token = secrets.token_urlsafe(24)
    config = site / "ongrid.yaml"
    # One user submits the whole load: the per-user bounds meant for people are lifted.
    lifted = {"turns_per_minute": 1_000_000, "spawns_per_minute": 1_000_000}
    lifted.update(
        streams_per_user=100_000, streams_per_process=100_000, sessions_per_user=1_000_000
    )
    config.write_text(
        json.dumps(
            {"auth": {"tokens": {token: {"user": "bench", "role": "admin"}}}, "limits": lifted}
        )
    )
    env = h.worker_env(redis_url, fake.base_url, site)
    env.update(ONGRID_CONFIG=str(config), ONGRID_DATA_DIR=str(site / ".ongrid"))
    env["ONGRID_STREAM_REPLIES"] = stream_replies
    if database_url:  # else the data directory's SQLite database
        env["ONGRID_DATABASE_URL"] = database_url
    if source is not None:
        env["PYTHONPATH"] = str(source.resolve())
    port = free_port()
    ongrid = [sys.executable, "-m", "coordinator"]
    api_argv = [*ongrid, "api", "--host", "127.0.0.1", "--port", str(port)]
    worker_argv = [*ongrid, "worker", "-c", str(concurrency), "--queues", "ongrid.interactive"]
    worker_argv += [
        "--name",
        "bench-engine",
        "--loglevel",
        "WARNING",
        "--processes",
        str(processes),
    ]
    api_url = f"http://127.0.0.1:{port}"
    with ExitStack() as stop:
        api = stop.enter_context(_process(api_argv, site, env, site / "api.log"))
        wproc = stop.enter_context(_process(worker_argv, site, env, site / "worker.log"))
        worker = h.Worker(wproc, "bench-engine", concurrency, site / "worker.log")
        _wait_http(f"{api_url}/healthz", api, site / "api.log")
        _wait_consumer(api_url, token, worker, processes)
        cold = worker.ps.memory_info().rss
        yield Stack(api_url, token, fake, psutil.Process(api.pid), worker, cold)


# --- the run ------------------------------------------------------------------------------------


async def _submit(
    s: Stack, persona: str, prompts: list[str], submit: str = "async"
) -> list[tuple[str, float, float]]:
    """POST each chat; (spawn id, sent at, accepted at) once its response headers arrive.
    ``submit``: ``async`` asks ``Prefer: respond-async`` (202, no stream), ``stream`` opens the
    turn's event stream and closes it once its headers name the spawn."""
    auth = {"Authorization": f"Bearer {s.token}"}
    if submit == "async":
        auth["Prefer"] = "respond-async"
    accepted = 202 if submit == "async" else 200
    limits = httpx.Limits(max_connections=SUBMITTERS, max_keepalive_connections=SUBMITTERS)
    out: list[tuple[str, float, float]] = [("", 0.0, 0.0)] * len(prompts)
    gate = asyncio.Semaphore(SUBMITTERS)
    async with httpx.AsyncClient(
        base_url=s.api_url, headers=auth, limits=limits, timeout=300
    ) as client:

        async def one(i: int) -> None:
            async with gate:
                sent = time.time()
                body = {"prompt": prompts[i], "agent": persona}
                async with client.stream("POST", "/api/v1/chat", json=body) as response:
                    if response.status_code != accepted:
                        await response.aread()
                        raise RuntimeError(f"chat refused: {response.status_code} {response.text}")
                    out[i] = (response.headers["x-spawn-id"], sent, time.time())

        await asyncio.gather(*(one(i) for i in range(len(prompts))))
    return out


def _transcripts(s: Stack, ids: list[str]) -> dict[str, dict[str, Any]]:
    auth = {"Authorization": f"Bearer {s.token}"}

    async def fetch() -> dict[str, dict[str, Any]]:
        limits = httpx.Limits(max_connections=16)
        async with httpx.AsyncClient(
            base_url=s.api_url, headers=auth, limits=limits, timeout=300
        ) as client:
            gate = asyncio.Semaphore(16)

            async def one(spawn_id: str) -> tuple[str, dict[str, Any]]:
                async with gate:
                    response = await client.get(f"/api/v1/spawns/{spawn_id}")
                    return spawn_id, response.json()

            return dict(await asyncio.gather(*(one(i) for i in ids)))

    return asyncio.run(fetch())


def _wait_done(s: Stack, ids: list[str], expected_requests: int, turn_delay: float) -> dict:
    """Until every spawn's transcript is final. The fake's counters are polled first (cheap):
    the transcripts are read only once it has answered every turn or fell quiet."""
    quiet_for = 3 * turn_delay + 30  # no new request and none open this long: nothing is left
    last_change, last_requests = time.monotonic(), -1
    while True:
        stats = s.fake.stats()
        if stats["requests"] != last_requests or stats["open_streams"]:
            last_change, last_requests = time.monotonic(), stats["requests"]
        answered = stats["requests"] - stats["repeats"] >= expected_requests
        if (answered and not stats["open_streams"]) or time.monotonic() - last_change > quiet_for:
            break
        time.sleep(0.5)
    pending = list(ids)
    records: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + 120 + 2 * turn_delay
    while pending:
        records.update(_transcripts(s, pending))
        pending = [i for i in pending if records[i].get("status") not in FINAL]
        if not pending or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    return records


class _RssPeak(threading.Thread):
    def __init__(self, proc: psutil.Process) -> None:
        super().__init__(daemon=True)
        self.proc, self.peak, self.stop = proc, proc.memory_info().rss, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.2):
            try:
                self.peak = max(self.peak, self.proc.memory_info().rss)
            except psutil.NoSuchProcess:
                return


def _cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system + t.children_user + t.children_system


def run_load(
    s: Stack,
    r: Any,
    n: int,
    turns: int,
    delay: float,
    *,
    persona: str = PERSONA,
    warm: bool = True,
    profile: bool = False,
    submit: str = "async",
) -> dict[str, Any]:
    """One load of ``n`` chats of ``persona``; ``warm``: warm the worker first (once per
    stack); ``profile``: record the worker and the API with py-spy meanwhile (their top costs
    in the result); ``submit``: how chats are posted (:func:`_submit`)."""
    if warm:
        # Warm the worker (imports, connections, its pool's threads) before anything is measured.
        warm_prompts = [f"warm {i}" for i in range(n)]
        warmed = asyncio.run(_submit(s, WARM_PERSONA, warm_prompts, submit))
        _wait_done(s, [w[0] for w in warmed], 2 * n, WARM_DELAY)
    h.wait_quiet(max_wait=10, threshold=0.2)
    worker_profile = _Profiler(s.worker.ps.pid) if profile else None
    api_profile = _Profiler(s.api.pid) if profile else None
    s.fake.reset()
    before = {
        "worker": s.worker.cpu_seconds(),
        "api": _cpu(s.api),
        "redis": h.redis_cpu_seconds(r),
        "fake": s.fake.stats()["cpu_seconds"],
        "machine": h.machine_busy_seconds(),
    }
    # Per spawn: (peak − the RSS before any load) ÷ N. The warm-up's threads and what its
    # spawns left allocated count against the load: an upper bound, not flattered by them.
    idle_rss = s.cold_rss or s.worker.ps.memory_info().rss
    rss = _RssPeak(s.worker.ps)
    rss.start()
    t0 = time.time()
    prompts = [f"engine load {delay:g} {i}" for i in range(n)]
    submitted = asyncio.run(_submit(s, persona, prompts, submit))
    submit_s = time.time() - t0
    # The API's CPU for taking the chats in: up to a moment after the last was accepted (each
    # stream's close is handled after its headers arrive), before the transcripts are read.
    time.sleep(1.0)
    api_accepting = _cpu(s.api) - before["api"]
    api_top = api_profile.stop() if api_profile is not None else []
    ids = [spawn_id for spawn_id, _, _ in submitted]
    records = _wait_done(s, ids, n * turns, delay)
    rss.stop.set()
    top = worker_profile.stop() if worker_profile is not None else []
    stats = s.fake.stats()
    cpu = {
        "worker": s.worker.cpu_seconds() - before["worker"],
        "api": _cpu(s.api) - before["api"],
        "redis": h.redis_cpu_seconds(r) - before["redis"],
        "fake": stats["cpu_seconds"] - before["fake"],
        "machine": h.machine_busy_seconds() - before["machine"],
    }
    statuses = Counter(records[i].get("status", "missing") for i in ids)
    efficiency = [
        turns * delay / (records[spawn_id]["updated"] - sent)
        for spawn_id, sent, _ in submitted
        if records[spawn_id].get("status") == "ok"
    ]
    model_turns = n * turns
    return {
        "n": n,
        "turns": turns,
        "delay": delay,
        "submit_s": submit_s,
        "accept_ms_median": statistics.median(1000 * (a - b) for _, b, a in submitted),
        "chats_per_s": n / submit_s,
        "api_cpu_ms_per_chat": api_accepting / n * 1000,
        "statuses": dict(statuses),
        "efficiency_median": statistics.median(efficiency) if efficiency else float("nan"),
        "efficiency_p10": sorted(efficiency)[len(efficiency) // 10] if efficiency else float("nan"),
        "worker_cpu_ms_per_turn": cpu["worker"] / model_turns * 1000,
        "cpu_seconds": cpu,
        "worker_rss_idle_mb": idle_rss / 2**20,
        "worker_rss_peak_mb": rss.peak / 2**20,
        "worker_rss_kb_per_spawn": (rss.peak - idle_rss) / n / 1024,
        "fake_requests": stats["requests"],
        "fake_streamed": stats.get("streamed", 0),
        "fake_connections": stats.get("connections", 0),
        "repeats": stats["repeats"],
        "fake_open_streams_peak": stats["open_streams_peak"],
        "wall_s": (wall := max((records[i].get("updated") or t0) for i in ids) - t0),
        "turns_per_s": model_turns / wall if wall > 0 else float("nan"),
        "profile_top": top,
        "api_profile_top": api_top,
        "submit": submit,
    }


class _Profiler:
    """py-spy recording a process (every thread, samples holding the GIL) until :meth:`stop`,
    which returns the ten places with most of its samples: (where, share). A sample counts for
    the code its innermost frame runs: the package of a library (``litellm``, ``redis``…), the
    module of the runtime (``workers/loop.py``), ``event loop`` for the engine's loop itself
    (uvloop is native code: py-spy sees only the frame that started it)."""

    def __init__(self, pid: int) -> None:
        self.out = Path(tempfile.mkstemp(prefix="engine-profile-", suffix=".txt")[1])
        spy = shutil.which("py-spy") or shutil.which(
            "py-spy", path=str(Path(sys.executable).parent)
        )
        if spy is None:
            raise SystemExit("--profile needs py-spy (pip install py-spy)")
        argv = [spy, "record", "--nonblocking", "--gil", "--full-filenames", "--rate", "200"]
        self.proc = subprocess.Popen(
            [*argv, "--format", "raw", "--output", str(self.out), "--pid", str(pid)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def stop(self) -> list[tuple[str, float]]:
        self.proc.send_signal(signal.SIGINT)  # py-spy writes what it has and exits
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return []
        where: Counter[str] = Counter()
        for line in self.out.read_text(errors="replace").splitlines():
            stack, _, count = line.rpartition(" ")
            if stack and count.isdigit():
                where[_place(stack.rsplit(";", 1)[-1])] += int(count)
        self.out.unlink(missing_ok=True)
        total = sum(where.values()) or 1
        return [(name, samples / total) for name, samples in where.most_common(10)]


#: The runtime's own packages: a frame in one is named by its module.
_OWN = ("workers/", "coordinator/", "registry/", "marketplace/")


def _place(frame: str) -> str:
    """Where a py-spy frame (``function (path:line)``) runs: see :class:`_Profiler`."""
    function, _, location = frame.partition(" (")
    path = location.rsplit(":", 1)[0]
    if function == "Engine._serve":
        return "event loop (uvloop, native)"
    if "site-packages/" in path:
        return path.split("site-packages/", 1)[1].split("/", 1)[0].removesuffix(".py")
    for own in _OWN:
        if path.startswith(own) or f"/{own}" in path:
            return own + path.split(own, 1)[1]
    if not path:
        return "(native)"
    return "stdlib " + path.rsplit("/", 1)[-1].removesuffix(".py")


def describe_profile(f: dict[str, Any]) -> str:
    """The ten costliest places of the worker (share of its samples, ms per model turn) and of
    the API (ms per accepted chat)."""
    per_turn, per_chat = f["worker_cpu_ms_per_turn"], f["api_cpu_ms_per_chat"]
    worker = [
        f"  {share * 100:5.1f} %  {share * per_turn:5.2f} ms/turn  {name}"
        for name, share in f["profile_top"]
    ]
    api = [
        f"  {share * 100:5.1f} %  {share * per_chat:5.2f} ms/chat  {name}"
        for name, share in f["api_profile_top"]
    ]
    return "\n".join(
        ["worker, where its samples are:", *worker, "API, where its samples are:", *api]
    )


def describe(f: dict[str, Any]) -> str:
    cpu = f["cpu_seconds"]
    return (
        f"engine: {f['n']} spawns × {f['turns']} turns × {f['delay']:g} s: statuses "
        f"{f['statuses']}; submitted all in {f['submit_s']:.2f} s ({f['chats_per_s']:.0f} chats/s, "
        f"accept median {f['accept_ms_median']:.0f} ms, API {f['api_cpu_ms_per_chat']:.2f} ms CPU "
        f"per chat); efficiency median {f['efficiency_median']:.3f} (p10 "
        f"{f['efficiency_p10']:.3f}); worker {f['worker_cpu_ms_per_turn']:.2f} ms CPU per model "
        f"turn; worker RSS {f['worker_rss_kb_per_spawn']:.0f} KB per spawn "
        f"({f['worker_rss_peak_mb']:.0f} MB peak, {f['worker_rss_idle_mb']:.0f} MB before any "
        "load); "
        f"{f['repeats']} repeats of {f['fake_requests']} requests ({f['fake_streamed']} "
        f"streamed, {f['fake_connections']} connections opened; peak "
        f"{f['fake_open_streams_peak']} open); wall {f['wall_s']:.1f} s "
        f"({f['turns_per_s']:.0f} model turns/s); CPU s: worker "
        f"{cpu['worker']:.1f}, api {cpu['api']:.1f}, redis {cpu['redis']:.1f}, fake "
        f"{cpu['fake']:.1f}, machine {cpu['machine']:.1f}"
    )


def table(engine: dict[str, Any], floors: list[dict[str, Any]]) -> str:
    heads = ["this worker", *(f"floor: {f['path']}" for f in floors)]
    rows = [
        (
            "per spawn: ideal ÷ (last reply − submission), median",
            [engine["efficiency_median"], *(f["efficiency_median"] for f in floors)],
            "{:.3f}",
        ),
        (
            "CPU per model turn, ms",
            [engine["worker_cpu_ms_per_turn"], *(f["cpu_ms_per_turn"] for f in floors)],
            "{:.2f}",
        ),
        (
            "RSS per spawn in flight, KB",
            [engine["worker_rss_kb_per_spawn"], *(f["rss_kb_per_conversation"] for f in floors)],
            "{:.0f}",
        ),
        (
            "the same turn requested twice",
            [engine["repeats"], *(f["repeats"] for f in floors)],
            "{}",
        ),
    ]
    title = f"{engine['n']} × {engine['turns']} turns × {engine['delay']:g} s"
    lines = [f"| {title} | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(heads)]
    for name, values, fmt in rows:
        lines.append(f"| {name} | " + " | ".join(fmt.format(v) for v in values) + " |")
    lines.append(
        f"| time to submit all {engine['n']} through the API, s | "
        f"{engine['submit_s']:.2f} |" + " |" * len(floors)
    )
    lines.append(
        f"| API CPU per accepted chat, ms | {engine['api_cpu_ms_per_chat']:.2f} |"
        + " |" * len(floors)
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument(
        "--delay",
        type=_delays,
        default=[5.0],
        help="seconds per model turn; several (10,5,2): the same load at each, in one run",
    )
    parser.add_argument("--chunks", type=int, default=40)
    parser.add_argument("--margin", type=int, default=64, help="worker slots beyond n")
    parser.add_argument("--model", default="openai/gpt-4o-mini")
    parser.add_argument(
        "--floor", default="", help="floor paths to measure too, e.g. cheapest,default"
    )
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/8")
    parser.add_argument(
        "--source",
        type=Path,
        help="run the API and worker from this source tree (e.g. `git archive HEAD` unpacked), "
        "to measure another version of the runtime beside the floor",
    )
    parser.add_argument(
        "--stream-replies",
        default="watched",
        choices=["watched", "always", "never"],
        help="the worker's stream_replies (the chats are not watched: `always` forces streaming)",
    )
    parser.add_argument(
        "--processes", type=int, default=1, help="the worker's --processes (-c each)"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="record the worker with py-spy during each load; print where its samples are",
    )
    parser.add_argument(
        "--postgres",
        default="",
        metavar="URL",
        help="keep the API's chats in a fresh database on this PostgreSQL server "
        "(postgresql+psycopg://user@host/db; created and dropped by the run) instead of SQLite",
    )
    parser.add_argument(
        "--submit",
        default="async",
        choices=["async", "stream"],
        help="post each chat with `Prefer: respond-async` (202, as automation does), or open "
        "its event stream and close it once the headers arrive (its first turn may stream)",
    )
    parser.add_argument(
        "--bracket",
        action="store_true",
        help="measure each floor before the runtime's load as well as after it, and compare "
        "with their mean (the machine's speed drifts between runs)",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with ExitStack() as stop:
        tmp = Path(stop.enter_context(tempfile.TemporaryDirectory(prefix="bench-engine-")))
        first, *more = args.delay
        site = write_site(tmp, args.model, args.turns, first, args.chunks, more)
        r = stop.enter_context(h.flushed_db(args.redis_url))
        fake = stop.enter_context(fast_fake.running())
        database = stop.enter_context(_fresh_postgres(args.postgres)) if args.postgres else ""
        s = stop.enter_context(
            stack(
                site,
                args.redis_url,
                args.n + args.margin,
                fake,
                args.source,
                args.stream_replies,
                args.processes,
                database,
            )
        )
        tree = args.source or Path(__file__).resolve().parent.parent
        print(
            f"fast_fake {fake.base_url}, API {s.api_url}, worker -c {args.n + args.margin} "
            f"× {args.processes} process(es), "
            f"stream_replies={args.stream_replies}, chats posted {args.submit}, runtime from "
            f"{tree}, chats in {'PostgreSQL' if database else 'SQLite'}"
        )
        results = []
        for index, delay in enumerate(args.delay):
            before = []
            if args.bracket:
                # The machine's speed drifts between runs: the floor is measured on both sides
                # of the runtime's load, and compared by its mean.
                for path in filter(None, args.floor.split(",")):
                    h.wait_quiet(max_wait=10, threshold=0.2)
                    f = floor.run_floor(args.n, args.turns, delay, args.chunks, path, fake.base_url)
                    print(f"before: {floor.describe(f)}", flush=True)
                    before.append(f)
            engine = run_load(
                s,
                r,
                args.n,
                args.turns,
                delay,
                persona=load_persona(index),
                warm=index == 0,
                profile=args.profile,
                submit=args.submit,
            )
            print(describe(engine), flush=True)
            if args.profile:
                print(describe_profile(engine))
            if engine["statuses"].get("ok", 0) < args.n:
                print(f"worker log tail:\n{s.worker.log_tail(40)}")
            floors = []
            for which, path in enumerate(filter(None, args.floor.split(","))):
                h.wait_quiet(max_wait=10, threshold=0.2)
                f = floor.run_floor(args.n, args.turns, delay, args.chunks, path, fake.base_url)
                print(floor.describe(f), flush=True)
                if which < len(before):
                    f = bracketed(before[which], f)
                floors.append(f)
            print()
            print(table(engine, floors))
            print()
            results.append({"engine": engine, "floors": floors})
        print(summary(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


@contextmanager
def _fresh_postgres(server_url: str) -> Iterator[str]:
    """A new database on the PostgreSQL server of ``server_url`` for this run, dropped after."""
    from sqlalchemy import create_engine, make_url

    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    name = f"bench_engine_{secrets.token_hex(6)}"
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def _delays(text: str) -> list[float]:
    try:
        delays = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: seconds, comma-separated (10,5,2)") from None
    if not delays or any(d < 0 for d in delays):
        raise argparse.ArgumentTypeError(f"{text!r}: one or more non-negative seconds")
    return delays


def _floor_cpu(f: dict[str, Any]) -> str:
    """The floor's CPU per call; bracketed: the mean (before / after)."""
    around = f.get("cpu_ms_per_turn_around")
    if around is None:
        return f"{f['cpu_ms_per_turn']:.2f}"
    return f"{f['cpu_ms_per_turn']:.2f} ({around[0]:.2f} / {around[1]:.2f})"


def bracketed(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """One floor from its runs before and after the runtime's load: CPU and efficiency their
    mean (each kept), repeats their sum, RSS the larger."""
    mean = {
        key: (before[key] + after[key]) / 2
        for key in ("cpu_ms_per_turn", "efficiency_median", "efficiency_p10")
    }
    return {
        **after,
        **mean,
        "repeats": before["repeats"] + after["repeats"],
        "rss_kb_per_conversation": max(
            before["rss_kb_per_conversation"], after["rss_kb_per_conversation"]
        ),
        "cpu_ms_per_turn_around": (before["cpu_ms_per_turn"], after["cpu_ms_per_turn"]),
    }


def summary(results: list[dict[str, Any]]) -> str:
    """One line per turn delay: what the API took in, what the worker made of it, beside the
    first floor measured at that delay."""
    heads = [
        "load",
        "chats accepted/s",
        "API CPU per chat, ms",
        "peak in flight",
        "efficiency median (p10)",
        "floor efficiency median (p10)",
        "worker CPU per turn, ms",
        "floor CPU per call, ms",
        "ratio",
        "RSS per spawn, KB",
        "model calls repeated",
    ]
    lines = ["| " + " | ".join(heads) + " |", "|---|" + "---:|" * (len(heads) - 1)]
    for result in results:
        e, floors = result["engine"], result["floors"]
        f = floors[0] if floors else None
        cells = [
            f"{e['n']} × {e['turns']} × {e['delay']:g} s",
            f"{e['chats_per_s']:.0f}",
            f"{e['api_cpu_ms_per_chat']:.2f}",
            f"{e['fake_open_streams_peak']}",
            f"{e['efficiency_median']:.3f} ({e['efficiency_p10']:.3f})",
            f"{f['efficiency_median']:.3f} ({f['efficiency_p10']:.3f})" if f else "–",
            f"{e['worker_cpu_ms_per_turn']:.2f}",
            _floor_cpu(f) if f else "–",
            f"{e['worker_cpu_ms_per_turn'] / f['cpu_ms_per_turn']:.2f}×" if f else "–",
            f"{e['worker_rss_kb_per_spawn']:.0f}",
            f"{e['repeats']}" + (f" (floor {f['repeats']})" if f else ""),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    main()
