"""A worker holding N spawns is SIGKILLed and another started: what survives, what is paid twice.

    .venv/bin/python bench/crash_recovery.py [--n 1000] [--turns 5] [--delay 10] [--chunks 4]
                                             [--margin 100] [--lease-seconds 10]
                                             [--redis-url URL] [--json PATH]

The recovery target of the engine, measured through the real system: ``bench/fast_fake.py`` (in
a subclass that logs each request's start and end), ``ongrid api`` and worker A (``ongrid worker
-c N+margin --queues ongrid.interactive``, in a process group of its own). N chats, a direct
spawn of the load persona of ``bench/engine_load.py`` each, go through the API. Once nearly all
N wait on the model and at least half have finished a turn, A's process group is SIGKILLed and
worker B started; the run waits (bounded) until every spawn is final, then reads each spawn's
record and its session's whole event stream from Redis.

What it checks:

- every spawn ends ``ok``;
- tool calls: each (spawn, call id) has at most one result from a run of the tool in the
  transcript; a call reported "interrupted" (its worker died while it ran) is counted apart;
- model calls: a turn requested again at the fake is *paid twice* when the reply to the
  request before it had been sent completely before the kill (or after it, by worker B); a turn
  whose request was in flight at the kill is expected to be requested again, and counted apart;
- events: per session, ``seq`` runs 1, 2, 3, … without a gap; one ``agent_tile``, one
  ``task_notification``, each ``tool_call`` and ``tool_result`` call id once; the text published
  per turn is that turn's reply, once (a resumed turn may publish only what the lost attempt had
  not).

Figures: time from the kill until B holds every spawn left (a lease taken under a token that is
not one of A's) and until all are final, and the counts above.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import _harness as h  # noqa: E402 - bench/ is not a package; its modules import each other by path
import engine_load  # noqa: E402
import fast_fake  # noqa: E402
import redis  # noqa: E402

from workers.testing.backends import free_port  # noqa: E402

INTERRUPTED = "interrupted:"  # how the loop reports a call whose worker died while it ran
QUEUE = "ongrid.interactive"


# --- the fake, with a log of every request -------------------------------------------------------


class _LoggingServer(fast_fake.Server):
    """``fast_fake.Server`` that appends one JSON line per chat request once it ends:
    ``[conversation, turn, started, ended, sent]``, times in Unix seconds; ``sent`` is false when
    the reply could not be written out (the client was gone)."""

    def __init__(self, defaults: fast_fake.Script, log: Path) -> None:
        super().__init__(defaults)
        self._log = log.open("a", buffering=1)

    async def _complete(self, writer: asyncio.StreamWriter, request: dict[str, Any]) -> None:
        key, turn = fast_fake._conversation(request.get("messages") or [])
        started, sent = time.time(), False
        try:
            await super()._complete(writer, request)
            sent = not writer.is_closing()
        finally:
            self._log.write(json.dumps([key, turn, started, time.time(), sent]) + "\n")


async def _serve_logging(port_file: Path, log: Path) -> None:
    server = _LoggingServer(fast_fake.Script(), log)
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0, backlog=4096)
    tmp = port_file.with_suffix(".tmp")
    tmp.write_text(str(listener.sockets[0].getsockname()[1]))
    tmp.replace(port_file)
    async with listener:
        await listener.serve_forever()


def serve_logging_fake(port_file: Path, log: Path) -> None:
    """The body of ``crash_recovery.py --serve-fake``: the logging fake, on uvloop if present."""
    coroutine = _serve_logging(port_file, log)
    try:
        import uvloop
    except ImportError:
        asyncio.run(coroutine)
    else:
        uvloop.run(coroutine)


@contextmanager
def logging_fake(log: Path) -> Iterator[fast_fake.Running]:
    """The logging fake in its own process; ``Running.stats()`` works as for ``fast_fake``."""
    with tempfile.TemporaryDirectory(prefix="crash-fake-") as tmp:
        port_file = Path(tmp) / "port"
        argv = [sys.executable, __file__, "--serve-fake", str(port_file), "--fake-log", str(log)]
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while not port_file.exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the logging fake did not start")
                time.sleep(0.02)
            yield fast_fake.Running(proc, f"http://127.0.0.1:{port_file.read_text()}/v1")
        finally:
            h._stop(proc, timeout=10)


@dataclass(frozen=True)
class Request:
    key: str
    turn: int
    started: float
    ended: float
    sent: bool


def read_requests(log: Path) -> list[Request]:
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return [Request(*row) for row in rows]


# --- the processes -------------------------------------------------------------------------------


@dataclass
class Site:
    root: Path
    env: dict[str, str]
    token: str


def make_site(root: Path, args: argparse.Namespace, fake: fast_fake.Running) -> Site:
    engine_load.write_site(root, args.model, args.turns, args.delay, args.chunks)
    token = secrets.token_urlsafe(24)
    config = root / "ongrid.yaml"
    config.write_text(json.dumps({"auth": {"tokens": {token: {"user": "bench", "role": "admin"}}}}))
    env = h.worker_env(args.redis_url, fake.base_url, root)
    env.update(
        ONGRID_CONFIG=str(config),
        ONGRID_DATA_DIR=str(root / ".ongrid"),
        ONGRID_LEASE_SECONDS=str(args.lease_seconds),
    )
    if args.connector_limit:
        # ``workers._litellm.load`` sets these to 0 unless already set, which litellm reads as
        # "not set" and aiohttp then as its default of 100 connections: no more than 100 model
        # calls of a worker would be in flight, whatever its concurrency.
        limit = str(args.connector_limit)
        env.update(AIOHTTP_CONNECTOR_LIMIT=limit, AIOHTTP_CONNECTOR_LIMIT_PER_HOST=limit)
    return Site(root, env, token)


def start_worker(site: Site, name: str, concurrency: int) -> h.Worker:
    """``ongrid worker`` in a process group of its own, so a kill of the group takes all of it."""
    argv = [sys.executable, "-m", "coordinator", "worker", "-c", str(concurrency)]
    argv += ["--queues", QUEUE, "--name", name, "--loglevel", "WARNING"]
    log = site.root / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, cwd=site.root, env=site.env, stdout=out, stderr=out, start_new_session=True
        )
    return h.Worker(proc, name, concurrency, log)


def kill_group(worker: h.Worker) -> tuple[float, list[int]]:
    """SIGKILL the worker's process group; (the time just before, pids of it still alive)."""
    pgid = worker.proc.pid
    members = [worker.ps, *worker.ps.children(recursive=True)]
    killed_at = time.time()
    os.killpg(pgid, signal.SIGKILL)
    worker.proc.wait()
    _gone, alive = psutil.wait_procs(members, timeout=10)
    strays = [p.pid for p in psutil.process_iter() if _pgid(p.pid) == pgid]
    return killed_at, sorted({p.pid for p in alive} | set(strays))


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None


