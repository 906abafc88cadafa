"""Site tools the integration tests load into their workers (``ONGRID_TOOL_MODULES=site_tools``).

Each tool appends a line ``<tool name> <worker pid>`` to the file named by
``ONGRID_TEST_COUNT_FILE`` before it does anything else, so a test counts executions across worker
processes (including one that kills its worker) and knows which worker ran each call.
"""

from __future__ import annotations

import os
import signal
import time

from registry.tools import ToolClass, function_tool


def _count(name: str) -> None:
    with open(os.environ["ONGRID_TEST_COUNT_FILE"], "a", encoding="utf-8") as out:
        out.write(f"{name} {os.getpid()}\n")
        out.flush()
        os.fsync(out.fileno())


@function_tool(ToolClass.READ)
def count_probe(target: str = "") -> str:
    """Probe a target (test tool: records that it ran)."""
    _count("count_probe")
    return f"probed {target or 'nothing'}: healthy"


@function_tool(ToolClass.WRITE)
def restart_thing(thing: str = "") -> str:
    """Restart a thing (test tool: records that it ran)."""
    _count("restart_thing")
    return f"restarted {thing or 'the thing'}"


@function_tool(ToolClass.DESTRUCTIVE)
def wipe_thing(thing: str = "") -> str:
    """Wipe a thing (test tool: records that it ran)."""
    _count("wipe_thing")
    return f"wiped {thing or 'the thing'}"


@function_tool(ToolClass.READ)
def wait_gate(path: str) -> str:
    """Wait until the file ``path`` exists (test tool: lets a test act while a spawn is mid-run)."""
    _count("wait_gate")
    deadline = time.monotonic() + 120
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return f"gate {path} never opened"
        time.sleep(0.05)
    return f"gate {path} open"


@function_tool(ToolClass.READ)
def crash_worker() -> str:
    """Kill the worker process running this call (test tool: a poison call)."""
    _count("crash_worker")
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


TOOLS = [count_probe, restart_thing, wipe_thing, wait_gate, crash_worker]
