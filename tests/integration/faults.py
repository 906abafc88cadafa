"""Fault injection for the integration tests: park a worker at a chosen point, release held calls.

Loaded into a worker as a tool module (``ONGRID_TOOL_MODULES=site_tools,faults``) with
``ONGRID_TEST_STALL_DIR`` naming a directory, this module parks the first attempt of each spawn
right after the worker claimed it and before the runtime prepares it (pins the persona, builds
the opening messages, writes the first checkpoint): it creates ``<dir>/<spawn_id>`` holding the
worker's pid, then waits, so that a test can kill that worker at exactly that point. Attempts
that find the file already there pass straight through. Without the variable it changes nothing.

:func:`release` is the test side: it lets the fake LLM answer the requests a ``hold`` rule keeps
waiting.
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from registry.tools import BaseTool

if TYPE_CHECKING:  # the worker processes that load this module need none of the harness
    from harness import FakeLLM

#: How long a parked attempt waits for the test to kill its worker before it goes on.
STALL_SECONDS = 120.0

TOOLS: list[BaseTool] = []


def release(fake: FakeLLM, hold: str) -> None:
    """Answer the requests held by the fake's rules with ``hold`` (and let later ones pass)."""
    request = urllib.request.Request(
        f"{fake.base_url.removesuffix('/v1')}/_release",
        data=json.dumps({"hold": hold}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        response.read()


def _park_first_attempts(stall_dir: Path) -> None:
    from workers.runtime import WorkerRuntime

    prepare = WorkerRuntime._prepare

    async def parked(self: WorkerRuntime, record: Any, token: str, sink: Any) -> Any:
        marker = stall_dir / record.spawn_id
        partial = stall_dir / f".{record.spawn_id}.{os.getpid()}"
        partial.write_text(str(os.getpid()), encoding="utf-8")
        try:
            os.link(partial, marker)  # atomic, and only one attempt ever wins
        except FileExistsError:
            return await prepare(self, record, token, sink)
        finally:
            partial.unlink()
        await asyncio.sleep(STALL_SECONDS)  # the test kills this worker meanwhile
        return await prepare(self, record, token, sink)

    WorkerRuntime._prepare = parked  # type: ignore[method-assign]


if os.environ.get("ONGRID_TEST_STALL_DIR"):
    _park_first_attempts(Path(os.environ["ONGRID_TEST_STALL_DIR"]))
