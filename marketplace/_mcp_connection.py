"""A server's connection, seen from the hub's loop: how it is opened and how it ends.

:mod:`marketplace.mcp` supervises; this is what one attempt uses. The config's ``${VAR}``
references are expanded, the transport is opened (a stdio child with a few inherited variables,
or streamable HTTP without an ambient proxy), ``initialize`` and ``tools/list`` are bounded by
the start timeout, and the end of the connection is heard at once through the read stream. A
stdio server's stderr is kept in a ring of its last lines and its pid is found by its pipe;
both end up in the status and in the reason a server is down.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections import deque
from collections.abc import Callable, Collection, Mapping
from contextlib import AsyncExitStack
from typing import Any, TextIO

from marketplace._mcp_tool import _list_tools
from marketplace.mcp_config import check_url, expand
from marketplace.model import McpServerConfig
from registry.secret_names import is_secret, is_skill_secret

__all__ = ["INHERITED_ENV", "STDERR_LINE_CHARS", "STDERR_LINES", "expansion_env"]

#: Lines of a stdio server's stderr kept for error messages, and how long one line may be.
STDERR_LINES = 50
STDERR_LINE_CHARS = 500
#: The worker's variables a stdio server gets, besides those its config declares.
INHERITED_ENV = ("PATH", "HOME", "LANG")
#: Seconds to connect to an HTTP server, and to wait for each read of its answers.
_HTTP_CONNECT_TIMEOUT = 30.0
_HTTP_READ_TIMEOUT = 300.0


def expansion_env(
    config: McpServerConfig,
    environ: Mapping[str, str],
    allow: Collection[str],
    secrets: Mapping[str, str],
) -> dict[str, str]:
    """What ``${VAR}`` in ``config`` may read: the variables ``allow`` lists (``mcp_env_allow``)
    that are not secret-named, ``CLAUDE_PLUGIN_ROOT``, and for the config file's own servers
    (no plugin) the skill secrets. A plugin's configuration never reads a secret: a bundle
    could otherwise send the worker's model keys or database URL to a server of its choosing
    (in a stdio server's environment, an HTTP server's URL or headers)."""
    env = {k: environ[k] for k in allow if k in environ and not is_secret(k)}
    if not config.plugin:
        env.update(secrets)
    if config.plugin_root:
        env["CLAUDE_PLUGIN_ROOT"] = config.plugin_root
    return env


def _resolve(
    config: McpServerConfig,
    environ: Mapping[str, str],
    allow: Collection[str] = (),
    secrets: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The server's config with every ``${VAR}`` expanded from :func:`expansion_env` (raises
    :class:`McpConfigError` naming a variable it may not read, or one unset)."""
    env = expansion_env(config, environ, allow, secrets or {})
    hint = _unset_hint(config)
    if config.transport == "http":
        url = expand(config.url, env, hint)
        check_url(url)
        headers = {k: expand(v, env, hint) for k, v in config.headers.items()}
        # ``"Authorization": "${TOKEN:-}"`` with no token means "send none", not "send ''".
        return {"url": url, "headers": {k: v for k, v in headers.items() if v}}
    child = {k: environ[k] for k in INHERITED_ENV if k in environ}
    if config.plugin_root:
        child["CLAUDE_PLUGIN_ROOT"] = config.plugin_root
    child.update({k: expand(v, env, hint) for k, v in config.env.items()})
    cwd = expand(config.cwd, env, hint) if config.cwd else ""
    if cwd and not os.path.isabs(cwd) and config.plugin_root:
        cwd = os.path.join(config.plugin_root, cwd)
    return {
        "command": expand(config.command, env, hint),
        "args": [expand(a, env, hint) for a in config.args],
        "env": child,
        "cwd": cwd or config.plugin_root or None,
    }


def _unset_hint(config: McpServerConfig) -> Callable[[str], str]:
    """Why a variable a configuration refers to has no value, in a few words."""

    def why(name: str) -> str:
        if is_skill_secret(name) and config.plugin:
            return "skill secrets are for the config file's servers, never a plugin's"
        if is_secret(name):
            return "secret-named variables are never expanded in MCP server configurations"
        return "or not listed in mcp_env_allow (ONGRID_MCP_ENV_ALLOW), the variables it may read"

    return why


async def _open_http(stack: AsyncExitStack, opened: dict[str, Any]) -> tuple[Any, Any]:
    """The read and write streams of a streamable HTTP connection, closed with ``stack``."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    # No ambient proxy or netrc: the server is reached at the URL its config names.
    client = httpx2.AsyncClient(
        headers=opened["headers"],
        timeout=httpx2.Timeout(_HTTP_CONNECT_TIMEOUT, read=_HTTP_READ_TIMEOUT),
        trust_env=False,
    )
    await stack.enter_async_context(client)
    url = opened["url"]
    return await stack.enter_async_context(streamable_http_client(url, http_client=client))


async def _open_stdio(
    stack: AsyncExitStack, opened: dict[str, Any], stderr: _StderrRing
) -> tuple[tuple[Any, Any], int | None]:
    """The child's streams (closed with ``stack``), and its pid when it can be found."""
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(
        command=opened["command"], args=opened["args"], env=opened["env"], cwd=opened["cwd"]
    )
    errlog = stderr.open(asyncio.get_running_loop())
    try:
        streams = await stack.enter_async_context(stdio_client(params, errlog=errlog))
    finally:
        errlog.close()  # the child holds its own copy; ours would keep the pipe from ending
    pid = await asyncio.get_running_loop().run_in_executor(None, _child_on_pipe, stderr.inode)
    return streams, pid


