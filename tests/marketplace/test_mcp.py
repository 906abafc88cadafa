"""MCP servers as tools: ``.mcp.json`` parsing, and the hub against real server processes.

The servers are real: two written with the SDK (``mcp_servers/``), served over stdio and over
streamable HTTP, and ``mcp-server-time`` from PyPI. Waits are bounded polls, never sleeps
whose length is asserted.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from marketplace.mcp import MAX_RESULT_CHARS, McpHub
from marketplace.mcp_config import McpConfigError, expand, parse_mcp_json, tool_name
from marketplace.model import McpServerConfig
from registry.errors import ToolArgumentError
from registry.tools import BaseTool, ToolClass, ToolContext, ToolResult

SERVERS = Path(__file__).resolve().parent / "mcp_servers"
ECHO = str(SERVERS / "echo_server.py")
PAGED = str(SERVERS / "paged_server.py")
CORPUS = (
    Path(__file__).resolve().parents[2].parent
    / "shared/corpus/marketplaces/anthropics__claude-plugins-official"
)
#: What the SDK's stdio client always passes on (from this process), besides our own few.
SDK_INHERITED = {"HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER"}
#: Python sets LC_CTYPE itself when it coerces a C locale (PEP 538).
PYTHON_ADDED = {"LC_CTYPE"}


def wait_for(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def stdio(key: str, script: str = ECHO, **fields: Any) -> McpServerConfig:
    return McpServerConfig(
        key=key, transport="stdio", command=sys.executable, args=(script,), **fields
    )


def call(tools: dict[str, BaseTool], tool_name_: str, **arguments: Any) -> ToolResult:
    tool = tools[tool_name_]
    return tool.run(tool.validate_arguments(arguments), ToolContext())


def by_name(hub: McpHub) -> dict[str, BaseTool]:
    return {tool.name: tool for tool in hub.tools()}


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture
def hub() -> Iterator[McpHub]:
    instance = McpHub(start_timeout=30.0, call_timeout=30.0)
    yield instance
    instance.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_http_server(port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, ECHO, "--http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def listening() -> bool:
        assert proc.poll() is None, "the HTTP echo server exited"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        except OSError:
            return False
        return True

    wait_for(listening, f"the HTTP echo server on port {port}")
    return proc


@pytest.fixture
def http_port() -> Iterator[tuple[int, list[subprocess.Popen[bytes]]]]:
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = [start_http_server(port)]
    yield port, procs
    for proc in procs:
        proc.kill()
        proc.wait(10)


# -- .mcp.json ------------------------------------------------------------------------------


def test_both_shapes_give_keyed_servers() -> None:
    wrapped = {
        "mcpServers": {
            "git": {"command": "uvx", "args": ["mcp-server-git"], "env": {"A": "${A:-1}"}},
            "docs": {"type": "http", "url": "https://x.test/mcp", "headers": {"K": "${K}"}},
        }
    }
    servers, problems = parse_mcp_json(wrapped, plugin="tools", plugin_root="/p", where="w")
    assert problems == []
    assert sorted(servers) == ["tools__docs", "tools__git"]
    git = servers["tools__git"]
    assert (git.transport, git.command, git.args, dict(git.env)) == (
        "stdio",
        "uvx",
        ("mcp-server-git",),
        {"A": "${A:-1}"},
    )
    assert (git.plugin, git.plugin_root) == ("tools", "/p")
    docs = servers["tools__docs"]
    assert (docs.transport, docs.url, dict(docs.headers)) == (
        "http",
        "https://x.test/mcp",
        {"K": "${K}"},
    )

    bare, problems = parse_mcp_json(
        {"my.server": {"command": "x"}, "web": {"url": "http://127.0.0.1:1/mcp"}},
        plugin="",
        plugin_root="",
        where="config",
    )
    assert problems == []
    assert bare["my_server"].transport == "stdio"
    assert bare["web"].transport == "http"


def test_a_bad_server_is_a_problem_and_the_others_stay() -> None:
    data = {
        "mcpServers": {
            "good": {"command": "run-me"},
            "old": {"type": "sse", "url": "https://x.test/sse"},
            "nocmd": {"args": ["a"]},
            "badargs": {"command": "x", "args": "a b"},
            "badenv": {"command": "x", "env": {"N": 1}},
            "ftp": {"type": "http", "url": "ftp://x.test/"},
            "ws": {"type": "ws", "url": "ws://x.test/"},
            "a.b": {"command": "x"},
            "a_b": {"command": "y"},
            "b__c": {"command": "z"},
            "list": ["not", "an", "object"],
        }
    }
    servers, problems = parse_mcp_json(data, plugin="p", plugin_root="", where="p/.mcp.json")
    assert sorted(servers) == ["p__a_b", "p__good"]
    text = "\n".join(problems)
    assert len(problems) == 9, text
    assert "mcpServers.b__c: its name may not hold '__'" in text
    assert all(p.startswith("p/.mcp.json: mcpServers.") for p in problems)
    assert "mcpServers.old: sse transport is not supported" in text
    assert "mcpServers.nocmd: a stdio server needs a command" in text
    assert "args must be a list of strings" in text
    assert "env.N must be a string" in text
    assert "'ftp://x.test/' is not an http(s) URL" in text
    assert "transport 'ws' is not supported" in text
    assert "mcpServers.a_b: its key 'p__a_b' is the same as server 'a.b'" in text
    assert "mcpServers.list: expected an object, got a list" in text

    assert parse_mcp_json([1], plugin="", plugin_root="", where="f")[1] == [
        "f: expected a JSON object, got a list"
    ]
    assert (
        "mcpServers must be an object"
        in parse_mcp_json({"mcpServers": []}, plugin="", plugin_root="", where="f")[1][0]
    )


@pytest.mark.skipif(not CORPUS.is_dir(), reason=f"{CORPUS} is not there")
def test_every_mcp_json_of_the_real_marketplace_parses() -> None:
    files = sorted(CORPUS.rglob(".mcp.json"))
    assert files
    for path in files:
        data = json.loads(path.read_text())
        plugin = path.parent.name
        servers, problems = parse_mcp_json(
            data, plugin=plugin, plugin_root=str(path.parent), where=str(path)
        )
        assert problems == [], problems
        assert servers, path
        for config in servers.values():
            assert config.key.startswith(plugin.replace(".", "_"))


def test_expand() -> None:
    env = {"A": "1", "EMPTY": "", "CLAUDE_PLUGIN_ROOT": "/plug"}
    assert expand("${CLAUDE_PLUGIN_ROOT}/bin --a=${A}", env) == "/plug/bin --a=1"
    assert expand("${MISSING:-fallback} ${EMPTY:-d} [${EMPTY}]", env) == "fallback d []"
    assert expand("Bearer ${TOKEN:-}", env) == "Bearer "
    assert expand("no references, $A stays", env) == "no references, $A stays"
    with pytest.raises(McpConfigError, match=r"^\$\{GITHUB_TOKEN\} is not set$"):
        expand("Bearer ${GITHUB_TOKEN}", env)
    with pytest.raises(McpConfigError, match="malformed reference"):
        expand("${A", env)


def test_tool_name() -> None:
    assert tool_name("github_github", "create_issue") == "mcp__github_github__create_issue"
    assert tool_name("p_s", "tool.with spaces/é") == "mcp__p_s__tool_with_spaces__"
    long_a = tool_name("plugin_server", "a" * 80 + "x")
    long_b = tool_name("plugin_server", "a" * 80 + "y")
    assert len(long_a) == len(long_b) == 64
    assert long_a != long_b
    assert long_a[:55] == long_b[:55]
    assert len(tool_name("k", "t" * (64 - len("mcp__k__")))) == 64


# -- the hub over stdio -----------------------------------------------------------------------


def test_stdio_tools_classes_and_calls(hub: McpHub) -> None:
    hub.reconcile({"demo_echo": stdio("demo_echo")})
    tools = by_name(hub)
    classes = {name: tool.tool_class for name, tool in tools.items()}
    assert classes["mcp__demo_echo__echo"] is ToolClass.READ
    assert classes["mcp__demo_echo__note"] is ToolClass.WRITE
    assert classes["mcp__demo_echo__wipe"] is ToolClass.DESTRUCTIVE
    echo = tools["mcp__demo_echo__echo"]
    assert echo.description == "Answer with the text it was given."
    assert echo.parameters["properties"]["text"]["type"] == "string"
    assert echo.parameters["required"] == ["text"]

    assert call(tools, "mcp__demo_echo__echo", text="hello") == ToolResult(
        "hello", data={"result": "hello"}
    )
    noted = call(tools, "mcp__demo_echo__note", text="n1")
    assert (noted.content, noted.is_error) == ("noted: n1", False)
    failed = call(tools, "mcp__demo_echo__fail", reason="no disk")
    assert failed.is_error and "no disk" in failed.content
    picture = call(tools, "mcp__demo_echo__picture")
    assert picture.content == "[image image/png, 4 bytes, not shown]"
    big = call(tools, "mcp__demo_echo__big", size=MAX_RESULT_CHARS + 100)
    assert big.content.startswith("x" * MAX_RESULT_CHARS)
    assert big.content.endswith("[output truncated: 100 more characters not shown]")

    with pytest.raises(ToolArgumentError, match=r"\(arguments\): 'text' is a required property"):
        echo.validate_arguments({})
    with pytest.raises(ToolArgumentError, match="expected an object"):
        echo.validate_arguments(["hello"])  # type: ignore[arg-type]
    with pytest.raises(ToolArgumentError, match="NUL"):
        echo.validate_arguments({"text": "a\0b"})

    status = hub.status()["demo_echo"]
    assert status["state"] == "up" and status["restarts"] == 0 and status["last_error"] == ""
    assert "mcp__demo_echo__wipe" in status["tools"]
    assert psutil.Process(status["pid"]).cmdline()[-1] == ECHO


def test_a_plugins_server_cannot_raise_its_tools_past_its_install(hub: McpHub) -> None:
    """Installed read-only, a plugin's server keeps its read tools; its write and destructive
    ones (by their own annotations) never reach a bag, and its status says why."""
    config = stdio("ops__echo", plugin="ops", max_tool_class="read")
    hub.reconcile({"ops__echo": config})
    tools = by_name(hub)
    assert tools["mcp__ops__echo__echo"].tool_class is ToolClass.READ
    assert tools["mcp__ops__echo__echo"].bundle == "ops"
    assert "mcp__ops__echo__note" not in tools and "mcp__ops__echo__wipe" not in tools
    problems = "\n".join(hub.status()["ops__echo"]["problems"])
    assert "tool 'wipe' left out: its class destructive is more than plugin ops's install" in (
        problems
    )


def test_stdio_server_gets_a_clean_environment_and_the_plugin_root(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    environ = dict(os.environ, ONGRID_TEST_SECRET="s3cret", GIT_REF="main", LANG="C.UTF-8")
    hub = McpHub(environ=environ, allow=["GIT_REF"], start_timeout=30.0)
    try:
        config = stdio(
            "plug_echo",
            env={"DECLARED": "${GIT_REF}", "WHERE": "${CLAUDE_PLUGIN_ROOT}/data"},
            plugin="plug",
            plugin_root=str(tmp_path),
        )
        hub.reconcile({"plug_echo": config})
        tools = by_name(hub)
        keys = set(call(tools, "mcp__plug_echo__env_keys").content.split("\n"))
        ours = {"PATH", "HOME", "LANG", "CLAUDE_PLUGIN_ROOT", "DECLARED", "WHERE"}
        assert keys - ours - SDK_INHERITED - PYTHON_ADDED == set()
        assert {"PATH", "LANG", "DECLARED", "WHERE", "CLAUDE_PLUGIN_ROOT"} <= keys
        assert call(tools, "mcp__plug_echo__env_value", name="DECLARED").content == "main"
        assert call(tools, "mcp__plug_echo__env_value", name="LANG").content == "C.UTF-8"
        where = call(tools, "mcp__plug_echo__env_value", name="WHERE").content
        assert where == f"{tmp_path}/data"
        cwd = call(tools, "mcp__plug_echo__where").content.split()[0]
        assert cwd == str(tmp_path)  # a plugin's server runs in the plugin's folder
        call(tools, "mcp__plug_echo__note", text="into stderr")
        wait_for(lambda: "noted into stderr" in hub.status()["plug_echo"]["stderr"], "stderr lines")
        assert "echo server starting" in hub.status()["plug_echo"]["stderr"]
    finally:
        hub.close()
    printed = capfd.readouterr()
    assert "echo server starting" not in printed.out + printed.err


def test_a_configuration_never_reads_a_secret_or_an_unlisted_variable(tmp_path: Path) -> None:
    """The review's plugin: ``env: {K: ${OPENAI_API_KEY}, R: ${REDIS_URL}, …}``. Every such
    reference is refused (the server does not start, its status says why), whatever the
    allow-list holds; a default stands in for a variable it may not read."""
    environ = dict(
        os.environ,
        OPENAI_API_KEY="sk-canary",
        REDIS_URL="redis://:canary@r/0",
        GRAFANA_URL="http://grafana:3000",
        UNLISTED="canary",
    )
    secrets = {"ONGRID_SKILL_GRAFANA_TOKEN": "skill-canary"}
    hub = McpHub(environ=environ, allow=["GRAFANA_URL"], secrets=secrets, start_timeout=30.0)
    try:
        hostile = {
            "K": "${OPENAI_API_KEY}",
            "R": "${REDIS_URL}",
            "U": "${UNLISTED}",
            "S": "${ONGRID_SKILL_GRAFANA_TOKEN}",
        }
        servers = {
            f"plug_{name.lower()}": stdio(
                f"plug_{name.lower()}", env={name: ref}, plugin="plug", plugin_root=str(tmp_path)
            )
            for name, ref in hostile.items()
        }
        # The config file's own server may read a skill secret and a listed variable; a
        # plugin's falls back to its default for what it may not read.
        servers["own"] = stdio("own", env={"S": "${ONGRID_SKILL_GRAFANA_TOKEN}"})
        servers["plug_ok"] = stdio(
            "plug_ok",
            env={"G": "${GRAFANA_URL}", "D": "${UNLISTED:-fallback}"},
            plugin="plug",
            plugin_root=str(tmp_path),
        )
        hub.reconcile(servers)
        status = hub.status()
        why = {key: status[key]["last_error"] for key in servers}
        assert status["plug_k"]["state"] == "down"
        assert (
            "${OPENAI_API_KEY} is not set (secret-named variables are never expanded"
            in why["plug_k"]
        )
        assert "${REDIS_URL} is not set (secret-named" in why["plug_r"]
        assert "${UNLISTED} is not set (or not listed in mcp_env_allow" in why["plug_u"]
        assert "skill secrets are for the config file's servers, never a plugin's" in why["plug_s"]
        tools = by_name(hub)
        assert call(tools, "mcp__own__env_value", name="S").content == "skill-canary"
        assert call(tools, "mcp__plug_ok__env_value", name="G").content == "http://grafana:3000"
        assert call(tools, "mcp__plug_ok__env_value", name="D").content == "fallback"
        seen = json.dumps(status)
        assert "canary" not in seen.replace("skill-canary", "")
    finally:
        hub.close()


def test_paged_listing_and_structured_content(hub: McpHub) -> None:
    hub.reconcile({"paged": stdio("paged", PAGED)})
    tools = by_name(hub)
    assert sorted(tools) == [f"mcp__paged__tool_{i}" for i in range(5)]
    assert all(tool.tool_class is ToolClass.WRITE for tool in tools.values())
    structured = call(tools, "mcp__paged__tool_0", n=21)
    assert json.loads(structured.content) == {"n": 21, "doubled": 42}
    mixed = call(tools, "mcp__paged__tool_3", n=1)
    assert mixed.content == "tool.3 got 1\n[image image/png, 8 bytes, not shown]"
    with pytest.raises(ToolArgumentError, match="is not of type 'integer'"):
        tools["mcp__paged__tool_3"].validate_arguments({"n": "one"})


def test_mcp_server_time_from_pypi(hub: McpHub) -> None:
    config = McpServerConfig(
        key="clock_time",
        transport="stdio",
        command=sys.executable,
        args=("-m", "mcp_server_time", "--local-timezone", "UTC"),
    )
    hub.reconcile({"clock_time": config})
    tools = by_name(hub)
    assert set(tools) == {"mcp__clock_time__get_current_time", "mcp__clock_time__convert_time"}
    assert tools["mcp__clock_time__get_current_time"].tool_class is ToolClass.READ
    result = call(tools, "mcp__clock_time__get_current_time", timezone="Europe/Paris")
    assert not result.is_error, result.content
    assert json.loads(result.content)["timezone"] == "Europe/Paris"
    bad = call(tools, "mcp__clock_time__get_current_time", timezone="Nowhere/Atlantis")
    assert bad.is_error and "Nowhere/Atlantis" in bad.content


def test_a_killed_server_is_a_tool_error_then_comes_back(hub: McpHub) -> None:
    hub.reconcile({"demo_echo": stdio("demo_echo")})
    tools = by_name(hub)
    pid = hub.status()["demo_echo"]["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: hub.status()["demo_echo"]["state"] != "up", "the hub to see the kill")

    outage = call(tools, "mcp__demo_echo__echo", text="anyone?")
    assert outage.is_error
    assert outage.content.startswith("MCP server demo_echo is not running: ")
    assert "closed the connection" in outage.content
    assert "restart 1" in outage.content

    wait_for(lambda: hub.status()["demo_echo"]["state"] == "up", "the restart")
    status = hub.status()["demo_echo"]
    assert status["restarts"] == 1 and status["pid"] != pid
    again = call(tools, "mcp__demo_echo__echo", text="back")  # the tools held before the kill
    assert (again.content, again.is_error) == ("back", False)


def test_a_command_that_does_not_exist_is_a_status(hub: McpHub) -> None:
    missing = McpServerConfig(key="ghost", transport="stdio", command="no-such-mcp-server-cmd")
    unset = stdio("locked", env={"TOKEN": "${ONGRID_TEST_NEVER_SET}"})
    hub.reconcile({"ghost": missing, "locked": unset, "demo_echo": stdio("demo_echo")})
    status = hub.status()
    assert status["ghost"]["state"] in {"down", "starting"}
    assert (
        "cannot start 'no-such-mcp-server-cmd': No such file or directory"
        in (status["ghost"]["last_error"])
    )
    assert status["ghost"]["tools"] == []
    assert status["locked"]["state"] == "down"
    assert status["locked"]["last_error"].startswith("${ONGRID_TEST_NEVER_SET} is not set")
    assert status["locked"]["retry_in"] is None
    assert status["demo_echo"]["state"] == "up"  # the others run regardless
    assert not [t for t in hub.tools() if "ghost" in t.name or "locked" in t.name]


def test_removed_and_changed_servers_end_their_process(hub: McpHub) -> None:
    first = stdio("demo_echo", env={"V": "1"})
    hub.reconcile({"demo_echo": first, "other": stdio("other")})
    held = by_name(hub)
    pid, other_pid = hub.status()["demo_echo"]["pid"], hub.status()["other"]["pid"]

    hub.reconcile({"demo_echo": stdio("demo_echo", env={"V": "2"}), "other": stdio("other")})
    wait_for(lambda: gone(pid), f"the old process {pid} to end")
    status = hub.status()
    assert status["demo_echo"]["pid"] not in (None, pid)
    assert status["other"]["pid"] == other_pid  # unchanged: left running
    assert call(by_name(hub), "mcp__demo_echo__env_value", name="V").content == "2"

    hub.reconcile({})
    wait_for(lambda: gone(other_pid), f"the removed server's process {other_pid} to end")
    assert hub.status() == {} and hub.tools() == []
    stale = call(held, "mcp__other__echo", text="x")
    assert stale.is_error and "not configured" in stale.content


def test_close_ends_every_process() -> None:
    hub = McpHub(start_timeout=30.0)
    hub.reconcile({"a": stdio("a"), "b": stdio("b", PAGED)})
    pids = [s["pid"] for s in hub.status().values()]
    assert all(pids)
    hub.close()
    wait_for(lambda: all(gone(pid) for pid in pids), f"processes {pids} to end")
    assert {s["state"] for s in hub.status().values()} == {"stopped"}
    with pytest.raises(RuntimeError, match="closed"):
        hub.reconcile({})


def test_reconcile_waits_no_longer_than_asked(hub: McpHub) -> None:
    hub.reconcile({"demo_echo": stdio("demo_echo")}, wait=0)
    wait_for(lambda: bool(hub.tools()), "the tools of a server still starting")
    assert hub.status()["demo_echo"]["state"] == "up"


def test_a_call_that_outlasts_its_timeout() -> None:
    hub = McpHub(start_timeout=30.0, call_timeout=1.0)
    try:
        hub.reconcile({"demo_echo": stdio("demo_echo")})
        tools = by_name(hub)
        slow = call(tools, "mcp__demo_echo__nap", seconds=10)
        assert slow.is_error
        assert slow.content.startswith("MCP server demo_echo did not answer nap within 1s")
        assert call(tools, "mcp__demo_echo__echo", text="still here").content == "still here"
    finally:
        hub.close()


def test_calls_from_many_threads(hub: McpHub) -> None:
    hub.reconcile({"demo_echo": stdio("demo_echo")})
    tools = by_name(hub)
    results: dict[int, ToolResult] = {}

    def worker(n: int) -> None:
        results[n] = call(tools, "mcp__demo_echo__echo", text=f"call {n}")

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert {n: r.content for n, r in results.items()} == {n: f"call {n}" for n in range(8)}


# -- the hub over streamable HTTP -------------------------------------------------------------


def test_http_server_calls_outage_and_return(
    http_port: tuple[int, list[subprocess.Popen[bytes]]],
) -> None:
    port, procs = http_port
    config = McpServerConfig(
        key="remote",
        transport="http",
        url="http://127.0.0.1:${ECHO_PORT}/mcp",
        headers={"Authorization": "${ONGRID_TEST_NO_TOKEN:-}", "X-Client": "ongrid"},
    )
    environ = dict(os.environ, ECHO_PORT=str(port))
    hub = McpHub(environ=environ, allow=["ECHO_PORT"], start_timeout=30.0)
    try:
        hub.reconcile({"remote": config})
        http_outage_and_return(hub, procs, port)
    finally:
        hub.close()


def http_outage_and_return(hub: McpHub, procs: list[subprocess.Popen[bytes]], port: int) -> None:
    status = hub.status()["remote"]
    assert (status["state"], status["transport"], status["pid"]) == ("up", "http", None)
    tools = by_name(hub)
    assert tools["mcp__remote__wipe"].tool_class is ToolClass.DESTRUCTIVE
    assert tools["mcp__remote__note"].tool_class is ToolClass.WRITE
    assert call(tools, "mcp__remote__echo", text="over http").content == "over http"

    procs[0].kill()
    procs[0].wait(10)
    outage = call(tools, "mcp__remote__echo", text="anyone?")
    assert outage.is_error and outage.content.startswith("MCP server remote ")
    wait_for(lambda: hub.status()["remote"]["state"] != "up", "the hub to see the outage")

    procs.append(start_http_server(port))
    wait_for(lambda: hub.status()["remote"]["state"] == "up", "the HTTP server's return", 60.0)
    assert call(tools, "mcp__remote__echo", text="again").content == "again"
    assert hub.status()["remote"]["restarts"] >= 1


def test_http_server_that_is_not_there(hub: McpHub) -> None:
    config = McpServerConfig(
        key="nowhere", transport="http", url=f"http://127.0.0.1:{free_port()}/mcp"
    )
    hub.reconcile({"nowhere": config})
    status = hub.status()["nowhere"]
    assert status["state"] in {"down", "starting"}
    assert "ConnectError" in status["last_error"]


def test_a_server_that_dies_at_start_says_why(hub: McpHub) -> None:
    crash = McpServerConfig(
        key="crash",
        transport="stdio",
        command=sys.executable,
        args=("-c", "import sys; print('config file /etc/x.toml is missing', file=sys.stderr)"),
    )
    hub.reconcile({"crash": crash})
    wait_for(lambda: hub.status()["crash"]["last_error"] != "", "the first failure")
    status = hub.status()["crash"]
    assert status["last_error"] == (
        "it exited (or closed its output) before it had listed its tools; "
        "its stderr ends: config file /etc/x.toml is missing"
    )
    assert status["stderr"][-1] == "config file /etc/x.toml is missing"


def test_a_server_that_never_answers_is_stopped_after_the_start_timeout() -> None:
    hub = McpHub(start_timeout=2.0)
    try:
        mute = McpServerConfig(
            key="mute",
            transport="stdio",
            command=sys.executable,
            args=("-c", "import time; time.sleep(120)"),
        )
        hub.reconcile({"mute": mute}, wait=0)
        wait_for(lambda: hub.status()["mute"]["pid"] is not None, "the process to start")
        pid = hub.status()["mute"]["pid"]
        wait_for(lambda: hub.status()["mute"]["last_error"] != "", "the start timeout")
        assert hub.status()["mute"]["last_error"].startswith(
            "it did not finish initialize and tools/list within 2s"
        )
        assert gone(pid)  # the attempt ended its process before it counted as failed
    finally:
        hub.close()
