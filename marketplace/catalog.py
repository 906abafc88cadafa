"""The tool catalog of one spawn: the process's code tools plus what the installed bundles add.

Code tools are registered once at start-up (a new one needs a restart); the skill tools, the
tools of skill manifests and those of MCP servers come from the registry snapshot the spawn runs
with and from the process's MCP hub, so a reload adds or removes them with no restart.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from marketplace.skills import SKILL_TOOLS
from registry.tools import BaseTool, ToolCatalog

__all__ = ["spawn_catalog"]

log = logging.getLogger(__name__)


def spawn_catalog(
    base: ToolCatalog, bundle: object | None = None, mcp_tools: Iterable[BaseTool] = ()
) -> ToolCatalog:
    """``base`` (the code tools), the skill tools, ``bundle``'s manifest tools (a
    :class:`marketplace.layer.Bundles`), then ``mcp_tools``. A later tool whose name is taken
    is left out (the layer already warned about manifest duplicates)."""
    tools: list[BaseTool] = list(base)
    seen = {t.name for t in tools}
    extra = [*SKILL_TOOLS, *getattr(bundle, "tools", ()), *mcp_tools]
    for tool in extra:
        if tool.name in seen:
            if tool not in SKILL_TOOLS:
                log.warning("tool %r is defined twice; the bundle's is left out", tool.name)
            continue
        seen.add(tool.name)
        tools.append(tool)
    return ToolCatalog(tools)
