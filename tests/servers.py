"""Servers the tests talk to: the real backends, which live in ``workers.testing.backends``
(beside the other test doubles the package ships, so scenarios start them the same way), and
:class:`AppServer`, the API app under a real uvicorn in a thread, and
:func:`local_http`, a stand-in HTTP server on 127.0.0.1 for answers recorded in a backend's
documented format."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import uvicorn

from workers.testing.backends import (
    DIAG_PASSWORD,
    DIAG_USER,
    BackendMissing,
    ClickHouse,
    free_port,
    start_clickhouse,
)

__all__ = [
    "DIAG_PASSWORD",
    "DIAG_USER",
    "AppServer",
    "BackendMissing",
    "ClickHouse",
    "QuietHandler",
    "free_port",
    "local_http",
    "start_clickhouse",
]


class AppServer:
    """An ASGI app under uvicorn in a thread, on a free 127.0.0.1 port, until :meth:`stop`."""

    def __init__(self, app: Any, start_timeout: float = 20.0) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.port: int = sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_config=None, access_log=False, timeout_graceful_shutdown=2)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="api", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + start_timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise AssertionError(f"the API server did not start within {start_timeout} s")
            time.sleep(0.02)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=15)


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that keeps the test output clean."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def local_http(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve ``handler`` on a free 127.0.0.1 port in a thread; yields the base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
