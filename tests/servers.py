"""Servers the tests talk to: the real backends, which live in ``workers.testing.backends``
(beside the other test doubles the package ships, so scenarios start them the same way), and
:func:`local_http`, a stand-in HTTP server on 127.0.0.1 for answers recorded in a backend's
documented format."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

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
    "BackendMissing",
    "ClickHouse",
    "QuietHandler",
    "free_port",
    "local_http",
    "start_clickhouse",
]


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
