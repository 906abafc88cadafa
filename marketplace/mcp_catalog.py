"""What the workers' MCP servers offer, for the processes that run none (the API).

A worker writes the tools each of its MCP servers listed to Redis, one key per server, whenever
the list changes (and at least once a day: the keys expire after :data:`TTL`). The API reads the
keys of the servers its registry snapshot names and lists their tools (``GET /api/v1/skills``,
the bag views, the lint) as :class:`DescribedTool` objects, which describe a tool and cannot run
it: only workers call MCP servers.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable, Mapping
from typing import Any, cast

import redis
from pydantic import BaseModel, ConfigDict

from registry.tools import BaseTool, ToolClass, ToolContext, ToolResult

__all__ = ["TTL", "DescribedTool", "McpToolPublisher", "described_mcp_tools", "key_of"]

log = logging.getLogger(__name__)

#: How long a server's tool list stays in Redis without being written again.
TTL = 24 * 3600


def key_of(server: str, prefix: str = "ongrid:") -> str:
    return f"{prefix}mcp:tools:{server}"


class _AnyArguments(BaseModel):
    model_config = ConfigDict(extra="allow")


class DescribedTool(BaseTool):
    """An MCP tool as a worker described it: its name, text, class and schema, nothing to run."""

    args_model = _AnyArguments

    def __init__(self, data: Mapping[str, Any]) -> None:
        self.name = str(data["name"])
        self.description = str(data.get("description") or self.name)
        self.tool_class = ToolClass(str(data.get("class") or "write"))
        self.bundle = str(data.get("bundle") or "config")
        self._schema = dict(data.get("parameters") or {"type": "object", "properties": {}})

    @property
    def parameters(self) -> dict[str, Any]:
        return dict(self._schema)

    def run(self, arguments: BaseModel, context: ToolContext) -> ToolResult:
        return ToolResult(f"{self.name} runs on the workers, which run its MCP server", True)


class McpToolPublisher:
    """A worker's writer of its MCP servers' tool lists (see the module docstring)."""

    def __init__(self, client: redis.Redis, prefix: str = "ongrid:") -> None:
        self.client = client
        self.prefix = prefix
        self._written: dict[str, str] = {}
        self._lock = threading.Lock()  # spawns and the reload's report publish at once

    def publish(self, tools: Iterable[BaseTool]) -> None:
        """Write each server's list if it changed since this process last wrote it. A Redis
        that does not answer is logged and left for the next call: a spawn never waits on it."""
        by_server: dict[str, list[dict[str, Any]]] = {}
        for tool in tools:
            server = getattr(tool, "server_key", None)
            if server:
                by_server.setdefault(server, []).append(tool.describe())
        for server, described in by_server.items():
            payload = json.dumps(sorted(described, key=lambda d: d["name"]), sort_keys=True)
            with self._lock:
                if self._written.get(server) == payload:
                    continue
                try:
                    self.client.set(key_of(server, self.prefix), payload, ex=TTL)
                except redis.RedisError as exc:
                    log.warning("MCP tools of %s not published: Redis: %s", server, exc)
                    continue
                self._written[server] = payload


def described_mcp_tools(
    client: redis.Redis, servers: Iterable[str], prefix: str = "ongrid:"
) -> list[BaseTool]:
    """The tools the workers last reported for ``servers``; none for a server no worker has
    reported (yet), and none at all when Redis does not answer."""
    names = sorted(servers)
    if not names:
        return []
    try:
        found = cast(list[Any], client.mget([key_of(name, prefix) for name in names]))
    except redis.RedisError as exc:
        log.debug("MCP tools unknown: Redis: %s", exc)
        return []
    tools: list[BaseTool] = []
    for raw in found:
        if not raw:
            continue
        try:
            tools.extend(DescribedTool(item) for item in json.loads(raw))
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("an unreadable MCP tool list in Redis was left out: %s", exc)
    return tools
