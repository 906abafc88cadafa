"""CPU per model call of each way through litellm, to choose the worker's model adapter path.

    .venv/bin/python bench/litellm_paths.py [--n 200] [--delay 0.5] [--chunks 2,4,40]
                                            [--only a:all,e:stream] [--profile] [--json FILE]

The runtime's cost per model turn is dominated by litellm, not by the model's wait, so the path
through it decides how many spawns one process holds. Against ``bench/fast_fake.py`` (its own
process), each variant runs in a fresh Python process (litellm's settings are module globals)
and makes ``n`` concurrent calls, each waiting ``delay`` s at the server, for replies of each
chunk count; the figure is that process's CPU time (``time.process_time()``, every thread)
÷ calls, after a short settle so litellm's deferred logging is counted too. Per streamed chunk:
the slope between the smallest and largest chunk counts.

Paths: (a) ``acompletion(stream=True)`` iterated with ``async for``; (b) ``acompletion``
without streaming; (c) ``completion(stream=True)`` in a 64-thread pool; (d) ``completion``
without streaming in that pool; (e) plain ``httpx.AsyncClient`` (the reference, not a path to
ship); (f) the runtime's own adapter, streamed and in one piece (its direct path). Settings of
(a)/(b), each alone on top of litellm's defaults, then all together:
``disable_streaming_logging``, no callbacks, ``turn_off_message_logging``, a registered price for
the unmapped model, a shared ``aclient_session`` sized for the concurrency (a plain httpx
client, or litellm's own aiohttp transport), litellm's aiohttp connector sized for the
concurrency (``connector``: ``AIOHTTP_CONNECTOR_LIMIT``/``_PER_HOST``, 1000/500 by default), and
``stream_options={"include_usage": True}``. ``--profile`` records the best (a) variant with py-spy
and prints the functions with most CPU per chunk. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

MODEL = "openai/bench-model"  # not in litellm's price map, like most self-hosted models
POOL_THREADS = 64
SETTINGS = ("nostreamlog", "nocallbacks", "nomsglog", "price", "session", "usage")

#: (path, settings) of every variant measured, in table order.
VARIANTS: list[tuple[str, tuple[str, ...]]] = [
    ("a", ()),
    *[("a", (s,)) for s in SETTINGS],
    ("a", SETTINGS),
    ("a", tuple(s for s in SETTINGS if s != "usage")),
    ("a", (*SETTINGS, "asyncio")),
    ("a", ("aiosession",)),
    ("a", ("nostreamlog", "nocallbacks", "price", "usage")),
    ("a", ("nostreamlog", "nocallbacks", "price", "usage", "aiosession")),
    ("a", ("nostreamlog", "nocallbacks", "price", "usage", "connector")),
    ("b", ()),
    *[("b", (s,)) for s in ("nocallbacks", "nomsglog", "price", "session", "aiosession")],
    ("b", ("nocallbacks", "nomsglog", "price", "session", "nostreamlog")),
    ("b", ("nocallbacks", "price")),
    ("b", ("nocallbacks", "price", "aiosession")),
    ("b", ("nocallbacks", "price", "connector")),
    ("c", ()),
    ("c", SETTINGS),
    ("d", ()),
    ("d", ("nocallbacks", "nomsglog", "price", "session", "nostreamlog")),
    ("e", ("stream",)),
    ("e", ()),
    ("e", ("stream", "smallpool")),
    ("e", ("smallpool",)),
    ("e", ("stream", "aiohttp")),
    ("e", ("aiohttp",)),
    ("f", ("stream",)),
    ("f", ()),
]
PATH_NAMES = {
    "a": "acompletion stream",
    "b": "acompletion",
    "c": f"completion stream, {POOL_THREADS} threads",
    "d": f"completion, {POOL_THREADS} threads",
    "e": "httpx.AsyncClient",
    "f": "the runtime's adapter (workers._litellm)",
}


def label(path: str, settings: tuple[str, ...]) -> str:
    if path == "e":
        client = "aiohttp" if "aiohttp" in settings else "httpx"
        pool = ", default pool" if "smallpool" in settings else ""
        return f"(e) {client} {'stream' if 'stream' in settings else 'JSON'}{pool}"
    if path == "f":
        return f"(f) {PATH_NAMES[path]}, {'streamed' if 'stream' in settings else 'one piece'}"
    if not settings:
        return f"({path}) {PATH_NAMES[path]}, defaults"
    if set(SETTINGS) <= set(settings):
        rest = [s for s in settings if s not in SETTINGS]
        return f"({path}) {PATH_NAMES[path]}, all settings" + "".join(f" +{s}" for s in rest)
    return f"({path}) {PATH_NAMES[path]}, +{'+'.join(settings)}"


# --- one variant, in its own process ------------------------------------------------------------


def _configure(settings: tuple[str, ...], n: int) -> Any:
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    os.environ.setdefault("LITELLM_LOG", "ERROR")
    if "connector" in settings:
        # litellm's aiohttp connector holds at most 1000 connections, 500 per host, read from
        # these variables when litellm is imported: above 500 calls to one provider queue.
        os.environ["AIOHTTP_CONNECTOR_LIMIT"] = str(n + 64)
        os.environ["AIOHTTP_CONNECTOR_LIMIT_PER_HOST"] = str(n + 64)
    import httpx
    import litellm

    litellm.telemetry = False
    litellm.suppress_debug_info = True
    if "nostreamlog" in settings:
        litellm.disable_streaming_logging = True
    if "nocallbacks" in settings:
        litellm.callbacks = []
        litellm.success_callback = []
        litellm.failure_callback = []
        litellm._async_success_callback = []
        litellm._async_failure_callback = []
    if "nomsglog" in settings:
        litellm.turn_off_message_logging = True
    if "price" in settings:
        price = {
            "input_cost_per_token": 1e-7,
            "output_cost_per_token": 2e-7,
            "litellm_provider": "openai",
            "mode": "chat",
        }
        litellm.register_model({MODEL: price, MODEL.split("/", 1)[1]: price})
    if "session" in settings:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=n + 64)
        timeout = httpx.Timeout(600.0, connect=30.0)
        litellm.aclient_session = httpx.AsyncClient(limits=limits, timeout=timeout)
        litellm.client_session = httpx.Client(limits=limits, timeout=timeout)
    if "aiosession" in settings:
        # litellm's own default transport (aiohttp, its connector limited to 1000), shared.
        from litellm.llms.custom_httpx.http_handler import AsyncHTTPHandler

        transport = AsyncHTTPHandler.create_async_transport()
        litellm.aclient_session = httpx.AsyncClient(transport=transport, timeout=600.0)
    return litellm


def _request(base_url: str, chunks: int, i: int, usage: bool) -> dict[str, Any]:
    messages = [
        {"role": "system", "content": f"fastfake: chunks={chunks}"},
        {"role": "user", "content": f"call {i}"},
    ]
    extra = {"stream_options": {"include_usage": True}} if usage else {}
    return {"model": MODEL, "messages": messages, "api_base": base_url, "api_key": "sk-x", **extra}


async def _async_batch(litellm: Any, stream: bool, requests: list[dict[str, Any]]) -> Counter:
    received: Counter[str] = Counter()

    async def one(request: dict[str, Any]) -> None:
        if stream:
            response = await litellm.acompletion(stream=True, **request)
            async for chunk in response:
                received["chunks"] += 1
                if chunk.choices and chunk.choices[0].delta.content:
                    received["text"] += 1
        else:
            response = await litellm.acompletion(**request)
            received["text"] += bool(response.choices[0].message.content)
        received["calls"] += 1

    await asyncio.gather(*(one(r) for r in requests))
    return received


async def _adapter_batch(model: Any, stream: bool, requests: list[dict[str, Any]]) -> Counter:
    """Through the runtime's adapter: one piece takes its direct path (workers._litellm_direct),
    streamed its lean ``acompletion``."""
    from workers.messages import Message
    from workers.model import ModelReply, ModelRequest

    received: Counter[str] = Counter()

    async def one(request: dict[str, Any]) -> None:
        messages = [Message(role=m["role"], content=m["content"]) for m in request["messages"]]
        asked = ModelRequest(model=request["model"], messages=messages, stream=stream)
        async for item in model.stream(asked):
            if isinstance(item, str):
                received["chunks"] += 1
            elif isinstance(item, ModelReply):
                received["text"] += bool(item.message.content)
        received["calls"] += 1

    await asyncio.gather(*(one(r) for r in requests))
    return received


def _sync_batch(litellm: Any, stream: bool, requests: list[dict[str, Any]]) -> Counter:
    received: Counter[str] = Counter()

    def one(request: dict[str, Any]) -> None:
        if stream:
            for chunk in litellm.completion(stream=True, **request):
                received["chunks"] += 1  # Counter updates are atomic enough under the GIL here
                if chunk.choices and chunk.choices[0].delta.content:
                    received["text"] += 1
        else:
            response = litellm.completion(**request)
            received["text"] += bool(response.choices[0].message.content)
        received["calls"] += 1

    with ThreadPoolExecutor(POOL_THREADS) as pool:
        list(pool.map(one, requests))
    return received


async def _httpx_batch(client: Any, base_url: str, stream: bool, requests: list[dict]) -> Counter:
    received: Counter[str] = Counter()

    async def one(request: dict[str, Any]) -> None:
        body = {"model": "bench-model", "messages": request["messages"], "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
            url = f"{base_url}/chat/completions"
            async with client.stream("POST", url, json=body) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        chunk = json.loads(line[6:])
                        received["chunks"] += 1
                        if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                            received["text"] += 1
        else:
            response = await client.post(f"{base_url}/chat/completions", json=body)
            received["text"] += bool(response.json()["choices"][0]["message"]["content"])
        received["calls"] += 1

    await asyncio.gather(*(one(r) for r in requests))
    return received


async def _aiohttp_batch(
    sessions: list[Any], base_url: str, stream: bool, requests: list[dict]
) -> Counter:
    import aiohttp

    if not sessions:  # made on the loop that uses it, kept for every batch
        sessions.append(aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)))
    session = sessions[0]
    received: Counter[str] = Counter()

    async def one(request: dict[str, Any]) -> None:
        body = {"model": "bench-model", "messages": request["messages"], "stream": stream}
        url = f"{base_url}/chat/completions"
        if stream:
            body["stream_options"] = {"include_usage": True}
        async with session.post(url, json=body) as response:
            if stream:
                async for raw in response.content:
                    line = raw.strip()
                    if line.startswith(b"data: ") and line != b"data: [DONE]":
                        chunk = json.loads(line[6:])
                        received["chunks"] += 1
                        if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                            received["text"] += 1
            else:
                reply = await response.json()
                received["text"] += bool(reply["choices"][0]["message"]["content"])
        received["calls"] += 1

    await asyncio.gather(*(one(r) for r in requests))
    return received


def _measure(
    batch: Callable[[list[dict]], Counter],
    make: Callable[[int, int], dict],
    n: int,
    chunk_counts: list[int],
    rounds: int,
) -> dict[str, Any]:
    batch([make(c, -1 - i) for c in chunk_counts for i in range(8)])  # warm: imports, sockets
    out: dict[str, Any] = {}
    for chunks in chunk_counts:
        best: dict[str, Any] | None = None
        for r in range(rounds):
            requests = [make(chunks, r * n + i) for i in range(n)]
            cpu0, wall0 = time.process_time(), time.perf_counter()
            received = batch(requests)
            wall = time.perf_counter() - wall0
            time.sleep(0.3)  # litellm finishes its logging after the reply; count it
            cpu = time.process_time() - cpu0
            figure = {"cpu_ms_per_call": cpu / n * 1000, "wall_s": wall, **received}
            if best is None or figure["cpu_ms_per_call"] < best["cpu_ms_per_call"]:
                best = figure
        out[str(chunks)] = best
    return out


def run_variant(
    path: str,
    settings: tuple[str, ...],
    base_url: str,
    n: int,
    chunk_counts: list[int],
    rounds: int,
) -> dict[str, Any]:
    usage = "usage" in settings
    if path == "e":
        import httpx

        stream = "stream" in settings
        loop = _new_loop(settings)
        if "aiohttp" in settings:
            sessions: list[Any] = []

            def batch(requests: list[dict]) -> Counter:
                return loop.run_until_complete(_aiohttp_batch(sessions, base_url, stream, requests))

        else:
            # httpcore's pool scans every connection it holds for each request: a pool kept as
            # large as the concurrency costs more CPU than reconnecting above httpx's default 20.
            sized = httpx.Limits(max_connections=None, max_keepalive_connections=n + 64)
            limits = httpx.Limits() if "smallpool" in settings else sized
            client = httpx.AsyncClient(limits=limits, timeout=600.0)

            def batch(requests: list[dict]) -> Counter:
                return loop.run_until_complete(_httpx_batch(client, base_url, stream, requests))

    elif path == "f":
        sys.path.insert(0, str(HERE.parent))
        from workers._litellm import LitellmModel

        stream = "stream" in settings
        loop = _new_loop(settings)
        model = LitellmModel(api_base=base_url, api_key="sk-x")

        def batch(requests: list[dict]) -> Counter:
            return loop.run_until_complete(_adapter_batch(model, stream, requests))

    else:
        litellm = _configure(settings, n)
        stream = path in "ac"
        if path in "ab":
            loop = _new_loop(settings)

            def batch(requests: list[dict]) -> Counter:
                return loop.run_until_complete(_async_batch(litellm, stream, requests))

        else:

            def batch(requests: list[dict]) -> Counter:
                return _sync_batch(litellm, stream, requests)

    def make(chunks: int, i: int) -> dict[str, Any]:
        return _request(base_url, chunks, i, usage)

    figures = _measure(batch, make, n, chunk_counts, rounds)
    if path == "e" and "aiohttp" in settings and sessions:
        loop.run_until_complete(sessions[0].close())
    return figures


def _new_loop(settings: tuple[str, ...]) -> asyncio.AbstractEventLoop:
    if "asyncio" not in settings:
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


# --- the parent: every variant, the table, the profile -----------------------------------------


def _child(
    variant: tuple[str, tuple[str, ...]],
    base_url: str,
    args: argparse.Namespace,
    prefix: list[str] | None = None,
) -> dict[str, Any]:
    path, settings = variant
    spec = f"{path}:{','.join(settings)}"
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        argv = [sys.executable, __file__, "--one", spec, "--base-url", base_url, "--n", str(args.n)]
        argv += ["--chunks", args.chunks, "--rounds", str(args.rounds), "--json", out.name]
        subprocess.run([*(prefix or []), *argv], check=True)
        return dict(json.loads(Path(out.name).read_text()))


def _table(results: list[tuple[str, dict[str, Any]]], chunk_counts: list[int]) -> str:
    lo, hi = chunk_counts[0], chunk_counts[-1]
    head = " | ".join(f"{c} chunks" for c in chunk_counts)
    lines = [
        f"| path × settings | {head} | per chunk | fixed per call |",
        "|---|" + "---:|" * (len(chunk_counts) + 2),
    ]
    for name, figures in results:
        cpu = {c: figures[str(c)]["cpu_ms_per_call"] for c in chunk_counts}
        per_chunk = (cpu[hi] - cpu[lo]) / (hi - lo) if hi > lo else float("nan")
        fixed = cpu[lo] - lo * per_chunk
        cells = " | ".join(f"{cpu[c]:.2f}" for c in chunk_counts)
        lines.append(f"| {name} | {cells} | {per_chunk:.3f} | {fixed:.2f} |")
    return "\n".join(lines)


def _profile(
    variant: tuple[str, tuple[str, ...]], base_url: str, args: argparse.Namespace, top: int = 25
) -> str:
    """py-spy over the variant at the largest chunk count: CPU ms per chunk by function."""
    chunks = args.chunks.split(",")[-1]
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "stacks.txt"
        spy = [str(Path(sys.executable).parent / "py-spy"), "record", "--format", "raw"]
        spy += ["--rate", "250", "--nonblocking", "-o", str(raw), "--"]
        profiled = argparse.Namespace(**{**vars(args), "chunks": chunks, "rounds": 3})
        figures = _child(variant, base_url, profiled, prefix=spy)
        calls = int(figures[chunks]["calls"]) * 3 + 8
        samples = Counter[str]()
        inclusive = Counter[str]()
        total = 0
        for row in raw.read_text().splitlines():
            stack, _, count = row.rpartition(" ")
            frames = stack.split(";")
            total += int(count)
            samples[frames[-1]] += int(count)
            for frame in set(frames):
                inclusive[frame] += int(count)
    per_sample_ms = 1000 / 250
    per_chunk = per_sample_ms / (calls * int(chunks))
    lines = [f"py-spy, {label(*variant)}, {chunks} chunks, {calls} calls, {total} samples:"]
    lines.append("self CPU ms per chunk (top functions):")
    for frame, hits in samples.most_common(top):
        lines.append(f"  {hits * per_chunk:7.4f}  {frame}")
    lines.append("inclusive CPU ms per chunk (top functions):")
    for frame, hits in inclusive.most_common(top + 10):
        lines.append(f"  {hits * per_chunk:7.4f}  {frame}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=200, help="concurrent calls per batch")
    parser.add_argument("--delay", type=float, default=0.5, help="server wait per call, s")
    parser.add_argument("--chunks", default="2,4,40", help="content chunks per reply")
    parser.add_argument("--rounds", type=int, default=2, help="batches per figure; the least")
    parser.add_argument("--only", help="variants, e.g. 'a:,a:nostreamlog;price'")
    parser.add_argument("--profile", action="store_true", help="py-spy the best (a) variant")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--base-url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    chunk_counts = [int(c) for c in args.chunks.split(",")]
    if args.one:
        path, _, settings = args.one.partition(":")
        variant = tuple(s for s in settings.split(",") if s)
        figures = run_variant(path, variant, args.base_url, args.n, chunk_counts, args.rounds)
        args.json.write_text(json.dumps(figures))
        return
    import fast_fake

    variants = VARIANTS
    if args.only:
        variants = [
            (p, tuple(s for s in rest.split(";") if s))
            for p, _, rest in (spec.partition(":") for spec in args.only.split(","))
        ]
    results: list[tuple[str, dict[str, Any]]] = []
    with fast_fake.running("--delay", str(args.delay)) as fake:
        print(f"fast_fake at {fake.base_url}; {args.n} concurrent calls, {args.delay} s each")
        for variant in variants:
            cpu0 = fake.stats()["cpu_seconds"]
            figures = _child(variant, fake.base_url, args)
            name = label(*variant)
            results.append((name, figures))
            cells = "  ".join(
                f"{c}: {figures[str(c)]['cpu_ms_per_call']:6.2f} ms "
                f"({figures[str(c)]['wall_s']:.2f} s wall)"
                for c in chunk_counts
            )
            fake_cpu = fake.stats()["cpu_seconds"] - cpu0
            print(f"{name:<58} {cells}  [fake {fake_cpu:.2f} s CPU]", flush=True)
        print(f"\nCPU ms per call (the process's CPU ÷ calls; {args.n} concurrent)")
        print(_table(results, chunk_counts))
        stats = fake.stats()
        print(f"fast_fake: {stats['requests']} requests, {stats['cpu_seconds']:.2f} s CPU")
        if args.profile:
            streamed = [
                (name, v, f[str(chunk_counts[-1])]["cpu_ms_per_call"])
                for (name, f), v in zip(results, variants, strict=True)
                if v[0] == "a"
            ]
            if streamed:
                best = min(streamed, key=lambda row: row[2])[1]
                print()
                print(_profile(best, fake.base_url, args))
    if args.json:
        args.json.write_text(json.dumps(dict(results), indent=1))


if __name__ == "__main__":
    main()
