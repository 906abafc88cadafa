"""Processes the runtime benchmark starts: the fake model, a counting proxy, Celery workers.

Every helper here is a context manager that stops what it started, so ``bench/runtime.py`` can
stack them in one ``ExitStack`` and leave nothing running, whatever happens.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import redis

from workers.testing.fake_openai import start_subprocess

HERE = Path(__file__).resolve().parent

#: Markers in each bench persona's body; the fake's rules match on them (``where: system``).
FAST, STREAM, SLOW1, SLOW2 = "BENCH-FAST", "BENCH-STREAM", "BENCH-SLOW-ONE", "BENCH-SLOW-TWO"
HOLD = "BENCH-HOLD"
MODEL = "openai/gpt-4o-mini"
STREAM_TEXT = " ".join(f"word{i}" for i in range(120))

_PERSONAS = {
    "bench_fast": FAST,
    "bench_stream": STREAM,
    "bench_slow1": SLOW1,
    "bench_slow2": SLOW2,
    "bench_hold": HOLD,
}


def _persona(name: str, marker: str) -> str:
    return f"""---
name: {name}
description: Benchmark persona {name}.
when_to_use: Only in bench/runtime.py.
tools: [get_edge_summary]
permission_mode: read-only
max_turns: 4
model: {MODEL}
---

# {name}
{marker}: answer briefly.
"""


def rules(slow: float, hold: float) -> list[dict]:
    """The fake model's script: immediate answers, a long streamed one, 1- and 2-turn answers
    after ``slow`` seconds per turn, and a 1-turn answer after ``hold`` seconds."""
    edge = {"tool_calls": [{"name": "get_edge_summary", "arguments": {}}]}
    done = {"content": "All good."}
    return [
        {"match": FAST, "where": "system", "reply": done, "delay": 0},
        {"match": STREAM, "where": "system", "reply": {"content": STREAM_TEXT}, "delay": 0},
        {"match": SLOW1, "where": "system", "reply": done, "delay": slow},
        {"match": SLOW2, "where": "system", "turn": 0, "reply": edge, "delay": slow},
        {"match": SLOW2, "where": "system", "reply": done, "delay": slow},
        {"match": HOLD, "where": "system", "reply": done, "delay": hold},
    ]


def write_site(root: Path, slow: float, hold: float) -> Path:
    """A worker directory: ``agents/`` with the bench personas and ``fake.json``, the script."""
    (root / "agents").mkdir(parents=True, exist_ok=True)
    (root / "marketplace").mkdir(exist_ok=True)
    for name, marker in _PERSONAS.items():
        (root / "agents" / f"{name}.md").write_text(_persona(name, marker))
    script = root / "fake.json"
    script.write_text(json.dumps(rules(slow, hold)))
    return script


def _stop(proc: subprocess.Popen, timeout: float = 20.0, *, signalled: bool = False) -> None:
    """SIGTERM (unless already sent), wait up to ``timeout`` s, then SIGKILL."""
    if proc.poll() is not None:
        return
    if not signalled:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def flushed_db(url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(url)
    client.ping()
    client.flushdb()
    try:
        yield client
    finally:
        client.flushdb()
        client.close()


def _start_nodelay_fake(script: Path) -> tuple[subprocess.Popen, str]:
    """``bench/_fake.py``: the fake with TCP_NODELAY, started like ``start_subprocess`` does."""
    with tempfile.TemporaryDirectory(prefix="bench-fake-") as tmp:
        port_file = Path(tmp) / "port"
        argv = [sys.executable, str(HERE / "_fake.py"), "--host", "127.0.0.1", "--port", "0"]
        proc = subprocess.Popen([*argv, "--port-file", str(port_file), "--script", str(script)])
        deadline = time.monotonic() + 30
        while not port_file.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                _stop(proc)
                raise RuntimeError("bench/_fake.py did not start")
            time.sleep(0.02)
        return proc, f"http://127.0.0.1:{port_file.read_text().strip()}/v1"


@contextmanager
def fake_model(script: Path, *, stock: bool) -> Iterator[tuple[psutil.Process, str]]:
    """The scripted OpenAI-protocol server in its own process: (process, base URL).

    ``stock``: exactly as ``start_subprocess`` runs it; otherwise with TCP_NODELAY (``_fake.py``).
    """
    proc, base_url = start_subprocess(script, delay=0.0) if stock else _start_nodelay_fake(script)
    try:
        yield psutil.Process(proc.pid), base_url
    finally:
        _stop(proc)


def response_gap(base_url: str, marker: str, tries: int = 7) -> float:
    """Median seconds between a streamed reply's response headers and its first body bytes.

    Near zero when the server sends without delay; ~40 ms when Nagle holds the body back.
    """
    host, port = base_url.split("//", 1)[1].split("/", 1)[0].split(":")
    body = json.dumps(
        {"model": "m", "stream": True, "messages": [{"role": "system", "content": marker}]}
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json"
        f"\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode()
    gaps = []
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        for _ in range(tries):
            sock.sendall(head + body)
            data, first_at, headers_at = b"", None, None
            while not data.endswith(b"0\r\n\r\n"):
                data += sock.recv(65536)
                now = time.perf_counter()
                if headers_at is None and b"\r\n\r\n" in data:
                    headers_at = now
                if first_at is None and len(data) > data.find(b"\r\n\r\n") + 4 > 3:
                    first_at = now
            gaps.append(first_at - headers_at)
    return sorted(gaps)[len(gaps) // 2]


class Proxy:
    """Client of ``bench/_proxy.py``'s control port."""

    def __init__(self, proc: subprocess.Popen, port: int, control_port: int) -> None:
        self.proc, self.port, self.control_port = proc, port, control_port
        self.base_url = f"http://127.0.0.1:{port}/v1"

    def _ask(self, command: str) -> dict:
        with socket.create_connection(("127.0.0.1", self.control_port), timeout=10) as sock:
            sock.sendall(command.encode() + b"\n")
            data = b""
            while chunk := sock.recv(1 << 20):
                data += chunk
        return json.loads(data)

    def reset(self) -> None:
        self._ask("reset")

    def stats(self) -> dict:
        return self._ask("stats")


