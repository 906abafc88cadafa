"""The MCP servers of one process, kept running, and their tools as catalog tools.

An :class:`McpHub` owns one background thread with its own asyncio loop: the SDK is async,
while tools run in the worker's threads, and the worker's own loop must never wait on a slow
server. Each server has a supervisor task on that loop that starts it (stdio or streamable
HTTP, with the official ``mcp`` SDK), lists its tools, stays connected to serve calls and, when
the server exits or fails, records why and starts it again with backoff. A server that cannot
start is a status and a tool error, never an exception out of the hub.

The SDK is imported on the hub's thread when the first server starts: importing it costs about
a second, which a process without MCP servers should not pay.

The tool class and the rendering of answers are in :mod:`marketplace._mcp_tool`, opening a
connection and watching it end in :mod:`marketplace._mcp_connection`.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Collection, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marketplace._mcp_connection import (
    STDERR_LINES,
    _Ended,
    _handshake,
    _Notifications,
    _open_http,
    _open_stdio,
    _reason,
    _resolve,
    _StderrRing,
    _text,
    _WatchedStream,
)
from marketplace._mcp_tool import MAX_RESULT_CHARS, McpTool, _list_tools, _render, _tool_problem
from marketplace.mcp_config import McpConfigError, tool_name
from marketplace.model import McpServerConfig
from registry.tools import BaseTool, ToolClass, ToolResult

__all__ = ["MAX_RESULT_CHARS", "McpHub", "McpTool"]

logger = logging.getLogger(__name__)

#: First wait before a restart; it doubles after each failure up to :data:`BACKOFF_MAX`.
BACKOFF_START = 0.5
BACKOFF_MAX = 30.0
#: A server that stayed up this long starts again from :data:`BACKOFF_START` when it fails.
BACKOFF_RESET = 60.0
#: A connected server is pinged after this long without traffic: an HTTP server that went away
#: shows no end of stream, and a hung stdio server answers nothing.
HEALTH_INTERVAL = 30.0
PING_TIMEOUT = 10.0
#: Seconds a caller waits beyond ``call_timeout`` for the hub loop itself to answer.
_CALL_GRACE = 5.0
#: Seconds one server's stop may take: the SDK closes stdin, waits 2 s, then SIGTERM/SIGKILL.
_STOP_TIMEOUT = 10.0
_CLASSES = (ToolClass.READ, ToolClass.WRITE, ToolClass.DESTRUCTIVE)


@dataclass(eq=False)
class _Server:
    """One configured server and what its supervisor knows; guarded by the hub's lock."""

    config: McpServerConfig
    state: str = "starting"
    pid: int | None = None
    restarts: int = 0
    last_error: str = ""
    #: ``time.monotonic()`` of the next restart; ``None`` when none is scheduled.
    retry_at: float | None = None
    listed: bool = False
    tools: tuple[McpTool, ...] = ()
    problems: tuple[str, ...] = ()
    stderr: deque[str] = field(default_factory=lambda: deque(maxlen=STDERR_LINES))
    #: Set once the first attempt ended: tools listed, or a failure recorded.
    settled: threading.Event = field(default_factory=threading.Event)
    # Loop-thread only from here on.
    session: Any = None
    wake: Any = None
    scope: Any = None
    stopping: bool = False
    up_since: float = 0.0
    future: concurrent.futures.Future[None] | None = None


