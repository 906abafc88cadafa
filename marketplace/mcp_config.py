"""``.mcp.json`` as Claude Code writes it: which MCP servers a plugin (or the config file) declares.

Parsing keeps every value as written; ``${VAR}`` and ``${VAR:-default}`` are expanded by
:func:`expand` when a server is started (:mod:`marketplace.mcp`), so a token set in a worker's
environment never ends up in the database or the installed copy. One bad server is a problem
listed next to the good ones, never a reason to drop the whole file: a plugin with a broken
``sse`` entry still gets its working stdio server.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from typing import Any

from marketplace.model import McpServerConfig
from registry.errors import UserError

__all__ = [
    "MAX_TOOL_NAME",
    "McpConfigError",
    "check_url",
    "expand",
    "parse_mcp_json",
    "plugin_prefix",
    "server_key",
    "tool_name",
]

#: Longest tool name the model APIs accept (OpenAI and Anthropic both cap function names at 64).
MAX_TOOL_NAME = 64
#: Between a plugin and its server in a key, and between the key and a tool in a tool name.
SEPARATOR = "__"

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
#: ``${NAME}`` or ``${NAME:-default}``; the default runs to the first ``}`` (no nesting, as in
#: Claude Code).
_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_HTTP_TYPES = frozenset({"http", "streamable-http", "streamable_http", "streamableHttp"})
_HASH_LENGTH = 8


class McpConfigError(UserError):
    """A server's configuration that cannot be used as it stands (an unset variable, a bad URL)."""


def parse_mcp_json(
    data: Any, *, plugin: str, plugin_root: str, where: str
) -> tuple[dict[str, McpServerConfig], list[str]]:
    """The servers of one ``.mcp.json`` (or inline ``mcpServers``), and what is wrong with the rest.

    Both shapes are taken: ``{"mcpServers": {name: {...}}}`` and the bare ``{name: {...}}``.
    Returns ``(servers, problems)``: ``servers`` maps each usable server's key
    (``<plugin>__<server>``, or ``<server>`` when ``plugin`` is empty, with characters outside
    ``[A-Za-z0-9_-]`` replaced by ``_``) to its config; a server name holding ``__``, the
    separator, is refused, so a key names one plugin and one server only (plugin ``a_b`` with
    server ``c`` and plugin ``a`` with server ``b_c`` are ``a_b__c`` and ``a__b_c``, and their
    tools ``mcp__a_b__c__…`` and ``mcp__a__b_c__…``). ``problems`` holds one message per server
    that was left out, each starting with ``where`` and naming the server, so a caller can show
    them as warnings (or raise the first as a :class:`~marketplace.model.BundleError`).
    """
    if not isinstance(data, dict):
        return {}, [_problem(where, "", f"expected a JSON object, got {_kind(data)}")]
    entries: Any = data.get("mcpServers", data)
    if not isinstance(entries, dict):
        return {}, [_problem(where, "", f"mcpServers must be an object, got {_kind(entries)}")]
    servers: dict[str, McpServerConfig] = {}
    problems: list[str] = []
    named: dict[str, str] = {}
    for name, entry in entries.items():
        key = server_key(plugin, str(name))
        try:
            if not isinstance(name, str) or not name.strip():
                raise McpConfigError("a server needs a non-empty name")
            if SEPARATOR in _sanitize(name):
                raise McpConfigError(
                    f"its name may not hold {SEPARATOR!r}, which separates a plugin, a server "
                    "and a tool in tool names; rename it"
                )
            if key in named:
                raise McpConfigError(
                    f"its key {key!r} is the same as server {named[key]!r}'s once characters "
                    "outside [A-Za-z0-9_-] are replaced; rename one of them"
                )
            servers[key] = _server(entry, key=key, plugin=plugin, plugin_root=plugin_root)
            named[key] = name
        except McpConfigError as exc:
            problems.append(_problem(where, str(name), str(exc)))
    return servers, problems


def plugin_prefix(plugin: str) -> str:
    """``plugin``'s name as its keys and tool names start with."""
    return _sanitize(plugin)


def server_key(plugin: str, server: str) -> str:
    """The key of ``plugin``'s server ``server`` (``<plugin>__<server>``; the config file's own,
    with no plugin: ``<server>``), as its tools are named: ``mcp__<key>__<tool>``."""
    return _sanitize(f"{plugin}{SEPARATOR}{server}" if plugin else server)


