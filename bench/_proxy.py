"""A TCP proxy in front of the fake model server that counts HTTP requests in flight.

    python bench/_proxy.py --upstream-port PORT --port-file FILE

The runtime benchmark points the workers at this proxy so it can see how many model requests are
open at the same moment without touching the fake server. HTTP/1.1 clients (httpx) send one
request at a time per connection, so a connection is *busy* from the first request byte until the
end of a chunked response (``0\\r\\n\\r\\n``, which is how the fake's streamed replies end) or
until it closes. Each busy span is recorded as ``[start, end]`` in ``time.time()`` seconds.

A second port answers one line per connection: ``stats`` (JSON: peak, spans) or ``reset``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from pathlib import Path

_END_OF_CHUNKED = b"0\r\n\r\n"


class Counter:
    def __init__(self) -> None:
        self.inflight = 0
        self.peak = 0
        self.spans: list[tuple[float, float]] = []

    def begin(self) -> float:
        self.inflight += 1
        self.peak = max(self.peak, self.inflight)
        return time.time()

    def end(self, start: float) -> None:
        self.inflight -= 1
        self.spans.append((start, time.time()))

    def reset(self) -> None:
        self.peak = self.inflight
        self.spans = []


class _Conn:
    """One client connection and its upstream twin."""

    def __init__(self, counter: Counter) -> None:
        self.counter = counter
        self.started: float | None = None
        self.tail = b""

    def request_bytes(self) -> None:
        if self.started is None:
            self.started = self.counter.begin()
            self.tail = b""

    def response_bytes(self, data: bytes) -> None:
        self.tail = (self.tail + data)[-len(_END_OF_CHUNKED) :]
        if self.started is not None and self.tail == _END_OF_CHUNKED:
            self.finish()

    def finish(self) -> None:
        if self.started is not None:
            self.counter.end(self.started)
            self.started = None


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, on_data) -> None:
    try:
        while data := await reader.read(65536):
            on_data(data)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


async def _serve(counter: Counter, upstream_port: int, port_file: Path) -> None:
    async def handle(c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        conn = _Conn(counter)
        try:
            u_reader, u_writer = await asyncio.open_connection("127.0.0.1", upstream_port)
        except OSError:
            c_writer.close()
            return
        await asyncio.gather(
            _pipe(c_reader, u_writer, lambda _d: conn.request_bytes()),
            _pipe(u_reader, c_writer, conn.response_bytes),
        )
        conn.finish()

    async def control(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        command = (await reader.readline()).strip()
        if command == b"reset":
            counter.reset()
            writer.write(b"{}\n")
        else:
            body = {"peak": counter.peak, "inflight": counter.inflight, "spans": counter.spans}
            writer.write(json.dumps(body).encode() + b"\n")
        await writer.drain()
        writer.close()

    proxy = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=2048)
    ctl = await asyncio.start_server(control, "127.0.0.1", 0)
    ports = f"{proxy.sockets[0].getsockname()[1]} {ctl.sockets[0].getsockname()[1]}\n"
    partial = port_file.with_name(port_file.name + ".tmp")
    partial.write_text(ports)
    partial.replace(port_file)
    async with proxy, ctl:
        await asyncio.gather(proxy.serve_forever(), ctl.serve_forever())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--upstream-port", type=int, required=True)
    ap.add_argument("--port-file", type=Path, required=True)
    args = ap.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(Counter(), args.upstream_port, args.port_file))


if __name__ == "__main__":
    main()
