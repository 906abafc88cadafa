"""Processes a test starts and the polling it waits with, shared by the integration and the
multi-host harnesses (``tests/integration/harness.py``, ``tests/multihost/services.py``).

Nothing here waits on the wall clock: :func:`wait_for` polls a condition until a generous
deadline.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import zygote

__all__ = ["Proc", "wait_for"]

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float, what: str, every: float = 0.05) -> T:
    """Poll ``predicate`` until it returns something truthy; fail naming ``what`` at deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


class Proc:
    """One process of the test, in its own process group, its output in ``logs/<name>-….log``
    under ``cwd``.

    ``forked``: a ``python -m …`` command is forked from this test process's zygote
    (:mod:`zygote`), which has already imported what a worker imports, instead of exec'd; it
    falls back to exec when the environment asks for interpreter settings a fork cannot take.
    """

    def __init__(
        self, name: str, argv: list[str], cwd: Path, env: dict[str, str], *, forked: bool = False
    ) -> None:
        self.name = name
        self.log_path = cwd / "logs" / f"{name}-{time.monotonic_ns()}.log"
        self.log_path.parent.mkdir(exist_ok=True)
        self.proc: subprocess.Popen[bytes] | zygote.Forked
        if forked and zygote.can_fork(env):
            self.log_path.touch()
            self.proc = zygote.spawn(argv, cwd, env, self.log_path)
            return
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def assert_alive(self) -> None:
        """Fail, with the log, if the process has exited."""
        if not self.alive():
            raise AssertionError(
                f"{self.name} exited ({self.proc.returncode}):\n{self.log()[-4000:]}"
            )

    def kill(self) -> None:
        """SIGKILL the whole process group (children included, even once the leader is gone):
        no shutdown, no acks, leases left to expire."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self, timeout: float = 60.0) -> None:
        """Warm shutdown (SIGTERM), as an orchestrator stops a process; SIGKILL if it hangs."""
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
