"""Worker processes forked from a Python that has already imported what they import.

A worker's start is mostly imports: litellm alone costs about 7 s of CPU (its ~2,500 pydantic
models), and the suite starts well over a hundred workers on a machine of two cores. The zygote
is one process per test process that imports those libraries once (``workers._litellm.load()``,
Celery, SQLAlchemy, the worker's own modules: :data:`PRELOAD`) and then only forks. Each fork
becomes exactly the command it was asked for, ``python -m <module> <args>``: its own session
(so ``killpg`` stops it and its children), working directory, environment, ``sys.path`` (the
working directory, then ``PYTHONPATH``), argv, stdin from ``/dev/null`` and output to the log
file, no other inherited descriptor, and it exits through the interpreter's normal shutdown.

What a fork cannot reproduce is the process image: ``/proc/<pid>/environ`` and ``cmdline`` are
the zygote's. Tests about those (the secret canaries) start their workers with a real exec;
:func:`can_fork` refuses an environment whose interpreter settings (``PYTHON*`` variables other
than ``PYTHONPATH`` and ``PYTHONUNBUFFERED``) differ from the zygote's, and the caller execs.

The protocol is one Unix-socket connection per process: the client sends the request as one
JSON line, the zygote answers ``{"pid": …}`` once it forked and ``{"returncode": …}`` once it
reaped the process, then closes. :class:`Forked` is the client's :class:`subprocess.Popen`-like
handle on it.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import io
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

__all__ = ["Forked", "can_fork", "reaped_cpu", "run", "spawn"]

#: What the zygote imports before it forks: the libraries a worker process loads and the
#: project modules that only define things (none reads the environment at import).
PRELOAD = (
    "celery.apps.worker",
    "celery.worker",
    "sqlalchemy",
    "alembic.command",
    "coordinator.cli",
    "coordinator.worker",
    "coordinator.api.app",
)
#: Interpreter variables a fork honours itself; any other ``PYTHON*`` difference means exec.
_HANDLED = frozenset({"PYTHONPATH", "PYTHONUNBUFFERED"})
_START_TIMEOUT = 120.0
_REAP_EVERY = 0.1
_PR_SET_PDEATHSIG = 1


# -- the zygote (run as a script) ---------------------------------------------------------------


class _Become(Exception):
    """Raised in a fresh fork to leave the zygote's loop before it runs the command."""

    def __init__(self, request: dict[str, Any]) -> None:
        super().__init__()
        self.request = request


def _serve(path: str, base_path: list[str], litellm_env: dict[str, str]) -> NoReturn:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    waiting: dict[int, socket.socket] = {}  # pid → the connection told when it exits
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    while True:
        for _key, _ in selector.select(_REAP_EVERY):
            conn, _ = listener.accept()
            with conn.makefile("rb") as reader:
                line = reader.readline()
            if not line:
                conn.close()
                continue
            request = json.loads(line)
            request["base_path"] = base_path
            request["litellm_env"] = litellm_env
            pid = os.fork()
            if pid == 0:
                selector.close()
                listener.close()
                conn.close()
                for other in waiting.values():
                    other.close()
                raise _Become(request)
            waiting[pid] = conn
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        while waiting:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = waiting.pop(pid, None)
            if conn is not None:
                code = os.waitstatus_to_exitcode(status)
                # The process's CPU, which the test process cannot see as its child's.
                cpu = usage.ru_utime + usage.ru_stime
                with contextlib.suppress(OSError):
                    conn.sendall(json.dumps({"returncode": code, "cpu_s": cpu}).encode() + b"\n")
                conn.close()


