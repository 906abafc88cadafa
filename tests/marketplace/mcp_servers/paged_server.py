"""A low-level SDK server that lists its tools over several pages and answers in mixed content.

The hub must follow ``nextCursor`` to see every tool, and turn image and structured content into
text the model can read.
"""

from __future__ import annotations

from typing import Any

import anyio
import mcp.types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

PAGE = 2
TOOLS = [
    types.Tool(
        name=f"tool.{index}",
        description=f"Tool number {index}",
        input_schema={
            "type": "object",
            "properties": {"n": {"type": "integer"}},
            "required": ["n"],
        },
    )
    for index in range(5)
]


async def list_tools(
    ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    start = int(params.cursor) if params is not None and params.cursor else 0
    end = start + PAGE
    return types.ListToolsResult(
        tools=TOOLS[start:end], next_cursor=str(end) if end < len(TOOLS) else None
    )


async def call_tool(
    ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
) -> types.CallToolResult:
    n = (params.arguments or {}).get("n", 0)
    if params.name == "tool.0":
        return types.CallToolResult(content=[], structured_content={"n": n, "doubled": 2 * n})
    return types.CallToolResult(
        content=[
            types.TextContent(text=f"{params.name} got {n}"),
            types.ImageContent(data="iVBORw0KGgo=", mime_type="image/png"),
        ]
    )


async def main() -> None:
    server = Server("paged", on_list_tools=list_tools, on_call_tool=call_tool)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