def _stack(site: Site, worker: h.Worker, fake: fast_fake.Running, api: Any) -> engine_load.Stack:
    return engine_load.Stack(api.url, site.token, fake, api.ps, worker)


@dataclass
class Api:
    url: str
    ps: psutil.Process


@contextmanager
def api_process(site: Site) -> Iterator[Api]:
    port = free_port()
    argv = [sys.executable, "-m", "coordinator", "api", "--host", "127.0.0.1", "--port", str(port)]
    log = site.root / "api.log"
    with engine_load._process(argv, site.root, site.env, log) as proc:
        url = f"http://127.0.0.1:{port}"
        engine_load._wait_http(f"{url}/healthz", proc, log)
        yield Api(url, psutil.Process(proc.pid))


@contextmanager
def stopped_at_exit(worker: h.Worker) -> Iterator[h.Worker]:
    try:
        yield worker
    finally:
        h._stop(worker.proc)


# --- watching the spawns -------------------------------------------------------------------------


@dataclass
class Watch:
    """The spawns' records and leases, read in one pipeline per look."""

    r: redis.Redis
    ids: list[str]
    prefix: str = "ongrid:"

    def look(self) -> tuple[dict[str, str], dict[str, str | None]]:
        """(spawn id → status, spawn id → lease token or ``None``)."""
        pipe = self.r.pipeline(transaction=False)
        pipe.mget([f"{self.prefix}spawn:{i}" for i in self.ids])
        pipe.mget([f"{self.prefix}lease:{i}" for i in self.ids])
        raw_records, raw_leases = pipe.execute()
        statuses = {
            i: (json.loads(raw)["status"] if raw else "missing")
            for i, raw in zip(self.ids, raw_records, strict=True)
        }
        leases = {
            i: (raw.decode() if raw else None) for i, raw in zip(self.ids, raw_leases, strict=True)
        }
        return statuses, leases


