"""The standard tool catalog: host, shell, observability, ClickHouse, topology, knowledge, repo.

Each family lives in its own module and exports a ``TOOLS`` tuple; :func:`default_catalog` gathers
them. The AgentTool (``spawn_agent``) is not here: the coordinator adds it to its own catalog.
"""

from __future__ import annotations

from registry.tools import BaseTool, ToolCatalog
from workers.tools import (
    _clickhouse,
    _host,
    _knowledge,
    _observability,
    _repo,
    _shell,
    _topology,
)

__all__ = ["STANDARD_TOOLS", "default_catalog"]

#: Every standard tool, in the order a catalog lists them.
STANDARD_TOOLS: tuple[BaseTool, ...] = (
    *_host.TOOLS,
    *_shell.TOOLS,
    *_observability.TOOLS,
    *_clickhouse.TOOLS,
    *_topology.TOOLS,
    *_knowledge.TOOLS,
    *_repo.TOOLS,
)


def default_catalog() -> ToolCatalog:
    """A new catalog holding every standard tool. Tools are stateless, so catalogs share them."""
    return ToolCatalog(STANDARD_TOOLS)