@contextmanager
def counting_proxy(upstream_url: str) -> Iterator[Proxy]:
    upstream_port = int(upstream_url.rsplit(":", 1)[1].split("/")[0])
    with tempfile.TemporaryDirectory(prefix="bench-proxy-") as tmp:
        port_file = Path(tmp) / "ports"
        argv = [sys.executable, str(HERE / "_proxy.py"), "--upstream-port", str(upstream_port)]
        proc = subprocess.Popen([*argv, "--port-file", str(port_file)])
        try:
            deadline = time.monotonic() + 20
            while not port_file.exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("bench proxy did not start")
                time.sleep(0.02)
            port, control = (int(p) for p in port_file.read_text().split())
            yield Proxy(proc, port, control)
        finally:
            _stop(proc)


def worker_env(redis_url: str, model_base: str, site: Path) -> dict[str, str]:
    """The environment of a bench worker: nothing of the caller's Ongrid/OpenAI settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ONGRID_", "OPENAI_", "ANTHROPIC_", "LITELLM_")) and k != "REDIS_URL"
    }
    env.update(
        REDIS_URL=redis_url,
        ONGRID_DEFAULT_PROVIDER="openai",
        OPENAI_API_BASE=model_base,
        OPENAI_API_KEY="sk-test",
        ONGRID_MARKETPLACE_ROOT=str(site / "marketplace"),
    )
    return env


class Worker:
    def __init__(self, proc: subprocess.Popen, name: str, concurrency: int, log: Path) -> None:
        self.proc, self.name, self.concurrency, self.log = proc, name, concurrency, log
        self.ps = psutil.Process(proc.pid)

    def cpu_seconds(self) -> float:
        """User + system CPU of the worker process and any children it has."""
        total = 0.0
        for p in [self.ps, *self.ps.children(recursive=True)]:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.NoSuchProcess:
                pass
        return total

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


@contextmanager
def workers(
    app, site: Path, env: dict[str, str], names_concurrency: list[tuple[str, int]]
) -> Iterator[list[Worker]]:
    """Start ``python -m coordinator worker`` processes (cwd ``site``); wait until all answer."""
    started: list[Worker] = []
    try:
        for name, concurrency in names_concurrency:
            log = site / f"{name}.log"
            argv = [sys.executable, "-m", "coordinator", "worker", "-c", str(concurrency)]
            argv += ["--queues", "ongrid.interactive", "--name", name, "--loglevel", "WARNING"]
            with log.open("wb") as out:
                proc = subprocess.Popen(argv, cwd=site, env=env, stdout=out, stderr=out)
            started.append(Worker(proc, name, concurrency, log))
        _wait_ready(app, started)
        yield started
    finally:
        for w in started:  # all at once: their warm shutdowns overlap
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGTERM)
        for w in started:
            _stop(w.proc, signalled=True)


def _wait_ready(app, started: list[Worker], timeout: float = 60.0) -> None:
    wanted = {f"{w.name}@{socket.gethostname()}" for w in started}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for w in started:
            if w.proc.poll() is not None:
                raise RuntimeError(f"worker {w.name} exited:\n{w.log_tail()}")
        answered = {name for reply in app.control.ping(timeout=0.5) for name in reply}
        if wanted <= answered:
            return
    raise RuntimeError(f"workers {sorted(wanted)} did not answer a control ping in {timeout}s")


def redis_cpu_seconds(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine spent not idle (all cores)."""
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def wait_quiet(max_wait: float = 10.0, threshold: float = 0.2, window: float = 0.5) -> float:
    """Wait (up to ``max_wait`` s) until the machine is under ``threshold`` busy over ``window``
    s; returns the last busy fraction seen (0–1, all cores). Other jobs on a shared machine
    otherwise take the cores the benchmark measures."""
    deadline = time.monotonic() + max_wait
    while True:
        before = machine_busy_seconds()
        time.sleep(window)
        busy = (machine_busy_seconds() - before) / (window * (psutil.cpu_count() or 1))
        if busy < threshold or time.monotonic() > deadline:
            return busy