def wait_in_flight(
    fake: fast_fake.Running, n: int, threshold: int, deadline_s: float
) -> dict[str, Any]:
    """Until ``threshold`` model streams are open and more than half of the spawns have had a
    turn answered (requests > 1.5 N); the fake's stats at that moment (or at the deadline)."""
    deadline = time.monotonic() + deadline_s
    while True:
        stats = fake.stats()
        if stats["open_streams"] >= threshold and stats["requests"] > 1.5 * n:
            return stats
        if time.monotonic() > deadline:
            return stats
        time.sleep(0.2)


@dataclass
class Recovery:
    held_by_b_s: float | None = None
    all_final_s: float | None = None
    open_streams_after: list[tuple[float, int]] = field(default_factory=list)


def wait_recovered(
    watch: Watch,
    fake: fast_fake.Running,
    killed_at: float,
    a_tokens: set[str],
    deadline_s: float,
) -> tuple[Recovery, dict[str, str]]:
    """Until every spawn is final (or the deadline): when B held all that were left, when all
    were final, and the fake's open streams along the way."""
    rec = Recovery()
    deadline = time.monotonic() + deadline_s
    while True:
        statuses, leases = watch.look()
        now = time.time() - killed_at
        left = [i for i, s in statuses.items() if s not in engine_load.FINAL]
        if rec.held_by_b_s is None and all(
            leases[i] is not None and leases[i] not in a_tokens for i in left
        ):
            rec.held_by_b_s = now
        rec.open_streams_after.append((now, int(fake.stats()["open_streams"])))
        if not left:
            rec.all_final_s = now
            return rec, statuses
        if time.monotonic() > deadline:
            return rec, statuses
        time.sleep(0.5)


# --- the checks ----------------------------------------------------------------------------------


def conversation_key(prompt: str) -> str:
    return fast_fake._conversation([{"role": "user", "content": prompt}])[0]


def model_calls(requests: list[Request], killed_at: float, needed: int) -> dict[str, Any]:
    """Each repeat of a (conversation, turn), by what became of the request before it."""
    by_turn: dict[tuple[str, int], list[Request]] = defaultdict(list)
    for req in requests:
        by_turn[req.key, req.turn].append(req)
    in_flight, paid_before_kill, paid_after_kill = 0, [], 0
    paid_turns: list[tuple[str, int, int]] = []
    for reqs in by_turn.values():
        reqs.sort(key=lambda q: q.started)
        for before, _again in zip(reqs, reqs[1:], strict=False):
            if before.started >= killed_at:
                paid_after_kill += 1  # both by B: its reply was received, or B lost it
            elif before.sent and before.ended < killed_at:
                paid_before_kill.append(killed_at - before.ended)
                paid_turns.append(
                    (before.key, before.turn, round(1000 * (killed_at - before.ended)))
                )
            else:
                in_flight += 1
    paid_before_kill.sort()
    return {
        "requests": len(requests),
        "needed": needed,
        "turns_seen": len(by_turn),
        "repeats": sum(len(r) - 1 for r in by_turn.values()),
        "repeats_in_flight_at_kill": in_flight,
        "paid_twice_before_kill": len(paid_before_kill),
        "paid_twice_before_kill_ms_before": [round(1000 * s) for s in paid_before_kill[:20]],
        "paid_twice_turns": paid_turns[:20],  # (conversation, turn, ms before the kill)
        "paid_twice_after_kill": paid_after_kill,
        "in_flight_at_kill": sum(1 for q in requests if q.started < killed_at <= q.ended),
    }


@dataclass
class SpawnCheck:
    """What one spawn's transcript and its session's events show."""

    status: str
    attempts: int
    tool_calls: int = 0
    tools_run: int = 0
    tools_run_twice: int = 0
    tools_interrupted: int = 0
    calls_without_result: int = 0
    result_mismatch: int = 0  # the event's result is not the transcript's
    seq_gap: bool = False
    foreign_events: int = 0
    tiles: int = 0
    notes: int = 0
    tool_call_event_dups: int = 0
    tool_result_event_dups: int = 0
    tool_call_events_missing: int = 0
    text_repeated: int = 0  # turns whose published text holds more than their reply
    text_missing: int = 0  # turns whose published text lacks part of their reply

    @property
    def events_wrong(self) -> bool:
        return bool(
            self.seq_gap
            or self.foreign_events
            or self.tiles != 1
            or self.notes != 1
            or self.tool_call_event_dups
            or self.tool_result_event_dups
            or self.tool_call_events_missing
            or self.result_mismatch
        )