def _stdio(stdout: str, stderr: str, unbuffered: bool) -> None:
    """Point fds 0-2 and ``sys.std*`` where ``Popen(stdin=DEVNULL, stdout=…, stderr=…)`` would
    (the same path twice: ``stderr=STDOUT``)."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, path in ((1, stdout), (2, stderr)):
        if fd == 2 and path == stdout:
            os.dup2(1, 2)
            continue
        out = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(out, fd)
        os.close(out)
    encoding = sys.stdout.encoding if sys.stdout is not None else "utf-8"
    streams = []
    for fd, errors in ((1, "strict"), (2, "backslashreplace")):
        raw = io.FileIO(fd, "w", closefd=False)
        buffer: Any = raw if unbuffered else io.BufferedWriter(raw)
        streams.append(
            io.TextIOWrapper(buffer, encoding=encoding, errors=errors, write_through=unbuffered)
        )
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = sys.__stdout__ = streams[0]
    sys.stderr = sys.__stderr__ = streams[1]


def _become(request: dict[str, Any]) -> None:
    """In the fork: turn into ``python -m <module> <args>`` and run it as ``__main__``."""
    import runpy

    os.setsid()
    env: dict[str, str] = request["env"]
    for key, value in request["litellm_env"].items():
        env.setdefault(key, value)  # what load() set before the import it already did
    _stdio(request["stdout"], request["stderr"], bool(env.get("PYTHONUNBUFFERED")))
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(env)
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.getcwd(), *extra, *request["base_path"]]
    sys.argv = ["-m", *request["args"]]
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)


def _zygote_main(path: str) -> None:
    # Die with the test process that started this one; its forks have sessions of their own.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    base_path = sys.path[1:]  # without this script's directory, as `python -m` would have
    sys.path[:] = base_path
    before = dict(os.environ)
    from workers import _litellm

    _litellm.load()
    litellm_env = {k: v for k, v in os.environ.items() if before.get(k) != v}
    for module in PRELOAD:
        __import__(module)
    try:
        _serve(path, base_path, litellm_env)
    except _Become as child:
        request = child.request  # out of the handler: the command's errors chain to nothing
    _become(request)


# -- the client (imported by the harnesses) ----------------------------------------------------


class _Zygote:
    """This test process's zygote, started on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir = Path()
        self.path = ""
        self.env: dict[str, str] = {}

    def started(self) -> str:
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._start()
            return self.path

    def _start(self) -> None:
        if not self.path:
            self._dir = Path(tempfile.mkdtemp(prefix="ongrid-zygote-"))
            self.path = str(self._dir / "socket")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        # The environment every harness gives its workers, less what differs per test.
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("ONGRID_", "OPENAI_", "ANTHROPIC_", "REDIS_", "LITELLM_"))
            and not k.startswith(("CELERY", "FAKE_", "PYTHONPATH", "PYTEST_"))
        }
        log = open(self._dir / "zygote.log", "wb")  # noqa: SIM115 - the child holds it
        self._proc = subprocess.Popen(
            [sys.executable, __file__, self.path],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        assert self._proc.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self._proc.stdout, selectors.EVENT_READ)
            ready = selector.select(_START_TIMEOUT)
        line = self._proc.stdout.readline() if ready else b""
        self._proc.stdout.close()
        if line.strip() != b"ready":
            self._proc.kill()
            self._proc.wait()
            log_text = (self._dir / "zygote.log").read_text(errors="replace")
            raise RuntimeError(
                f"the worker zygote did not start within {_START_TIMEOUT:.0f} s: {log_text}"
            )
        atexit.register(self._stop)

    def _stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        shutil.rmtree(self._dir, ignore_errors=True)


_zygote = _Zygote()
_reaped_cpu = 0.0


def reaped_cpu() -> float:
    """CPU seconds of the forks this process has seen exit (its zygote reaped them)."""
    return _reaped_cpu


def can_fork(env: dict[str, str]) -> bool:
    """Whether a fork would run under the interpreter settings ``env`` asks for."""
    _zygote.started()
    mine = {k: v for k, v in _zygote.env.items() if k.startswith("PYTHON") and k not in _HANDLED}
    theirs = {k: v for k, v in env.items() if k.startswith("PYTHON") and k not in _HANDLED}
    return mine == theirs


class Forked:
    """A :class:`subprocess.Popen`-like handle on a process the zygote forked."""

    def __init__(self, args: list[str], sock: socket.socket, pid: int) -> None:
        self.args = args
        self.pid = pid
        self.returncode: int | None = None
        self._sock = sock
        self._pending = b""

    def _read(self, timeout: float | None) -> None:
        self._sock.settimeout(timeout)
        try:
            chunk = self._sock.recv(4096)
        except (TimeoutError, BlockingIOError):
            return
        if not chunk:
            raise RuntimeError(f"the worker zygote went away before process {self.pid} exited")
        self._pending += chunk
        if self._pending.endswith(b"\n"):
            global _reaped_cpu
            ended = json.loads(self._pending)
            _reaped_cpu += float(ended["cpu_s"])
            self.returncode = int(ended["returncode"])
            self._sock.close()

    def poll(self) -> int | None:
        if self.returncode is None:
            self._read(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self._read(left)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def spawn(
    argv: list[str], cwd: Path, env: dict[str, str], log_path: Path, stderr: Path | None = None
) -> Forked:
    """Start ``argv`` (``[sys.executable, "-m", module, *args]``) as a fork of the zygote, its
    output appended to ``log_path`` (its standard error too, unless ``stderr`` names a file)."""
    if argv[:2] != [sys.executable, "-m"]:
        raise ValueError(f"the zygote runs `python -m …` commands only, not {argv}")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(_START_TIMEOUT)
    sock.connect(_zygote.started())
    request = {
        "module": argv[2],
        "args": argv[3:],
        "cwd": str(cwd),
        "env": env,
        "stdout": str(log_path),
        "stderr": str(stderr or log_path),
    }
    sock.sendall(json.dumps(request).encode() + b"\n")
    answer = b""
    while not answer.endswith(b"\n"):
        chunk = sock.recv(4096)
        if not chunk:
            raise RuntimeError("the worker zygote closed the connection before it forked")
        answer += chunk
    first, _, rest = answer.partition(b"\n")
    forked = Forked(argv, sock, int(json.loads(first)["pid"]))
    forked._pending = rest
    return forked


def run(
    argv: list[str], cwd: Path, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv, cwd=…, env=…, capture_output=True, text=True, timeout=…)`` for a
    ``python -m …`` command, forked from the zygote when ``env`` allows it."""
    if not can_fork(env):
        return subprocess.run(
            argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
        )
    with tempfile.TemporaryDirectory(prefix="ongrid-run-") as scratch:
        out, err = Path(scratch, "stdout"), Path(scratch, "stderr")
        forked = spawn(argv, cwd, env, out, stderr=err)
        try:
            code = forked.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(forked.pid, signal.SIGKILL)
            forked.wait(30)
            raise
        return subprocess.CompletedProcess(
            argv, code, out.read_text(errors="replace"), err.read_text(errors="replace")
        )


if __name__ == "__main__":
    _zygote_main(sys.argv[1])
