"""Run ``workers.testing.fake_openai`` with TCP_NODELAY on its connections.

    python bench/_fake.py --port 0 --port-file FILE --script RULES [--delay S]

The fake binds its listening socket as ``socket(AF_INET, SOCK_STREAM)`` (protocol 0); asyncio only
sets TCP_NODELAY on accepted sockets whose protocol is IPPROTO_TCP, so the fake's responses are
subject to Nagle's algorithm: the response headers go out, the first body chunk waits for the
client's delayed ACK, and every streamed reply arrives ~40 ms late. That is the test double's
delay, not the runtime's, so the benchmark binds the socket with IPPROTO_TCP and runs the fake
otherwise unchanged. ``bench/runtime.py --stock-fake`` measures with the fake as it ships.
"""

from __future__ import annotations

import socket

from workers.testing import fake_openai


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    return sock


if __name__ == "__main__":
    fake_openai._bind = _bind  # type: ignore[attr-defined]
    fake_openai.main()