def _check_transcript(check: SpawnCheck, messages: list[Any]) -> dict[str, str]:
    """Tool calls and their results in the transcript; call id → the transcript's result."""
    asked = [c.id for m in messages if m.role == "assistant" for c in m.tool_calls]
    results: dict[str, list[str]] = defaultdict(list)
    for m in messages:
        if m.role == "tool":
            results[m.tool_call_id or ""].append(m.content or "")
    check.tool_calls = len(asked)
    for call_id in asked:
        got = results.get(call_id, [])
        ran = [c for c in got if not c.startswith(INTERRUPTED)]
        check.tools_run += len(ran)
        check.tools_run_twice += max(0, len(ran) - 1)
        check.tools_interrupted += len(got) - len(ran)
        check.calls_without_result += not got
    return {k: v[-1] for k, v in results.items()}


def _check_events(
    check: SpawnCheck, spawn_id: str, events: list[Any], replies: list[str], results: dict
) -> None:
    seqs = [e.seq for e in events]
    check.seq_gap = seqs != list(range(1, len(seqs) + 1))
    check.foreign_events = sum(1 for e in events if e.spawn_id != spawn_id)
    kinds = Counter(e.type for e in events)
    check.tiles, check.notes = kinds["agent_tile"], kinds["task_notification"]
    calls = Counter(e.call_id for e in events if e.type == "tool_call")
    outs = Counter(e.call_id for e in events if e.type == "tool_result")
    check.tool_call_event_dups = sum(c - 1 for c in calls.values())
    check.tool_result_event_dups = sum(c - 1 for c in outs.values())
    check.tool_call_events_missing = check.tool_calls - len(calls)
    check.result_mismatch = sum(
        1 for e in events if e.type == "tool_result" and results.get(e.call_id) != e.content
    )
    # A turn's text is what is published between the end of the turn before it (the tile, a
    # tool result) and its own end (its tool call, or the notification of the final answer).
    turns: list[str] = []
    text, in_turn = "", True
    for e in events:
        if e.type == "text":
            text += e.text
        elif e.type in ("tool_call", "task_notification") and in_turn:
            turns.append(text)
            text, in_turn = "", False
        elif e.type == "tool_result":
            text, in_turn = "", True
    for published, reply in zip(turns, replies, strict=False):
        if published == reply:
            continue
        if len(published) > len(reply):
            check.text_repeated += 1
        else:
            check.text_missing += 1
    check.text_missing += max(0, len(replies) - len(turns))


def check_spawns(r: redis.Redis, ids: list[str]) -> dict[str, SpawnCheck]:
    from workers.events import EventBus
    from workers.spawns import SpawnStore

    store, bus = SpawnStore(r), EventBus(r)
    out = {}
    for spawn_id in ids:
        record = store.get(spawn_id)
        if record is None:
            out[spawn_id] = SpawnCheck("missing", 0)
            continue
        check = SpawnCheck(record.status, record.attempts)
        messages = record.state.messages if record.state else []
        results = _check_transcript(check, messages)
        replies = [m.content or "" for m in messages if m.role == "assistant"]
        _check_events(check, spawn_id, bus.history(record.session_id), replies, results)
        out[spawn_id] = check
    return out


def anomalies(checks: dict[str, SpawnCheck], limit: int = 20) -> dict[str, dict[str, Any]]:
    """The first ``limit`` spawns that are not ok, or whose tools or events show anything off."""
    odd = {
        spawn_id: {k: v for k, v in vars(c).items() if v}
        for spawn_id, c in checks.items()
        if c.status != "ok"
        or c.events_wrong
        or c.tools_interrupted
        or c.tools_run_twice
        or c.calls_without_result
        or c.text_repeated
        or c.text_missing
    }
    return dict(list(odd.items())[:limit])


def log_lines(worker: h.Worker, *needles: str) -> dict[str, int]:
    text = worker.log.read_text(errors="replace") if worker.log.exists() else ""
    return {needle: text.count(needle) for needle in needles}


# --- the run -------------------------------------------------------------------------------------


