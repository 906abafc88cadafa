"""An event stream whose Redis goes away ends, so the client's reconnect hears why.

Without this a stream kept sending keepalives from a subscription that could deliver nothing,
and a browser showed "Live" for as long as Redis stayed down. A real Redis (the embedded
server, on a port of its own) is stopped under an open stream.
"""

from __future__ import annotations

import asyncio
import socket

import pytest
import redis

from coordinator.api._sse import follow
from coordinator.api.stream_hub import StreamHub
from workers.embedded_redis import EmbeddedRedis
from workers.events import EventBus
from workers.messages import TextDelta

#: Liveness bound of the whole test, far above what the stream needs (about 3 s).
DEADLINE = 60.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _read(stream) -> list[bytes]:
    return [chunk async for chunk in stream]


@pytest.mark.timeout(120)
def test_a_stream_ends_once_redis_has_not_answered_for_the_give_up_time(tmp_path, caplog):
    server = EmbeddedRedis(port=_free_port(), data_dir=tmp_path / "redis").start()
    client = redis.Redis.from_url(server.url)
    try:
        EventBus(client).publish(TextDelta(session_id="s1", text="before the outage"))

        async def scenario() -> list[bytes]:
            hub = StreamHub(server.url)
            try:
                stop = asyncio.Event()
                bus = EventBus(client)
                chunks = follow(hub, bus, "s1", 0, stop, keepalive=0.3, give_up_after=1.0)
                first = await asyncio.wait_for(anext(chunks), DEADLINE)
                server.stop()  # Redis is gone under the open stream
                rest = await asyncio.wait_for(_read(chunks), DEADLINE)
                return [first, *rest]
            finally:
                await hub.aclose()

        chunks = asyncio.run(scenario())
    finally:
        client.close()
        server.stop()
    assert b"before the outage" in chunks[0]
    assert all(c == b": keepalive\n\n" for c in chunks[1:])  # sent before the outage only
    assert "Redis has not answered" in caplog.text  # the stream ended for that reason
