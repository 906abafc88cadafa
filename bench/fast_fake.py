"""A cheap OpenAI-protocol chat-completions server that holds a thousand streams at once.

    python bench/fast_fake.py --port P [--delay S] [--chunks C] [--turns T] [--tool NAME]
                              [--port-file FILE]

``workers.testing.fake_openai`` is a scripted test double built for correctness; at a thousand
concurrent streams its own CPU would swamp the figures of the process being measured. This server
is raw ``asyncio.start_server`` (uvloop when importable), HTTP/1.1 keep-alive, with no framework
and no per-request parsing beyond the JSON body, so what the benchmark measures is the client.

Each ``POST …/chat/completions`` waits ``delay`` seconds, then answers with ``chunks`` SSE chunks
(content deltas; on a tool turn the last one carries the tool call), a usage chunk when the
request asks ``stream_options.include_usage``, and ``[DONE]``; or one JSON body when ``stream`` is
false. The script: a conversation's turn k is the number of assistant messages in the request;
turns 0 … T-2 call ``tool`` (when one is given), turn T-1 answers with text. A system message
containing ``fastfake: key=value …`` (delay, chunks, turns, tool) overrides the defaults, so one
server serves several loads.

``GET /_stats`` answers requests total, those asked to stream, connections opened, repeats (a
conversation's turn requested again; the conversation is the hash of its first user message),
open streams now and at peak, and the server's own CPU seconds; ``POST /_reset`` zeroes the
counters.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

_DIRECTIVE = re.compile(r"fastfake:((?:\s+\w+=\S+)+)")


@dataclass(frozen=True)
class Script:
    """How a request is answered; the CLI sets the defaults, a ``fastfake:`` line overrides."""

    delay: float = 0.5
    chunks: int = 4
    turns: int = 1
    tool: str = ""

    def overridden(self, messages: list[dict[str, Any]]) -> Script:
        for message in messages:
            if message.get("role") != "system":
                continue
            found = _DIRECTIVE.search(_text(message.get("content")))
            if found:
                pairs = dict(item.split("=", 1) for item in found.group(1).split())
                return replace(
                    self,
                    delay=float(pairs.get("delay", self.delay)),
                    chunks=max(1, int(pairs.get("chunks", self.chunks))),
                    turns=max(1, int(pairs.get("turns", self.turns))),
                    tool="" if pairs.get("tool") == "none" else pairs.get("tool", self.tool),
                )
        return self


@dataclass
class Stats:
    requests: int = 0
    #: Requests that asked for a streamed reply.
    streamed: int = 0
    #: Connections whose first request asked for a completion (the model's clients opened).
    connections: int = 0
    repeats: int = 0
    open_streams: int = 0
    open_streams_peak: int = 0
    seen: Counter[tuple[str, int]] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "streamed": self.streamed,
            "connections": self.connections,
            "repeats": self.repeats,
            "open_streams": self.open_streams,
            "open_streams_peak": self.open_streams_peak,
            "conversations": len({key for key, _ in self.seen}),
            "cpu_seconds": time.process_time(),
        }


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}]
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _conversation(messages: list[dict[str, Any]]) -> tuple[str, int]:
    """(hash of the first user message, number of assistant messages): one model turn."""
    first = next((m for m in messages if m.get("role") == "user"), {})
    key = hashlib.blake2b(_text(first.get("content")).encode(), digest_size=8).hexdigest()
    return key, sum(1 for m in messages if m.get("role") == "assistant")


def _reply(script: Script, key: str, turn: int) -> tuple[list[str], dict[str, Any] | None]:
    """The text pieces of this turn's reply and its tool call (``None`` on the final turn)."""
    if script.tool and turn < script.turns - 1:
        call = {"id": f"call_{key}_{turn}", "name": script.tool, "arguments": "{}"}
        return [f"w{i} " for i in range(script.chunks - 1)], call
    return [f"w{i} " for i in range(script.chunks)], None


def _sse_body(model: str, pieces: list[str], call: dict | None, usage: bool) -> bytes:
    """Every SSE event of a streamed reply, each framed as one HTTP chunk."""
    head = {"id": "chatcmpl-fast", "object": "chat.completion.chunk", "created": 0, "model": model}
    finish = "tool_calls" if call else "stop"
    events: list[dict[str, Any]] = []
    for i, piece in enumerate(pieces):
        delta: dict[str, Any] = {"content": piece}
        if i == 0:
            delta["role"] = "assistant"
        events.append({"index": 0, "delta": delta, "finish_reason": None})
    if call is not None:
        fn = {"name": call["name"], "arguments": call["arguments"]}
        tool = {"index": 0, "id": call["id"], "type": "function", "function": fn}
        delta = {"tool_calls": [tool]} if pieces else {"role": "assistant", "tool_calls": [tool]}
        events.append({"index": 0, "delta": delta, "finish_reason": None})
    events[-1]["finish_reason"] = finish
    lines = [json.dumps({**head, "choices": [e]}, separators=(",", ":")) for e in events]
    if usage:
        counts = {"prompt_tokens": 10, "completion_tokens": len(events), "total_tokens": 0}
        counts["total_tokens"] = counts["prompt_tokens"] + counts["completion_tokens"]
        lines.append(json.dumps({**head, "choices": [], "usage": counts}, separators=(",", ":")))
    lines.append("[DONE]")
    out = bytearray()
    for data in lines:
        payload = f"data: {data}\n\n".encode()
        out += b"%x\r\n%s\r\n" % (len(payload), payload)
    out += b"0\r\n\r\n"
    return bytes(out)