def run(args: argparse.Namespace, stop: ExitStack) -> dict[str, Any]:
    tmp = Path(stop.enter_context(tempfile.TemporaryDirectory(prefix="bench-crash-")))
    if args.keep:
        tmp = Path(args.keep)
        tmp.mkdir(parents=True, exist_ok=True)
    fake_log = tmp / "fake-requests.jsonl"
    fake_log.write_text("")
    r = stop.enter_context(h.flushed_db(args.redis_url))
    fake = stop.enter_context(logging_fake(fake_log))
    site = make_site(tmp, args, fake)
    api = stop.enter_context(api_process(site))
    concurrency = args.n + args.margin
    worker_a = stop.enter_context(stopped_at_exit(start_worker(site, "crash-a", concurrency)))
    engine_load._wait_consumer(api.url, site.token, worker_a)
    print(
        f"fast_fake {fake.base_url}, API {api.url}, worker A pid {worker_a.proc.pid} "
        f"-c {concurrency}, lease {args.lease_seconds:g} s, site {tmp}",
        flush=True,
    )

    prompts = [f"crash recovery {i}" for i in range(args.n)]
    t0 = time.time()
    submitted = asyncio.run(
        engine_load._submit(_stack(site, worker_a, fake, api), engine_load.PERSONA, prompts)
    )
    submit_s = time.time() - t0
    ids = [spawn_id for spawn_id, _, _ in submitted]
    print(f"submitted {args.n} chats in {submit_s:.1f} s", flush=True)

    threshold = args.n - args.n // 50
    at_kill = wait_in_flight(fake, args.n, threshold, args.in_flight_deadline)
    watch = Watch(r, ids)
    statuses_at_kill, leases_at_kill = watch.look()
    a_tokens = {t for t in leases_at_kill.values() if t}
    killed_at, survivors = kill_group(worker_a)
    running_at_kill = sum(1 for s in statuses_at_kill.values() if s == "running")
    print(
        f"SIGKILL worker A at +{killed_at - t0:.1f} s: {at_kill['open_streams']} model streams "
        f"open, {running_at_kill} spawns running, {len(a_tokens)} leases held; "
        f"survivors of its group: {survivors or 'none'}",
        flush=True,
    )

    b_started = time.time() - killed_at
    worker_b = stop.enter_context(stopped_at_exit(start_worker(site, "crash-b", concurrency)))
    recovery, statuses = wait_recovered(watch, fake, killed_at, a_tokens, args.deadline)
    print(
        f"recovery: B holds all left at +{recovery.held_by_b_s} s, all final at "
        f"+{recovery.all_final_s} s after the kill",
        flush=True,
    )
    time.sleep(1.0)  # the fake's log line of the last reply follows its last byte
    checks = check_spawns(r, ids)
    calls = model_calls(read_requests(fake_log), killed_at, args.n * args.turns)
    spawn_of = {conversation_key(p): spawn_id for p, spawn_id in zip(prompts, ids, strict=True)}
    calls["paid_twice_turns"] = [
        (spawn_of.get(key, key), turn, ms) for key, turn, ms in calls["paid_twice_turns"]
    ]
    needles = ("lease lost", "lost its worker; re-enqueuing", "Traceback", "ERROR")
    return {
        "n": args.n,
        "turns": args.turns,
        "delay": args.delay,
        "chunks": args.chunks,
        "lease_seconds": args.lease_seconds,
        "submit_s": submit_s,
        "kill_at_s": killed_at - t0,
        "open_streams_at_kill": at_kill["open_streams"],
        "requests_at_kill": at_kill["requests"],
        "running_at_kill": running_at_kill,
        "final_at_kill": sum(1 for s in statuses_at_kill.values() if s in engine_load.FINAL),
        "survivors_of_a": survivors,
        "b_started_s": b_started,
        "held_by_b_s": recovery.held_by_b_s,
        "all_final_s": recovery.all_final_s,
        "statuses": dict(Counter(statuses.values())),
        "attempts": dict(Counter(c.attempts for c in checks.values())),
        "model": calls,
        "tools": {
            "calls": sum(c.tool_calls for c in checks.values()),
            "run": sum(c.tools_run for c in checks.values()),
            "run_twice": sum(c.tools_run_twice for c in checks.values()),
            "interrupted": sum(c.tools_interrupted for c in checks.values()),
            "without_result": sum(c.calls_without_result for c in checks.values()),
        },
        "events": {
            "sessions_wrong": sum(1 for c in checks.values() if c.events_wrong),
            "seq_gaps": sum(1 for c in checks.values() if c.seq_gap),
            "tile_not_once": sum(1 for c in checks.values() if c.tiles != 1),
            "notification_not_once": sum(1 for c in checks.values() if c.notes != 1),
            "tool_call_dups": sum(c.tool_call_event_dups for c in checks.values()),
            "tool_result_dups": sum(c.tool_result_event_dups for c in checks.values()),
            "tool_call_missing": sum(c.tool_call_events_missing for c in checks.values()),
            "result_mismatch": sum(c.result_mismatch for c in checks.values()),
            "sessions_text_repeated": sum(1 for c in checks.values() if c.text_repeated),
            "sessions_text_missing": sum(1 for c in checks.values() if c.text_missing),
        },
        "anomalies": anomalies(checks),
        "logs": {"A": log_lines(worker_a, *needles), "B": log_lines(worker_b, *needles)},
        "log_tail_b": worker_b.log_tail(20),
        "open_streams_after_kill": recovery.open_streams_after[::10],
    }


