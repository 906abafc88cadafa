"""An MCP server written with the SDK's MCPServer, for the hub's tests: stdio or streamable HTTP.

``python echo_server.py`` serves stdio; ``python echo_server.py --http PORT`` serves streamable
HTTP on 127.0.0.1:PORT at ``/mcp``. Its tools cover each class the hub derives from the
annotations (read, write, destructive) and show what the process sees (environment, cwd).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.types import Image
from mcp.types import ToolAnnotations

server = MCPServer("echo", log_level="WARNING")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def echo(text: str) -> str:
    """Answer with the text it was given."""
    return text


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def env_keys() -> str:
    """The names of the server's environment variables, one a line."""
    return "\n".join(sorted(os.environ))


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def env_value(name: str) -> str:
    """One environment variable's value, or <unset>."""
    return os.environ.get(name, "<unset>")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def where() -> str:
    """The server's working directory and process id."""
    return f"{os.getcwd()} {os.getpid()}"


@server.tool()
def note(text: str) -> str:
    """Keep a note (no hints: a write tool)."""
    print(f"noted {text}", file=sys.stderr, flush=True)
    return f"noted: {text}"


@server.tool(annotations=ToolAnnotations(destructive_hint=True))
def wipe() -> str:
    """Forget every note (destructive)."""
    return "wiped"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def fail(reason: str) -> str:
    """Always fails with the reason given."""
    raise ToolError(reason)


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def big(size: int) -> str:
    """A text of ``size`` characters."""
    return "x" * size


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def nap(seconds: float) -> str:
    """Sleep, then answer: a call that outlasts its timeout."""
    time.sleep(seconds)
    return "awake"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def picture() -> Image:
    """A 4-byte image."""
    return Image(data=b"\x89PNG", format="png")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, default=0, help="serve streamable HTTP on this port")
    options = parser.parse_args()
    print("echo server starting", file=sys.stderr, flush=True)
    if options.http:
        server.run("streamable-http", host="127.0.0.1", port=options.http)
    else:
        server.run()


if __name__ == "__main__":
    main()
