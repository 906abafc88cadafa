"""The tool the multi-host tests load into their workers (``ONGRID_TOOL_MODULES=mh_tools``).

``mark_step`` appends ``<unix time> <pid> <mark>`` to the file ``ONGRID_TEST_MARKS`` names, in
the host's own directory: when each tool call of a spawn ran, and on which host.
"""

from __future__ import annotations

import os
import time

from registry.tools import ToolClass, function_tool


@function_tool(ToolClass.READ)
def mark_step(mark: str) -> str:
    """Record a step of the investigation (test tool)."""
    with open(os.environ["ONGRID_TEST_MARKS"], "a", encoding="utf-8") as out:
        out.write(f"{time.time():.6f} {os.getpid()} {mark}\n")
        out.flush()
        os.fsync(out.fileno())
    return f"step {mark} recorded"


TOOLS = [mark_step]
