"""An MCP server's tools as catalog tools: the class, the schema check, the rendered answer.

A server's listing is taken as untrusted: pages and tools are capped, a tool whose schema is
not an object schema (or is too large for a model's context) is left out with a reason, a
schema is compiled without ever fetching a ``$ref``, and an answer is rendered as text capped at
:data:`MAX_RESULT_CHARS`. Calls go through the :class:`~marketplace.mcp.McpHub` that listed the
tool, which keeps the server running.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from marketplace.mcp_config import tool_name
from registry.errors import ToolArgumentError
from registry.tools import BaseTool, ToolClass, ToolContext, ToolResult

if TYPE_CHECKING:
    from marketplace.mcp import McpHub

__all__ = ["MAX_RESULT_CHARS", "McpTool"]

#: A call's answer longer than this is cut (the model could not use more).
MAX_RESULT_CHARS = 64 * 1024
#: A tool whose input schema is larger than this is left out: it would crowd the model's context.
MAX_SCHEMA_BYTES = 64 * 1024
MAX_DESCRIPTION_CHARS = 8 * 1024
#: ``tools/list`` pages and tools followed per server: a server that pages forever cannot hang us.
MAX_PAGES = 100
MAX_TOOLS = 1000


class _McpArguments(BaseModel):
    """Any JSON object: the server checks its own schema (we check it too when it compiles)."""

    model_config = ConfigDict(extra="allow")


class McpTool(BaseTool):
    """One tool of an MCP server, as the catalog and the bag policy see it.

    The class comes from the tool's annotations, as the README documents: ``readOnlyHint`` true
    is read, ``destructiveHint`` true is destructive, anything else is write. (MCP itself
    defaults ``destructiveHint`` to true for a tool that is not read-only; only an explicit
    hint makes a tool destructive here, so unannotated tools stop for approval as writes.)
    """

    args_model = _McpArguments

    def __init__(self, hub: McpHub, key: str, tool: Any, bundle: str = "config") -> None:
        self.hub = hub
        self.server_key = key
        #: The plugin whose server it is, or ``config`` for the config file's.
        self.bundle = bundle
        self.remote_name: str = tool.name
        self.name = tool_name(key, tool.name)
        text = tool.description or tool.title or tool.name
        self.description = text[:MAX_DESCRIPTION_CHARS]
        hints = tool.annotations
        read_only = hints is not None and hints.read_only_hint is True
        if read_only:
            self.tool_class = ToolClass.READ
        elif hints is not None and hints.destructive_hint is True:
            self.tool_class = ToolClass.DESTRUCTIVE
        else:
            self.tool_class = ToolClass.WRITE
        self.idempotent = read_only or (hints is not None and hints.idempotent_hint is True)
        schema = copy.deepcopy(tool.input_schema)
        schema.setdefault("type", "object")
        schema.setdefault("properties", {})
        self._schema = schema
        self._validator = _compile(schema)

    @property
    def parameters(self) -> dict[str, Any]:
        """The server's own input schema, as it listed it."""
        return copy.deepcopy(self._schema)

    def validate_arguments(self, arguments: Mapping[str, Any] | None) -> BaseModel:
        """The base bounds (size, depth, no NUL), an object, then the server's schema."""
        if arguments is not None and not isinstance(arguments, Mapping):
            raise ToolArgumentError(f"invalid arguments for {self.name}: expected an object")
        model = super().validate_arguments(arguments)
        if self._validator is not None:
            problems = _schema_problems(self._validator, model.model_dump())
            if problems:
                raise ToolArgumentError(f"invalid arguments for {self.name}: {problems}")
        return model

    def run(self, arguments: BaseModel, context: ToolContext) -> ToolResult:
        return self.hub.call(self.server_key, self.remote_name, arguments.model_dump())


async def _list_tools(session: Any) -> list[Any]:
    from mcp_types import PaginatedRequestParams

    tools: list[Any] = []
    cursor: str | None = None
    for _ in range(MAX_PAGES):
        params = PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_tools(params=params)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor or len(tools) >= MAX_TOOLS:
            break
    return tools[:MAX_TOOLS]


def _tool_problem(tool: Any) -> str:
    schema = tool.input_schema
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        return "its input schema is not an object schema"
    if len(json.dumps(schema, default=str)) > MAX_SCHEMA_BYTES:
        return f"its input schema is larger than {MAX_SCHEMA_BYTES // 1024} KiB"
    return ""


def _compile(schema: dict[str, Any]) -> Any:
    """A validator for the tool's schema, or ``None`` when it does not compile (the server
    then judges the arguments alone). No ``$ref`` is ever fetched: the registry is empty."""
    from jsonschema import SchemaError
    from jsonschema.validators import validator_for
    from referencing import Registry

    try:
        cls = validator_for(schema)
        cls.check_schema(schema)
        return cls(schema, registry=Registry())
    except (SchemaError, TypeError, ValueError):
        return None


def _schema_problems(validator: Any, arguments: dict[str, Any]) -> str:
    from referencing.exceptions import Unresolvable

    try:
        errors = sorted(validator.iter_errors(arguments), key=lambda e: list(e.path))
    except Unresolvable:
        return ""
    return "; ".join(
        f"{'.'.join(str(p) for p in error.path) or '(arguments)'}: {error.message}"
        for error in errors[:5]
    )


def _render(result: Any) -> ToolResult:
    """A ``CallToolResult`` as text: text parts as they are, other parts summarised, structured
    content as JSON when there is no text, capped at :data:`MAX_RESULT_CHARS`."""
    parts: list[str] = []
    has_text = False
    for block in result.content:
        kind = getattr(block, "type", "")
        if kind == "text":
            has_text = True
            parts.append(block.text)
        elif kind in ("image", "audio"):
            size = len(block.data) * 3 // 4 - block.data[-2:].count("=")  # base64
            parts.append(f"[{kind} {block.mime_type}, {size} bytes, not shown]")
        elif kind == "resource_link":
            parts.append(f"[resource link {block.uri}: {block.name}]")
        elif kind == "resource":
            res = block.resource
            text = getattr(res, "text", None)
            if text is not None:
                has_text = True
                parts.append(f"[resource {res.uri}]\n{text}")
            else:
                parts.append(f"[resource {res.uri} {res.mime_type or ''}, binary, not shown]")
        else:
            parts.append(f"[{kind or 'unknown'} content, not shown]")
    if not has_text and result.structured_content is not None:
        parts.insert(0, json.dumps(result.structured_content, ensure_ascii=False, default=str))
    text = "\n".join(parts)
    if len(text) > MAX_RESULT_CHARS:
        dropped = len(text) - MAX_RESULT_CHARS
        text = f"{text[:MAX_RESULT_CHARS]}\n[output truncated: {dropped} more characters not shown]"
    return ToolResult(content=text, is_error=bool(result.is_error), data=result.structured_content)
