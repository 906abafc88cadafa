"""Data shared by the marketplace modules: the bundle error, the limits, an MCP server's config."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from registry.errors import UserError

__all__ = [
    "MAX_BUNDLE_BYTES",
    "MAX_BUNDLE_FILES",
    "MAX_FILE_BYTES",
    "MAX_JSON_BYTES",
    "BundleError",
    "McpServerConfig",
]

#: A bundle file larger than this is refused (a persona, a skill or a script is never this big).
MAX_FILE_BYTES = 10 * 1024 * 1024
#: A plugin whose files add up to more than this is refused.
MAX_BUNDLE_BYTES = 64 * 1024 * 1024
#: A plugin with more files than this is refused.
MAX_BUNDLE_FILES = 5000
#: marketplace.json, plugin.json and .mcp.json are read only up to this size.
MAX_JSON_BYTES = 1024 * 1024


class BundleError(UserError):
    """A marketplace or plugin that cannot be used: names where and what is wrong."""

    def __init__(self, where: str, reason: str) -> None:
        self.where = where
        self.reason = reason
        super().__init__(f"{where}: {reason}" if where else reason)


@dataclass(frozen=True)
class McpServerConfig:
    """One MCP server as ``.mcp.json`` (or the config file's ``mcp_servers``) declares it.

    Values are kept as written: ``${VAR}`` and ``${VAR:-default}`` are expanded when the server
    is started, against the worker's environment and ``CLAUDE_PLUGIN_ROOT``.
    """

    #: Unique in a process: ``<plugin>__<server>`` for a plugin's, ``<server>`` for the config's.
    key: str
    transport: Literal["stdio", "http"]
    command: str = ""
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str = ""
    url: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    #: The plugin's installed directory (``CLAUDE_PLUGIN_ROOT``); empty for the config's.
    plugin_root: str = ""
    #: Which plugin declared it; empty for the config file's servers.
    plugin: str = ""
    #: Run confined (a stdio server of a plugin): the worker's sandbox, with its own PID, mount
    #: and network namespaces, a read-only view and none of the worker's files.
    sandboxed: bool = False
    #: The install granted the plugin the network (through the worker's egress proxy, which
    #: never reaches the runtime's own services).
    network: bool = False
    #: The install granted the plugin a writable directory of its own (``CLAUDE_PLUGIN_DATA``).
    writable: bool = False
    #: The highest class a tool of the server may have (``read``, ``write``, ``destructive``):
    #: a plugin's is its install's allowed mode; a tool above it is left out.
    max_tool_class: str = "destructive"