async def _handshake(session: Any, start_timeout: float) -> list[Any]:
    """``initialize`` and ``tools/list`` within ``start_timeout``; :class:`_Ended` says why not."""
    import anyio
    from mcp.shared.exceptions import MCPError
    from mcp_types import CONNECTION_CLOSED

    try:
        with anyio.fail_after(start_timeout):
            await session.initialize()
            return await _list_tools(session)
    except TimeoutError:
        raise _Ended(
            f"it did not finish initialize and tools/list within {start_timeout:g}s"
        ) from None
    except MCPError as exc:
        if exc.code != CONNECTION_CLOSED:
            raise
        raise _Ended("it exited (or closed its output) before it had listed its tools") from None


class _Ended(Exception):
    """The connection ended for a reason already put in words."""


class _WatchedStream:
    """The transport's read stream, telling the supervisor when it ends.

    The SDK's session does not say when its connection is gone (a killed stdio server is just
    an end of stream to its reader); this wrapper is how the supervisor hears of it at once.
    """

    def __init__(self, inner: Any, wake: Any) -> None:
        self._inner = inner
        self._wake = wake
        self.ended = False

    @property
    def last_context(self) -> Any:
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> Any:
        import anyio

        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self.ended = True
            with contextlib.suppress(anyio.WouldBlock, anyio.ClosedResourceError):
                self._wake.send_nowait("ended")
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> _WatchedStream:
        return self

    async def __anext__(self) -> Any:
        import anyio

        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> _WatchedStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class _Notifications:
    """The session's message handler: a changed tool list makes the supervisor list again."""

    def __init__(self, wake: Any) -> None:
        self._wake = wake

    async def __call__(self, message: Any) -> None:
        import anyio
        from mcp_types import ToolListChangedNotification

        if isinstance(message, ToolListChangedNotification):
            with contextlib.suppress(anyio.WouldBlock, anyio.ClosedResourceError):
                self._wake.send_nowait("relist")


class _StderrRing:
    """A stdio server's stderr, read on the hub loop into the server's last lines.

    The SDK wants a file for the child's stderr; a pipe read here keeps the server's output
    out of our own stdout/stderr and at hand for the message that says why it failed.
    """

    def __init__(self, lines: deque[str], lock: threading.Lock) -> None:
        self._lines, self._lock = lines, lock
        self._fd: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._partial = b""
        #: Lines this attempt added: the ring also holds the lines of earlier attempts.
        self._added = 0
        self.inode: tuple[int, int] | None = None

    def open(self, loop: asyncio.AbstractEventLoop) -> TextIO:
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        info = os.fstat(read_fd)
        self.inode = (info.st_dev, info.st_ino)
        self._fd, self._loop = read_fd, loop
        loop.add_reader(read_fd, self._readable)
        return open(write_fd, "w", closefd=True)  # noqa: SIM115 - closed once the child has it

    def _readable(self) -> None:
        if self._fd is not None and not self._read_once(self._fd):
            self.close()

    def _read_once(self, fd: int) -> bool:
        """Take what the pipe holds; ``False`` once it has ended."""
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return True
        except OSError:
            return False
        if not data:
            return False
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()[-STDERR_LINE_CHARS:]
        with self._lock:
            for line in lines:
                text = line.decode("utf-8", "replace").rstrip()
                if text.strip():
                    self._lines.append(text[:STDERR_LINE_CHARS])
                    self._added += 1
        return True

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        # What the server wrote just before it died is usually the reason: take it first.
        for _ in range(16):
            if not _has_data(fd) or not self._read_once(fd):
                break
        if self._loop is not None:
            self._loop.remove_reader(fd)
        os.close(fd)

    def tail(self, lines: int = 5) -> str:
        """This attempt's last lines as ``"; its stderr ends: a | b"``, or ``""`` if none."""
        count = min(lines, self._added)
        with self._lock:
            last = list(self._lines)[-count:] if count else []
        text = " | ".join(line.strip() for line in last)
        return f"; its stderr ends: {text[-800:]}" if text else ""


def _has_data(fd: int) -> bool:
    import select

    readable, _, _ = select.select([fd], [], [], 0)
    return bool(readable)


def _child_on_pipe(inode: tuple[int, int] | None) -> int | None:
    """The pid of our child whose stderr is the pipe ``inode``: the SDK does not expose it.

    Matching the pipe rather than the command line tells two servers with one command apart.
    Linux only (``/proc``); elsewhere the pid is unknown.
    """
    if inode is None:
        return None
    import psutil

    try:
        children = psutil.Process().children()
    except psutil.Error:
        return None
    for child in children:
        try:
            info = os.stat(f"/proc/{child.pid}/fd/2")
        except OSError:
            continue
        if (info.st_dev, info.st_ino) == inode:
            return int(child.pid)
    return None


def _reason(exc: BaseException, config: McpServerConfig) -> str:
    leaf = _leaf(exc)
    if isinstance(leaf, _Ended):
        return str(leaf)
    if isinstance(leaf, OSError) and config.transport == "stdio" and leaf.strerror:
        return f"cannot start {config.command!r}: {leaf.strerror}"
    return _text(leaf)


def _leaf(exc: BaseException) -> BaseException:
    """The first real error inside the SDK's (nested) exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _text(exc: BaseException) -> str:
    leaf = _leaf(exc)
    message = str(leaf).strip()
    return f"{type(leaf).__name__}: {message}" if message else type(leaf).__name__
