"""What installed plugins cost: the registry reload, and a call of an MCP tool through the hub.

- **reload**: :meth:`AgentRegistry.reload` with every plugin of a marketplace installed, against
  the same reload with an empty marketplace root (the shipped personas only, in both);
- **install**: ``PluginManager.install`` of each plugin (copy, check, hash, pack, load), per plugin;
- **another host**: the first reload of a registry on an empty marketplace root of its own, which
  unpacks every plugin from the database, then its later reloads (the database is asked which
  copies it holds each time) against the installing host's reload;
- **MCP call**: ``McpTool.run`` of ``mcp-server-time``'s ``get_current_time`` through
  :class:`marketplace.mcp.McpHub` (validation, the hub's loop, rendering), against the bare SDK:
  one ``ClientSession.call_tool`` on a session opened once, in one event loop.

The marketplace is the official one of the shared corpus when it is beside the checkout, else a
synthetic one of ``--plugins`` plugins (3 agents and 2 skills each). Each figure is the median of
``--runs`` after one run that is not counted.

    python -m bench.plugins [--runs 20] [--calls 200] [--plugins 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from coordinator.plugin_manager import PluginManager
from coordinator.storage.engine import make_engine, upgrade
from coordinator.storage.plugins import PluginStore
from marketplace.model import McpServerConfig
from registry.defaults import build_registry
from registry.settings import Settings
from registry.tools import ToolContext

CORPUS = (
    Path(__file__).resolve().parents[2]
    / "shared/corpus/marketplaces/anthropics__claude-plugins-official"
)


def _median(run: Callable[[], object], runs: int) -> float:
    run()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _synthetic(root: Path, count: int) -> Path:
    plugins = []
    for i in range(count):
        plugin = root / "plugins" / f"p{i}"
        for a in range(3):
            agents = plugin / "agents"
            agents.mkdir(parents=True, exist_ok=True)
            text = f"---\nname: a{a}\ndescription: Agent {a} of p{i}.\n---\n\n# Agent {a}\n"
            (agents / f"a{a}.md").write_text(text)
        for s in range(2):
            skill = plugin / "skills" / f"s{s}"
            skill.mkdir(parents=True)
            text = f"---\nname: s{s}\ndescription: Skill {s}.\n---\n\n" + "Step.\n" * 200
            (skill / "SKILL.md").write_text(text)
        plugins.append({"name": f"p{i}", "source": f"./plugins/p{i}"})
    meta = root / ".claude-plugin"
    meta.mkdir(parents=True)
    data = {"name": "synthetic", "owner": {"name": "bench"}, "plugins": plugins}
    (meta / "marketplace.json").write_text(json.dumps(data))
    return root


def bench_reload(work: Path, runs: int, count: int) -> None:
    source = CORPUS if CORPUS.is_dir() else _synthetic(work / "market", count)
    engine = make_engine(f"sqlite:///{work / 'db.sqlite'}")
    upgrade(engine)
    root = work / "root"
    manager = PluginManager(root, PluginStore(engine), broadcast=lambda: 0)
    market = manager.add_marketplace(str(source))["name"]
    names = [r["name"] for r in manager.available(market) if r["reachable"]]
    start = time.perf_counter()
    for name in names:
        manager.install(f"{name}@{market}")
    install = (time.perf_counter() - start) / len(names)

    def registry(marketplace_root: Path, plugins: PluginStore | None = None) -> object:
        settings = Settings.load(environ={"ONGRID_MARKETPLACE_ROOT": str(marketplace_root)})
        return build_registry(settings, plugins=plugins)

    start = time.perf_counter()
    elsewhere = registry(work / "other-host", PluginStore(engine))
    first_unpack = time.perf_counter() - start
    with_plugins, empty = registry(root), registry(work / "empty")
    synced = _median(elsewhere.reload, runs)  # type: ignore[attr-defined]
    snapshot = with_plugins.snapshot()  # type: ignore[attr-defined]
    plugin_personas = sum(1 for n in snapshot.personas if ":" in n)
    full = _median(with_plugins.reload, runs)  # type: ignore[attr-defined]
    bare = _median(empty.reload, runs)  # type: ignore[attr-defined]
    print(f"marketplace: {'corpus' if source == CORPUS else 'synthetic'}, {len(names)} plugins")
    print(f"  installed: {plugin_personas} personas, {len(snapshot.bundle.skills)} skills")
    print(f"  install, per plugin:          {install * 1000:8.1f} ms")
    print(f"  reload with the plugins:      {full * 1000:8.1f} ms")
    print(f"  reload without (shipped only): {bare * 1000:7.1f} ms")
    print(f"  ratio:                         {full / bare:7.1f}x")
    print(f"  another host, first reload (unpacks all): {first_unpack * 1000:8.1f} ms")
    print(f"  another host, later reloads:  {synced * 1000:8.1f} ms ({synced / full:.2f}x)")


def bench_mcp(calls: int) -> None:
    from marketplace.mcp import McpHub

    args = ("-m", "mcp_server_time", "--local-timezone", "UTC")
    config = McpServerConfig(key="bench_time", transport="stdio", command=sys.executable, args=args)
    hub = McpHub()
    try:
        hub.reconcile({"bench_time": config})
        tool = next(t for t in hub.tools() if t.name.endswith("get_current_time"))
        context = ToolContext()

        def through_hub() -> None:
            for _ in range(calls):
                result = tool.run(tool.validate_arguments({"timezone": "UTC"}), context)
                assert not result.is_error, result.content

        hub_seconds = _median(through_hub, 3) / calls
    finally:
        hub.close()
    bare_seconds = asyncio.run(_bare_sdk(calls, args)) / calls
    print(f"MCP get_current_time (mcp-server-time over stdio), {calls} calls in sequence:")
    print(f"  through the hub: {hub_seconds * 1000:6.2f} ms per call")
    print(f"  bare SDK:        {bare_seconds * 1000:6.2f} ms per call")
    print(f"  ratio:           {hub_seconds / bare_seconds:6.2f}x")


async def _bare_sdk(calls: int, args: tuple[str, ...]) -> float:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(command=sys.executable, args=list(args))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        for _ in range(20):
            await session.call_tool("get_current_time", {"timezone": "UTC"})
        times = []
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(calls):
                await session.call_tool("get_current_time", {"timezone": "UTC"})
            times.append(time.perf_counter() - start)
        return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--plugins", type=int, default=50)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        bench_reload(Path(work), options.runs, options.plugins)
    bench_mcp(options.calls)


if __name__ == "__main__":
    main()