class McpHub:
    """Starts, supervises and calls the MCP servers of this process.

    ``environ`` is where the few variables a stdio server inherits
    (:data:`~marketplace._mcp_connection.INHERITED_ENV`) and the values of ``${VAR}``
    references come from (default: this process's, copied now); ``allow`` names the only
    variables a reference may read (``mcp_env_allow``; a secret-named one never), and
    ``secrets`` are the skill secrets (``ONGRID_SKILL_*``) the config file's servers may also
    read, never a plugin's (:func:`~marketplace._mcp_connection._resolve` has the rules).
    ``sandbox`` (a :class:`workers.sandbox.Sandbox`) is where a plugin's stdio servers run:
    without one they do not start at all (the config file's own servers run as they are);
    ``plugin_data`` is where the folders of plugins granted a writable one are made.
    ``start_timeout`` bounds a server's start (spawn,
    ``initialize``, ``tools/list``) and is how long :meth:`reconcile` waits by default;
    ``call_timeout`` bounds each tool call. Every method may be called from any thread but the
    hub's own.
    """

    def __init__(
        self,
        *,
        environ: Mapping[str, str] | None = None,
        allow: Collection[str] = (),
        secrets: Mapping[str, str] | None = None,
        sandbox: Any = None,
        plugin_data: Path | None = None,
        start_timeout: float = 20.0,
        call_timeout: float = 120.0,
    ) -> None:
        self._environ = dict(os.environ if environ is None else environ)
        self._allow = frozenset(allow)
        self._secrets = dict(secrets or {})
        self._sandbox = sandbox
        self._plugin_data = plugin_data
        self._start_timeout = start_timeout
        self._call_timeout = call_timeout
        self._lock = threading.Lock()
        self._reconcile_lock = threading.Lock()
        self._servers: dict[str, _Server] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        atexit.register(_close_at_exit, weakref.ref(self))

    # -- public API -----------------------------------------------------------------------

    def reconcile(
        self, servers: Mapping[str, McpServerConfig], *, wait: float | None = None
    ) -> None:
        """Run exactly ``servers`` (by key): start new ones, stop removed ones, restart changed.

        Then wait up to ``wait`` seconds (default ``start_timeout``) for the servers it started
        to list their tools or fail once; one still starting keeps starting in the background
        and its tools appear in :meth:`tools` when it is ready. A server that fails is reported
        by :meth:`status`, never raised.
        """
        self._not_on_hub_thread("reconcile")
        with self._reconcile_lock:
            if self._closed:
                raise RuntimeError("the MCP hub is closed")
            with self._lock:
                current = dict(self._servers)
            gone = [s for k, s in current.items() if k not in servers or servers[k] != s.config]
            new = [c for k, c in servers.items() if k not in current or current[k] in gone]
            self._stop(gone, time.monotonic() + _STOP_TIMEOUT)
            started = [self._start(config) for config in new]
        deadline = time.monotonic() + (self._start_timeout if wait is None else wait)
        for server in started:
            server.settled.wait(max(0.0, deadline - time.monotonic()))

    def wait_started(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` seconds (default ``start_timeout``) for the servers that have
        neither listed their tools nor failed yet: a spawn that starts just after a reload gets
        the tools of the servers the reload added."""
        with self._lock:
            pending = [s for s in self._servers.values() if not s.settled.is_set()]
        deadline = time.monotonic() + (self._start_timeout if timeout is None else timeout)
        for server in pending:
            server.settled.wait(max(0.0, deadline - time.monotonic()))

    def tools(self) -> list[BaseTool]:
        """One tool per tool of every server that listed its tools at least once, by key.

        A server that is down keeps its tools, so a call reaches it and reports the outage
        rather than the tool vanishing from under a spawn. Names are unique: of two tools whose
        names differ only in characters a tool name cannot hold, the first listed is kept (the
        other is named in the server's ``problems``).
        """
        with self._lock:
            servers = [self._servers[k] for k in sorted(self._servers)]
            found: dict[str, BaseTool] = {}
            for server in servers:
                for tool in server.tools:
                    found.setdefault(tool.name, tool)
        return list(found.values())

    def status(self) -> dict[str, dict[str, Any]]:
        """Per server key: ``state`` (starting|up|down|stopped), ``transport``, ``pid`` (stdio),
        ``restarts``, ``last_error``, ``retry_in`` (seconds to the next restart, or ``None``),
        ``tools`` (catalog names), ``problems`` (tools left out) and ``stderr`` (last lines)."""
        now = time.monotonic()
        with self._lock:
            return {key: _describe(server, now) for key, server in sorted(self._servers.items())}

    def close(self, timeout: float = 10) -> None:
        """Stop every server and the hub's thread, waiting at most ``timeout`` seconds."""
        self._not_on_hub_thread("close")
        deadline = time.monotonic() + timeout
        with self._reconcile_lock:
            if self._closed:
                return
            self._closed = True
            with self._lock:
                servers = list(self._servers.values())
            self._stop(servers, deadline, forget=False)
            loop, thread = self._loop, self._thread
            if loop is not None and thread is not None:
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(loop.stop)
                thread.join(max(0.1, deadline - time.monotonic()))

    # -- starting and stopping (caller threads) -------------------------------------------

    def _start(self, config: McpServerConfig) -> _Server:
        server = _Server(config)
        with self._lock:
            self._servers[config.key] = server
        loop = self._ensure_loop()
        server.future = asyncio.run_coroutine_threadsafe(self._supervise(server), loop)
        return server

    def _stop(self, servers: list[_Server], deadline: float, *, forget: bool = True) -> None:
        loop = self._loop
        if not servers or loop is None:
            return
        for server in servers:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_cancel, server)
        for server in servers:
            if server.future is None:
                continue
            try:
                server.future.result(max(0.0, deadline - time.monotonic()))
            except concurrent.futures.TimeoutError:
                logger.warning("MCP server %s did not stop in time", server.config.key)
            except Exception:  # noqa: BLE001 - a failed supervisor is already stopped
                logger.exception("the supervisor of MCP server %s failed", server.config.key)
        if forget:
            with self._lock:
                for server in servers:
                    if self._servers.get(server.config.key) is server:
                        del self._servers[server.config.key]

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            ready = threading.Event()
            thread = threading.Thread(
                target=_run_loop, args=(loop, ready), name="mcp-hub", daemon=True
            )
            thread.start()
            ready.wait(5.0)
            self._loop, self._thread = loop, thread
        return self._loop

    def _not_on_hub_thread(self, what: str) -> None:
        if self._thread is not None and threading.current_thread() is self._thread:
            raise RuntimeError(f"McpHub.{what} cannot be called from the hub's own thread")

    # -- supervision (hub thread) ---------------------------------------------------------

    async def _supervise(self, server: _Server) -> None:
        import anyio

        with anyio.CancelScope() as scope:
            server.scope = scope
            if not server.stopping:  # a stop that came before the first step spawns nothing
                await self._keep_running(server)
        self._update(server, state="stopped", pid=None, retry_at=None)
        server.settled.set()

    async def _keep_running(self, server: _Server) -> None:
        import anyio

        backoff = BACKOFF_START
        while True:
            self._update(server, state="starting", retry_at=None)
            reason, retry = await self._attempt(server)
            if server.up_since and time.monotonic() - server.up_since >= BACKOFF_RESET:
                backoff = BACKOFF_START
            server.up_since = 0.0
            retry_at = time.monotonic() + backoff if retry else None
            self._update(server, state="down", last_error=reason, retry_at=retry_at, pid=None)
            server.settled.set()
            logger.warning("MCP server %s is down: %s", server.config.key, reason)
            if not retry:
                await anyio.sleep_forever()
            await anyio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX)
            self._update(server, restarts=server.restarts + 1)

    async def _attempt(self, server: _Server) -> tuple[str, bool]:
        """Start the server once and serve it until it ends: why it ended, and whether a
        restart could help (an unset variable stays unset until the config changes)."""
        import anyio
        from mcp.client.session import ClientSession

        try:
            opened = _resolve(server.config, self._environ, self._allow, self._secrets)
        except McpConfigError as exc:
            return f"{exc}; it is not restarted until its configuration changes", False
        send, receive = anyio.create_memory_object_stream[str](16)
        server.wake = send
        stderr = _StderrRing(server.stderr, self._lock)
        try:
            with send, receive:
                async with AsyncExitStack() as stack:
                    read, write = await self._open(stack, server, opened, stderr)
                    watched = _WatchedStream(read, send)
                    session = await stack.enter_async_context(
                        ClientSession(watched, write, message_handler=_Notifications(send))
                    )
                    listing = await _handshake(session, self._start_timeout)
                    self._publish(server, listing, session)
                    reason = await self._serve(server, session, watched, receive)
        except Exception as exc:  # noqa: BLE001 - whatever went wrong is the reason it is down
            reason = _reason(exc, server.config)
        finally:
            server.session = None
            server.wake = None
            # After the exit stack: the process has ended, so its last words are in the pipe.
            stderr.close()
        return reason + stderr.tail(), True

    async def _open(
        self, stack: AsyncExitStack, server: _Server, opened: dict[str, Any], stderr: _StderrRing
    ) -> tuple[Any, Any]:
        if server.config.transport == "http":
            return await _open_http(stack, opened)
        streams, pid = await _open_stdio(stack, self._confined(server.config, opened), stderr)
        self._update(server, pid=pid)
        return streams

    async def _serve(
        self, server: _Server, session: Any, watched: _WatchedStream, wake: Any
    ) -> str:
        """Wait until the connection ends; re-list on ``tools/list_changed``, ping when idle."""
        import anyio

        server.up_since = time.monotonic()
        while True:
            signal = "check"
            with anyio.move_on_after(HEALTH_INTERVAL):
                signal = await wake.receive()
            if watched.ended:
                return "the server closed the connection (it exited or was killed)"
            try:
                with anyio.fail_after(PING_TIMEOUT if signal != "relist" else self._start_timeout):
                    if signal == "relist":
                        self._publish(server, await _list_tools(session), session)
                    else:
                        await session.send_ping()
            except Exception as exc:  # noqa: BLE001 - a server that cannot answer is restarted
                what = "tools/list" if signal == "relist" else "a ping"
                return f"it did not answer {what}: {_text(exc)}"

    def _publish(self, server: _Server, listing: list[Any], session: Any) -> None:
        tools: list[McpTool] = []
        problems: list[str] = []
        seen: set[str] = set()
        config = server.config
        cap = _CLASSES.index(ToolClass(config.max_tool_class))
        for item in listing:
            problem = _tool_problem(item)
            name = tool_name(config.key, item.name)
            if not problem and name in seen:
                problem = f"its name {name} is taken by another tool of the server"
            tool = None if problem else McpTool(self, config.key, item, config.plugin or "config")
            if tool is not None and _CLASSES.index(tool.tool_class) > cap:
                # A plugin's server cannot raise its own tools past what its install allows.
                problem = (
                    f"its class {tool.tool_class.value} is more than plugin {config.plugin}'s "
                    f"install allows ({config.max_tool_class}); install it with a higher "
                    "--allow-mode to use it"
                )
            if problem or tool is None:
                problems.append(f"tool {item.name!r} left out: {problem}")
                continue
            seen.add(name)
            tools.append(tool)
        for problem in problems:
            logger.warning("MCP server %s: %s", server.config.key, problem)
        server.session = session
        self._update(
            server,
            state="up",
            listed=True,
            tools=tuple(tools),
            problems=tuple(problems),
            last_error="",
            retry_at=None,
        )
        server.settled.set()
        logger.info("MCP server %s is up with %d tools", server.config.key, len(tools))

    def _confined(self, config: McpServerConfig, opened: dict[str, Any]) -> dict[str, Any]:
        """A plugin's stdio server as the worker's sandbox runs it (:meth:`workers.sandbox.
        Sandbox.confine_server`); the config file's own as it is."""
        if not config.sandboxed:
            return opened
        if self._sandbox is None:
            raise _Ended(
                "a plugin's stdio server runs only in the worker's sandbox, and this process "
                "has none: it is not started"
            )
        writable = self._data_folder(config.plugin) if config.writable else ""
        try:
            argv, added = self._sandbox.confine_server(
                [opened["command"], *opened["args"]],
                root=config.plugin_root,
                plugin=config.plugin,
                network=config.network,
                writable=writable,
            )
        except RuntimeError as exc:
            raise _Ended(f"not started: {exc}") from None
        env = {**opened["env"], **added}
        return {"command": argv[0], "args": argv[1:], "env": env, "cwd": config.plugin_root}

    def _data_folder(self, plugin: str) -> str:
        """``<plugin_data>/<plugin>``, made for the sandbox's user to write."""
        if self._plugin_data is None:
            raise _Ended("not started: this worker has no folder for plugins' data")
        folder = self._plugin_data / plugin
        folder.mkdir(parents=True, exist_ok=True)
        owner = getattr(self._sandbox, "owner", None)
        if owner is not None:
            os.chown(folder, *owner())
        os.chmod(folder, 0o700)
        return str(folder)

    def _update(self, server: _Server, **changes: Any) -> None:
        with self._lock:
            for name, value in changes.items():
                setattr(server, name, value)

    # -- calls ----------------------------------------------------------------------------

    def call(self, key: str, tool: str, arguments: dict[str, Any]) -> ToolResult:
        """Call ``tool`` (its name on the server) of server ``key``; every failure is a result."""
        self._not_on_hub_thread("call")
        with self._lock:
            server = self._servers.get(key)
        loop = self._loop
        if server is None or loop is None or self._closed:
            return _error(f"MCP server {key} is not configured in this process any more")
        try:
            future = asyncio.run_coroutine_threadsafe(self._call(server, tool, arguments), loop)
        except RuntimeError:
            return _error(f"MCP server {key} is not running: the MCP hub is closed")
        try:
            return future.result(self._call_timeout + _CALL_GRACE)
        except concurrent.futures.TimeoutError:
            future.cancel()
            return _error(f"MCP server {key} did not answer {tool} within {self._call_timeout:g}s")
        except concurrent.futures.CancelledError:
            return _error(f"MCP server {key} was stopped during the call of {tool}")

    async def _call(self, server: _Server, tool: str, arguments: dict[str, Any]) -> ToolResult:
        import anyio
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED

        key, session = server.config.key, server.session
        if session is None or server.state != "up":
            with self._lock:
                return _error(_outage(server, time.monotonic()))
        try:
            with anyio.fail_after(self._call_timeout):
                result = await session.call_tool(tool, arguments)
        except TimeoutError:
            _poke(server, "check")
            return _error(
                f"MCP server {key} did not answer {tool} within {self._call_timeout:g}s; "
                "the call may still be running there"
            )
        except MCPError as exc:
            if exc.code != CONNECTION_CLOSED:
                return _error(f"MCP server {key} refused {tool}: {exc.message} (code {exc.code})")
            _poke(server, "check")
            return _error(
                f"MCP server {key} is not running: the connection closed during the call of "
                f"{tool}, which may or may not have taken effect; it is being restarted"
            )
        except Exception as exc:  # noqa: BLE001 - a failing call is an observation
            _poke(server, "check")
            return _error(f"MCP server {key}: the call of {tool} failed: {_text(exc)}")
        return _render(result)


def _outage(server: _Server, now: float) -> str:
    """Why a call cannot reach ``server`` now, and when it will be tried again."""
    key = server.config.key
    if server.state == "stopped":
        return f"MCP server {key} was stopped"
    if not server.last_error:
        return f"MCP server {key} is not running yet: it is still starting"
    text = f"MCP server {key} is not running: {server.last_error}"
    if server.state == "starting":
        return f"{text}; restart {server.restarts} is under way"
    if server.retry_at is not None:
        return f"{text}; restart {server.restarts + 1} in {max(0.0, server.retry_at - now):.1f}s"
    return text


def _describe(server: _Server, now: float) -> dict[str, Any]:
    return {
        "state": server.state,
        "transport": server.config.transport,
        "pid": server.pid,
        "restarts": server.restarts,
        "last_error": server.last_error,
        "retry_in": None if server.retry_at is None else max(0.0, server.retry_at - now),
        "tools": [tool.name for tool in server.tools],
        "problems": list(server.problems),
        "stderr": list(server.stderr),
    }


def _error(message: str) -> ToolResult:
    return ToolResult(content=message, is_error=True)


def _poke(server: _Server, signal: str) -> None:
    import anyio

    if server.wake is not None:
        with contextlib.suppress(anyio.WouldBlock, anyio.ClosedResourceError):
            server.wake.send_nowait(signal)


def _cancel(server: _Server) -> None:
    # On the loop: an anyio scope cancel lets the SDK's shielded shutdown end the child process
    # (a bare task.cancel() can cut that shutdown short and leave the child running).
    server.stopping = True
    if server.scope is not None:
        server.scope.cancel()


def _run_loop(loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
    asyncio.set_event_loop(loop)
    loop.call_soon(ready.set)
    try:
        loop.run_forever()
    finally:
        pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.wait(pending, timeout=2.0))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()


def _close_at_exit(ref: weakref.ReferenceType[McpHub]) -> None:
    hub = ref()
    if hub is not None:
        hub.close(timeout=5.0)