def expand(text: str, env: Mapping[str, str], why_unset: Callable[[str], str] | None = None) -> str:
    """``text`` with each ``${VAR}`` and ``${VAR:-default}`` replaced from ``env``.

    As in a POSIX shell, ``:-`` also takes the default when the variable is set but empty. An
    unset variable without a default raises :class:`McpConfigError` naming it (and
    ``why_unset(name)``, when given, says why it may be), since starting a server with an empty
    token would only fail later with a vaguer message; so does a ``${`` that is not a
    well-formed reference. ``CLAUDE_PLUGIN_ROOT`` comes in ``env`` like the rest.
    """
    out: list[str] = []
    pos = 0
    while (start := text.find("${", pos)) != -1:
        match = _REFERENCE.match(text, start)
        if match is None:
            raise McpConfigError(f"malformed reference in {text!r}: use ${{NAME}} or ${{NAME:-x}}")
        name, default = match.group(1), match.group(2)
        value = env.get(name)
        if value is None or (value == "" and default is not None):
            if default is None:
                reason = f" ({why_unset(name)})" if why_unset is not None else ""
                raise McpConfigError(f"${{{name}}} is not set{reason}")
            value = default
        out.append(text[pos:start])
        out.append(value)
        pos = match.end()
    out.append(text[pos:])
    return "".join(out)


def tool_name(key: str, tool: str) -> str:
    """The catalog name of MCP tool ``tool`` of server ``key``: ``mcp__<key>__<tool>``.

    Characters outside ``[A-Za-z0-9_-]`` become ``_`` (the model APIs allow no others); a name
    longer than :data:`MAX_TOOL_NAME` is cut and ends in 8 hex digits of a hash of the full name,
    so two long names that share a prefix stay apart.
    """
    full = f"mcp__{key}__{tool}"
    name = _sanitize(full)
    if len(name) <= MAX_TOOL_NAME:
        return name
    digest = hashlib.sha256(full.encode()).hexdigest()[:_HASH_LENGTH]
    return f"{name[: MAX_TOOL_NAME - _HASH_LENGTH - 1]}_{digest}"


def _server(entry: Any, *, key: str, plugin: str, plugin_root: str) -> McpServerConfig:
    if not isinstance(entry, dict):
        raise McpConfigError(f"expected an object, got {_kind(entry)}")
    transport = entry.get("type", entry.get("transport"))
    if transport is None:
        # Claude Code's default is stdio; a bare url can only mean HTTP.
        transport = "http" if "url" in entry and "command" not in entry else "stdio"
    if not isinstance(transport, str):
        raise McpConfigError(f"type must be a string, got {_kind(transport)}")
    if transport == "stdio":
        command = entry.get("command")
        if not isinstance(command, str) or not command.strip():
            raise McpConfigError("a stdio server needs a command (a non-empty string)")
        return McpServerConfig(
            transport="stdio",
            command=command,
            args=tuple(_strings(entry.get("args", []), "args")),
            env=_string_map(entry.get("env", {}), "env"),
            cwd=_string(entry.get("cwd", ""), "cwd"),
            key=key,
            plugin=plugin,
            plugin_root=plugin_root,
            # A plugin's server is bundle code: it runs in the worker's sandbox. The config
            # file's are the administrator's own and run as they are.
            sandboxed=bool(plugin),
        )
    if transport in _HTTP_TYPES:
        url = entry.get("url")
        if not isinstance(url, str) or not url.strip():
            raise McpConfigError("an http server needs a url (a non-empty string)")
        if "${" not in url:
            check_url(url)
        return McpServerConfig(
            transport="http",
            url=url,
            headers=_string_map(entry.get("headers", {}), "headers"),
            key=key,
            plugin=plugin,
            plugin_root=plugin_root,
        )
    if transport == "sse":
        raise McpConfigError(
            "sse transport is not supported (MCP deprecated HTTP+SSE): use type http, "
            "streamable HTTP, if the server offers it"
        )
    raise McpConfigError(f"transport {transport!r} is not supported: use stdio or http")


def check_url(url: str) -> None:
    """Refuse a server URL that is not ``http(s)://host...``: nothing else is streamable HTTP."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in {"http", "https"} or not rest or rest.startswith("/"):
        raise McpConfigError(f"url {url!r} is not an http(s) URL")


def _strings(value: Any, what: str) -> list[str]:
    if not isinstance(value, list):
        raise McpConfigError(f"{what} must be a list of strings, got {_kind(value)}")
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise McpConfigError(f"{what}[{index}] must be a string, got {_kind(item)}")
    return value


def _string_map(value: Any, what: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise McpConfigError(f"{what} must be an object of strings, got {_kind(value)}")
    for name, item in value.items():
        if not isinstance(item, str):
            raise McpConfigError(f"{what}.{name} must be a string, got {_kind(item)}")
    return dict(value)


def _string(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise McpConfigError(f"{what} must be a string, got {_kind(value)}")
    return value


def _sanitize(text: str) -> str:
    return _UNSAFE.sub("_", text)


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), "null" if value is None else "a number" if _is_number(value) else "a value"
    )


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _problem(where: str, server: str, reason: str) -> str:
    place = f"mcpServers.{server}: " if server else ""
    return f"{where}: {place}{reason}" if where else f"{place}{reason}"
