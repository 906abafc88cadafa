"""Misbehaving processes for the staged incidents: a short Python program under a name of its
own, in a session of its own, killed with its parent (``PR_SET_PDEATHSIG``) and, if it still
runs Python code, gone by a deadline whatever happens to the test."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap

__all__ = ["start_named", "stop"]

#: Every staged process exits by itself after this long, so none outlives a stuck run.
LIFETIME_SECONDS = 300

_PRELUDE = """\
import ctypes, os, signal, sys, threading, time
_libc = ctypes.CDLL(None, use_errno=True)
_libc.prctl(15, {name!r}.encode(), 0, 0, 0)           # PR_SET_NAME: what ps and psutil show
_libc.prctl(1, signal.SIGKILL, 0, 0, 0)               # PR_SET_PDEATHSIG: die with the test
threading.Timer({lifetime}, lambda: os._exit(0)).start()
"""


def start_named(name: str, program: str) -> subprocess.Popen[bytes]:
    """Run ``program`` (Python source) as a process named ``name`` (at most 15 characters)."""
    if len(name) > 15:
        raise ValueError(f"process name {name!r} is longer than the kernel's 15 characters")
    source = _PRELUDE.format(name=name, lifetime=LIFETIME_SECONDS) + textwrap.dedent(program)
    return subprocess.Popen(
        [sys.executable, "-c", source], stdin=subprocess.DEVNULL, start_new_session=True
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process and reap it."""
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    proc.wait(timeout=30)
