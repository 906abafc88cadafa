"""The floor: N conversations × T turns of bare litellm in one asyncio process.

    .venv/bin/python bench/floor.py [--n 200] [--turns 5] [--delay 5] [--chunks 40]
                                    [--path cheapest|stream|default|aiohttp|SPEC] [--base-url URL]

Any litellm-based engine pays at least this much per model turn, so the worker's figures are read
against it: the same load with no Celery, no Redis, no events. Each conversation calls
``get_edge_summary`` (answered ``{}`` at once) until its last turn, which is text; all are started
at once against ``bench/fast_fake.py`` (started here unless ``--base-url`` names one), which
waits ``delay`` s per turn and streams ``chunks`` chunks.

Paths: ``default`` is ``acompletion(stream=True)`` with litellm's defaults and
``stream_options.include_usage``, as a worker streams today; ``stream`` the cheapest streaming
variant ``bench/litellm_paths.py`` measured (streaming logging and callbacks off, the model's
price registered, the connector sized); ``cheapest`` the cheapest path it measured
(``acompletion`` without streaming, callbacks off, the price registered, litellm's aiohttp
connector sized for the load: by default it holds 500 connections per host and queues the
rest); ``aiohttp`` a plain ``aiohttp`` client streaming (no litellm at all: the reference, not a
path to ship); or any ``bench/litellm_paths.py`` variant as ``a:setting,setting``.

Figures: per-conversation efficiency = ideal (T × D) ÷ (end of its last reply − its start),
median; CPU ms per model turn (the process's CPU over the run ÷ turns); RSS per conversation in
flight ((peak − idle) ÷ N); repeats counted at the fake. ``run_floor`` runs it in a fresh process
(litellm's settings are process globals) and returns the figures, for a combined benchmark.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import fast_fake  # noqa: E402 - bench/ is not a package; its modules import each other by path
import litellm_paths as lp  # noqa: E402

TOOL = "get_edge_summary"
ALIASES = {
    "default": "a:usage",
    "stream": "a:nostreamlog,nocallbacks,price,usage,connector",
    "cheapest": "b:nocallbacks,price,connector",
    "aiohttp": "e:stream,aiohttp",
}


def _variant(path: str) -> tuple[str, tuple[str, ...]]:
    spec = ALIASES.get(path, path)
    letter, _, settings = spec.partition(":")
    if letter not in "abe" or len(letter) != 1:
        raise SystemExit(
            f"floor path {path!r}: use cheapest, stream, default, aiohttp or a:/b:/e:SETTINGS"
        )
    return letter, tuple(s for s in settings.split(",") if s)


class _Caller:
    """One model turn through the chosen path: messages in, (text, tool calls) out."""

    def __init__(self, variant: tuple[str, tuple[str, ...]], base_url: str, n: int) -> None:
        self.letter, self.settings = variant
        self.base_url = base_url
        self.session: Any = None  # aiohttp's, made on the loop that uses it
        if self.letter != "e":
            self.litellm = lp._configure(self.settings, n)

    async def __call__(self, messages: list[dict[str, Any]]) -> tuple[str, list[dict]]:
        if self.letter == "e":
            return await self._raw(messages)
        tools = [{"type": "function", "function": {"name": TOOL, "parameters": {}}}]
        request = {**lp._request(self.base_url, 0, 0, "usage" in self.settings), "tools": tools}
        request["messages"] = messages
        if self.letter == "b":
            response = await self.litellm.acompletion(**request)
            message = response.choices[0].message
            calls = [
                {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                for c in message.tool_calls or ()
            ]
            return message.content or "", calls
        text, calls = [], []
        response = await self.litellm.acompletion(stream=True, **request)
        async for chunk in response:
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            if delta.content:
                text.append(delta.content)
            for c in delta.tool_calls or ():
                calls.append({"id": c.id, "name": c.function.name, "arguments": "{}"})
        return "".join(text), calls

    async def _raw(self, messages: list[dict[str, Any]]) -> tuple[str, list[dict]]:
        import aiohttp

        if self.session is None:
            self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        body = {"model": "bench-model", "messages": messages, "stream": True}
        body["stream_options"] = {"include_usage": True}
        text, calls = [], []
        async with self.session.post(f"{self.base_url}/chat/completions", json=body) as response:
            async for raw in response.content:
                line = raw.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if not chunk["choices"]:
                    continue
                delta = chunk["choices"][0]["delta"]
                text.append(delta.get("content") or "")
                calls += [
                    {"id": c["id"], "name": c["function"]["name"], "arguments": "{}"}
                    for c in delta.get("tool_calls") or ()
                ]
        return "".join(text), calls


async def _conversation(call: _Caller, i: int, turns: int, delay: float, chunks: int) -> int:
    directive = f"fastfake: delay={delay} chunks={chunks} turns={turns} tool={TOOL}"
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": f"Investigate briefly. {directive}"},
        {"role": "user", "content": f"floor conversation {i}"},
    ]
    for turn in range(turns):
        text, calls = await call(messages)
        if not calls:
            return turn + 1
        fn_calls = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": "{}"}}
            for c in calls
        ]
        messages.append({"role": "assistant", "content": text or None, "tool_calls": fn_calls})
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": "{}"} for c in calls]
    return turns


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


async def _run(
    variant: tuple[str, tuple[str, ...]],
    base_url: str,
    n: int,
    turns: int,
    delay: float,
    chunks: int,
) -> dict[str, Any]:
    call = _Caller(variant, base_url, n)
    await asyncio.gather(*(_conversation(call, -1 - i, 1, 0.0, chunks) for i in range(8)))
    idle = _rss()
    peak = idle

    async def sample() -> None:
        nonlocal peak
        while True:
            peak = max(peak, _rss())
            await asyncio.sleep(0.1)

    sampler = asyncio.create_task(sample())
    spans: list[float] = []
    done_turns: list[int] = []

    async def timed(i: int) -> None:
        start = time.perf_counter()
        done_turns.append(await _conversation(call, i, turns, delay, chunks))
        spans.append(time.perf_counter() - start)

    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(timed(i) for i in range(n)))
    wall = time.perf_counter() - wall0
    await asyncio.sleep(0.3)  # litellm's deferred logging of the last replies
    cpu = time.process_time() - cpu0
    sampler.cancel()
    if call.session is not None:
        await call.session.close()
    model_turns = sum(done_turns)
    return {
        "path": lp.label(*variant),
        "n": n,
        "turns": turns,
        "delay": delay,
        "chunks": chunks,
        "efficiency_median": statistics.median(turns * delay / s for s in spans),
        "efficiency_p10": sorted(turns * delay / s for s in spans)[len(spans) // 10],
        "cpu_ms_per_turn": cpu / model_turns * 1000,
        "cpu_seconds": cpu,
        "model_turns": model_turns,
        "wall_s": wall,
        "rss_idle_mb": idle / 2**20,
        "rss_peak_mb": peak / 2**20,
        "rss_kb_per_conversation": (peak - idle) / n / 1024,
    }


def run_floor(
    n: int,
    turns: int,
    delay: float,
    chunks: int,
    path: str = "cheapest",
    base_url: str | None = None,
) -> dict[str, Any]:
    """The floor's figures for this load, measured in a fresh process; starts a fast_fake unless
    ``base_url`` names one. Repeats and the fake's CPU are read from the fake's ``/_stats``."""
    if base_url is None:
        with fast_fake.running() as fake:
            return run_floor(n, turns, delay, chunks, path, fake.base_url)
    _variant(path)  # fail here, not in the child
    import httpx

    httpx.post(f"{base_url}/_reset", timeout=30)  # its peak of open streams is this run's
    before = _fake_stats(base_url)
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        argv = [sys.executable, __file__, "--child", "--base-url", base_url, "--path", path]
        argv += ["--n", str(n), "--turns", str(turns), "--delay", str(delay)]
        argv += ["--chunks", str(chunks), "--json", out.name]
        subprocess.run(argv, check=True)
        figures = dict(json.loads(Path(out.name).read_text()))
    after = _fake_stats(base_url)
    figures["repeats"] = after["repeats"] - before["repeats"]
    figures["fake_requests"] = after["requests"] - before["requests"]
    figures["fake_cpu_seconds"] = after["cpu_seconds"] - before["cpu_seconds"]
    figures["fake_open_streams_peak"] = after["open_streams_peak"]
    return figures


def _fake_stats(base_url: str) -> dict[str, Any]:
    import httpx

    return dict(httpx.get(f"{base_url}/_stats", timeout=30).json())


def describe(f: dict[str, Any]) -> str:
    return (
        f"floor {f['path']}: {f['n']} × {f['turns']} turns × {f['delay']:g} s, {f['chunks']} "
        f"chunks: efficiency median {f['efficiency_median']:.3f} (p10 {f['efficiency_p10']:.3f}), "
        f"{f['cpu_ms_per_turn']:.2f} ms CPU per model turn, RSS {f['rss_kb_per_conversation']:.0f}"
        f" KB per conversation ({f['rss_peak_mb']:.0f} MB peak, {f['rss_idle_mb']:.0f} MB idle), "
        f"{f['repeats']} repeats of {f['fake_requests']} requests, wall {f['wall_s']:.1f} s, "
        f"fake {f['fake_cpu_seconds']:.2f} s CPU (peak {f['fake_open_streams_peak']} open)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--delay", type=float, default=5.0)
    parser.add_argument("--chunks", type=int, default=40)
    parser.add_argument(
        "--path", default="cheapest", help="cheapest, stream, default, aiohttp or a SPEC"
    )
    parser.add_argument("--base-url", help="a running fast_fake's /v1 URL")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        try:
            import uvloop
        except ImportError:
            runner: Any = asyncio.run
        else:
            runner = uvloop.run
        variant = _variant(args.path)
        figures = runner(_run(variant, args.base_url, args.n, args.turns, args.delay, args.chunks))
        args.json.write_text(json.dumps(figures))
        return
    figures = run_floor(args.n, args.turns, args.delay, args.chunks, args.path, args.base_url)
    print(describe(figures))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
