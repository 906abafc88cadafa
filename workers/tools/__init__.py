"""The standard tool catalog: host, shell, observability, ClickHouse, topology, knowledge, repo.

Each family lives in its own module and exports a ``TOOLS`` tuple; :func:`default_catalog` gathers
them. The AgentTool (``spawn_agent``) is not here: the coordinator adds it to its own catalog.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable

from registry.errors import UserError
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

__all__ = ["STANDARD_TOOLS", "default_catalog", "load_tool_modules"]

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


def load_tool_modules(modules: Iterable[str]) -> list[BaseTool]:
    """The ``TOOLS`` of each named module: how a site adds its own BaseTools (code + restart)."""
    found: list[BaseTool] = []
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise UserError(f"tool_modules: cannot import {name!r}: {exc}") from None
        tools = getattr(module, "TOOLS", None)
        if not isinstance(tools, list | tuple) or not all(isinstance(t, BaseTool) for t in tools):
            raise UserError(f"tool_modules: {name!r} must define TOOLS, a sequence of BaseTool")
        found.extend(tools)
    return found


def default_catalog(tool_modules: Iterable[str] = ()) -> ToolCatalog:
    """A new catalog: every standard tool, then those of ``tool_modules`` (settings).

    Tools are stateless, so catalogs share them.
    """
    return ToolCatalog([*STANDARD_TOOLS, *load_tool_modules(tool_modules)])