def _s(value: float | None) -> str:
    return "not reached" if value is None else f"{value:.1f}"


def table(f: dict[str, Any]) -> str:
    m, t, e = f["model"], f["tools"], f["events"]
    ok = f["statuses"].get("ok", 0)
    rows = [
        (
            "spawns in flight at the kill (open model streams / records running)",
            f"{f['open_streams_at_kill']} / {f['running_at_kill']}",
        ),
        ("worker A processes left after SIGKILL of its group", str(len(f["survivors_of_a"]))),
        ("kill → worker B started, s", f"{f['b_started_s']:.1f}"),
        ("kill → B holds every spawn left, s", _s(f["held_by_b_s"])),
        ("kill → every spawn final, s", _s(f["all_final_s"])),
        ("spawns ok / not ok", f"{ok} / {f['n'] - ok} {f['statuses']}"),
        (
            "tool calls: asked / run / run twice / interrupted / no result",
            f"{t['calls']} / {t['run']} / {t['run_twice']} / {t['interrupted']} / "
            f"{t['without_result']}",
        ),
        ("model requests: made / needed", f"{m['requests']} / {m['needed']}"),
        ("repeats of a turn in flight at the kill", str(m["repeats_in_flight_at_kill"])),
        ("model calls paid twice: reply sent before the kill", str(m["paid_twice_before_kill"])),
        ("model calls paid twice: after the kill (by B)", str(m["paid_twice_after_kill"])),
        (
            "sessions with a seq gap / tile or notification not once",
            f"{e['seq_gaps']} / {e['tile_not_once']} / {e['notification_not_once']}",
        ),
        (
            "tool_call / tool_result events duplicated",
            f"{e['tool_call_dups']} / {e['tool_result_dups']}",
        ),
        ("tool_result events that differ from the transcript", str(e["result_mismatch"])),
        (
            "sessions with repeated text / missing text",
            f"{e['sessions_text_repeated']} / {e['sessions_text_missing']}",
        ),
    ]
    title = f"{f['n']} × {f['turns']} turns × {f['delay']:g} s, SIGKILL at +{f['kill_at_s']:.0f} s"
    lines = [f"| {title} | |", "|---|---:|"]
    lines += [f"| {name} | {value} |" for name, value in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--delay", type=float, default=10.0)
    parser.add_argument("--chunks", type=int, default=4)
    parser.add_argument("--margin", type=int, default=100, help="worker slots beyond n")
    parser.add_argument("--lease-seconds", type=float, default=10.0)
    parser.add_argument(
        "--connector-limit",
        type=int,
        default=None,
        help="the workers' aiohttp connections (AIOHTTP_CONNECTOR_LIMIT); default n + margin, "
        "0: as the worker sets it",
    )
    parser.add_argument("--model", default="openai/gpt-4o-mini")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/8")
    parser.add_argument(
        "--in-flight-deadline",
        type=float,
        default=300.0,
        help="longest wait for the spawns to be in flight before the kill, s",
    )
    parser.add_argument(
        "--deadline",
        type=float,
        default=600.0,
        help="longest wait after the kill for every spawn to be final, s",
    )
    parser.add_argument("--keep", help="keep the site (logs, fake's request log) in this directory")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--serve-fake", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--fake-log", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_fake is not None:
        serve_logging_fake(args.serve_fake, args.fake_log)
        return
    if args.connector_limit is None:
        args.connector_limit = args.n + args.margin
    print("command: " + " ".join([sys.executable, *sys.argv]), flush=True)
    with ExitStack() as stop:
        figures = run(args, stop)
    print(json.dumps({k: v for k, v in figures.items() if k != "log_tail_b"}, indent=1))
    print()
    print(table(figures))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    main()