def _json_body(model: str, pieces: list[str], call: dict | None) -> bytes:
    message: dict[str, Any] = {"role": "assistant", "content": "".join(pieces) or None}
    if call is not None:
        fn = {"name": call["name"], "arguments": call["arguments"]}
        message["tool_calls"] = [{"id": call["id"], "type": "function", "function": fn}]
    body = {
        "id": "chatcmpl-fast",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if call else "stop"}
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14},
    }
    return json.dumps(body, separators=(",", ":")).encode()


def _head(status: str, content_type: str, length: int | None) -> bytes:
    framing = f"content-length: {length}" if length is not None else "transfer-encoding: chunked"
    return (
        f"HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\n{framing}\r\n"
        "connection: keep-alive\r\n\r\n"
    ).encode()


class Server:
    def __init__(self, defaults: Script) -> None:
        self.defaults = defaults
        self.stats = Stats()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            served = 0  # requests on this connection: a completion as the first counts it
            while await self._one(reader, writer, served):
                served += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client closed its connection
        finally:
            writer.close()

    async def _one(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, served: int
    ) -> bool:
        """Serve one request; whether the connection stays open."""
        head = await reader.readuntil(b"\r\n\r\n")
        request_line, *header_lines = head.decode("latin-1").split("\r\n")
        method, path, _ = request_line.split(" ", 2)
        headers = {}
        for raw in header_lines:
            if ":" in raw:
                name, value = raw.split(":", 1)
                headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        body = await reader.readexactly(length) if length else b""
        if method == "GET" and path.endswith("/_stats"):
            self._send_json(writer, json.dumps(self.stats.as_dict()).encode())
        elif method == "POST" and path.endswith("/_reset"):
            self.stats = Stats()
            self._send_json(writer, b"{}")
        elif method == "POST" and path.endswith("/chat/completions"):
            self.stats.connections += served == 0
            await self._complete(writer, json.loads(body))
        else:
            writer.write(_head("404 Not Found", "text/plain", 0))
        await writer.drain()
        return headers.get("connection", "").lower() != "close"

    def _send_json(self, writer: asyncio.StreamWriter, body: bytes) -> None:
        writer.write(_head("200 OK", "application/json", len(body)) + body)

    async def _complete(self, writer: asyncio.StreamWriter, request: dict[str, Any]) -> None:
        messages = request.get("messages") or []
        script = self.defaults.overridden(messages)
        key, turn = _conversation(messages)
        stats = self.stats
        stats.requests += 1
        stats.streamed += bool(request.get("stream"))
        stats.seen[key, turn] += 1
        if stats.seen[key, turn] > 1:
            stats.repeats += 1
        stats.open_streams += 1
        stats.open_streams_peak = max(stats.open_streams_peak, stats.open_streams)
        try:
            await asyncio.sleep(script.delay)
            pieces, call = _reply(script, key, turn)
            model = str(request.get("model", "fake"))
            if request.get("stream"):
                usage = bool((request.get("stream_options") or {}).get("include_usage"))
                writer.write(_head("200 OK", "text/event-stream", None))
                writer.write(_sse_body(model, pieces, call, usage))
            else:
                self._send_json(writer, _json_body(model, pieces, call))
            await writer.drain()
        finally:
            stats.open_streams -= 1


async def serve(host: str, port: int, defaults: Script, port_file: Path | None) -> None:
    server = Server(defaults)
    listener = await asyncio.start_server(server.handle, host, port, backlog=4096)
    bound = listener.sockets[0].getsockname()[1]
    if port_file is not None:
        tmp = port_file.with_suffix(".tmp")
        tmp.write_text(str(bound))
        tmp.replace(port_file)  # the reader never sees a half-written port
    print(f"fast_fake listening on http://{host}:{bound}/v1", flush=True)
    async with listener:
        await listener.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", type=Path)
    parser.add_argument("--delay", type=float, default=Script.delay)
    parser.add_argument("--chunks", type=int, default=Script.chunks)
    parser.add_argument("--turns", type=int, default=Script.turns)
    parser.add_argument("--tool", default=Script.tool)
    args = parser.parse_args(argv)
    defaults = Script(delay=args.delay, chunks=args.chunks, turns=args.turns, tool=args.tool)
    coroutine = serve(args.host, args.port, defaults, args.port_file)
    try:
        import uvloop
    except ImportError:
        asyncio.run(coroutine)
    else:
        uvloop.run(coroutine)


# --- for the benchmarks that start it --------------------------------------------------------


@dataclass
class Running:
    proc: subprocess.Popen
    base_url: str  # ends in /v1

    def stats(self) -> dict[str, Any]:
        import httpx

        return dict(httpx.get(f"{self.base_url}/_stats", timeout=30).json())

    def reset(self) -> None:
        import httpx

        httpx.post(f"{self.base_url}/_reset", timeout=30)


@contextmanager
def running(*args: str) -> Iterator[Running]:
    """``fast_fake.py`` in its own process on a free port; stopped on exit."""
    with tempfile.TemporaryDirectory(prefix="fast-fake-") as tmp:
        port_file = Path(tmp) / "port"
        argv = [sys.executable, __file__, "--port", "0", "--port-file", str(port_file), *args]
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while not port_file.exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("bench/fast_fake.py did not start")
                time.sleep(0.02)
            yield Running(proc, f"http://127.0.0.1:{port_file.read_text()}/v1")
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


if __name__ == "__main__":
    main()
