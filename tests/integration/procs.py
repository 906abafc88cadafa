"""Processes the worker-entry and consumer tests start by their own command line: raw Celery
workers, a plain ``ongrid worker`` (with its coordinator child), the API, the CLI.

Each runs in its own process group and logs to a file; helpers poll with a generous deadline.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import httpx
import redis
from harness import START_TIMEOUT, Proc, wait_for

from workers.consumers import live_consumers

ALL_QUEUES = ("ongrid.interactive", "ongrid.background", "ongrid.coordinator")


def ongrid(*args: str) -> list[str]:
    return [sys.executable, "-m", "coordinator", *args]


def raw_celery(queues: str, hostname: str) -> list[str]:
    """The documented raw command: ``celery -A workers.app worker``."""
    return [
        sys.executable, "-m", "celery", "-A", "workers.app", "worker", "--pool=threads",
        "-Q", queues, "-c", "8", f"--hostname={hostname}@%h", "--loglevel=INFO",
        "--without-gossip", "--without-mingle",
    ]  # fmt: skip


def consumers_of(client: redis.Redis, queue: str) -> list[str]:
    return live_consumers(client, [queue])[queue]


def wait_consumers(
    client: redis.Redis, queues: tuple[str, ...], proc: Proc, timeout: float = START_TIMEOUT
) -> dict[str, list[str]]:
    """Wait until every queue of ``queues`` has a live consumer; fail early if ``proc`` exits."""

    def served() -> dict[str, list[str]] | None:
        assert proc.alive(), f"{proc.name} exited ({proc.proc.returncode}):\n{proc.log()}"
        found = live_consumers(client, queues)
        return found if all(found.values()) else None

    return wait_for(served, timeout, f"consumers of {', '.join(queues)}", every=0.1)


def api_client(proc: Proc, port: int, token: str, timeout: float) -> httpx.Client:
    """A client of the API ``proc`` serves on ``port``, once it answers ``/healthz``; fails
    early, with its log, if ``proc`` exits first."""
    client = httpx.Client(
        base_url=f"http://127.0.0.1:{port}",
        headers={"Authorization": f"Bearer {token}"},
        timeout=timeout,
    )

    def answers() -> bool:
        assert proc.alive(), proc.log()
        try:
            return client.get("/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(answers, timeout, "the API to answer", every=0.2)
    return client


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"
