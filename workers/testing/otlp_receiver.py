"""A local OTLP/HTTP trace receiver that keeps what it receives in memory, for tests.

The processes under test export their spans as they would to a real collector
(``OTEL_EXPORTER_OTLP_ENDPOINT`` pointing here); the test reads them back, decoded, to check
that one trace spans every process. It speaks only what the SDK's OTLP/HTTP exporter sends:

* ``POST /v1/traces``: an ``ExportTraceServiceRequest`` in protobuf, gzip- or
  deflate-compressed or not, answered with an empty ``ExportTraceServiceResponse`` (OTLP/JSON,
  which the Python exporter never sends, is refused with 415);
* ``GET /_spans``: every span received so far, in arrival order, as a JSON list of objects
  with ``trace_id``, ``span_id``, ``parent_span_id`` (hex, ``""`` for a root), ``name``,
  ``kind`` (``SPAN_KIND_SERVER``, …), ``service`` (the ``service.name`` resource attribute),
  ``resource`` and ``attributes`` (plain JSON values);
* ``POST /_reset``: forget them.

In a test process it runs in a thread (``with OtlpReceiver() as receiver: …``); elsewhere as
``python -m workers.testing.otlp_receiver --port P``. The standard library's HTTP server is
enough: a few exports per second, from a handful of processes.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import threading
import zlib
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

__all__ = ["TRACES_PATH", "OtlpReceiver", "decode_request", "main"]

#: Where the SDK's OTLP/HTTP exporter posts spans, below the endpoint it is given.
TRACES_PATH = "/v1/traces"
_PROTOBUF = "application/x-protobuf"


def decode_request(body: bytes, encoding: str = "") -> list[dict[str, Any]]:
    """The spans of one protobuf export request (``encoding``: its ``Content-Encoding``), as
    ``GET /_spans`` lists them."""
    if encoding == "gzip":
        body = gzip.decompress(body)
    elif encoding == "deflate":
        body = zlib.decompress(body)
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans: list[dict[str, Any]] = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    {
                        "trace_id": span.trace_id.hex(),
                        "span_id": span.span_id.hex(),
                        "parent_span_id": span.parent_span_id.hex(),
                        "name": span.name,
                        "kind": Span.SpanKind.Name(span.kind),
                        "service": resource.get("service.name", ""),
                        "resource": resource,
                        "attributes": _attributes(span.attributes),
                    }
                )
    return spans


def _attributes(pairs: Sequence[KeyValue]) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(item) for item in value.array_value.values]
    if which == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    if which == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, which) if which else None


class OtlpReceiver:
    """The receiver on ``host:port`` (0: a free port), in a daemon thread while in ``with``."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._spans: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, port), self._handler_class())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def endpoint(self) -> str:
        """The value of ``OTEL_EXPORTER_OTLP_ENDPOINT`` that exports here."""
        return f"http://127.0.0.1:{self.port}"

    def spans(self) -> list[dict[str, Any]]:
        """The spans received so far, in arrival order."""
        with self._lock:
            return list(self._spans)

    def reset(self) -> None:
        with self._lock:
            self._spans.clear()

    def _received(self, spans: list[dict[str, Any]]) -> None:
        with self._lock:
            self._spans.extend(spans)

    def serve_forever(self) -> None:
        self._server.serve_forever(poll_interval=0.1)

    def __enter__(self) -> OtlpReceiver:
        self._thread = threading.Thread(target=self.serve_forever, name="otlp", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: the exporter reuses its connection

            def do_POST(self) -> None:  # noqa: N802 - the name http.server dispatches to
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path == "/_reset":
                    receiver.reset()
                    self._answer(200, b"{}", "application/json")
                    return
                if self.path != TRACES_PATH:
                    self._answer(404, b"", "text/plain")
                    return
                if self.headers.get("Content-Type", _PROTOBUF) != _PROTOBUF:
                    self._answer(415, b"only application/x-protobuf", "text/plain")
                    return
                try:
                    spans = decode_request(body, self.headers.get("Content-Encoding", ""))
                except (ValueError, OSError, DecodeError) as exc:
                    self._answer(400, str(exc).encode(), "text/plain")
                    return
                receiver._received(spans)
                self._answer(200, ExportTraceServiceResponse().SerializeToString(), _PROTOBUF)

            def do_GET(self) -> None:  # noqa: N802 - the name http.server dispatches to
                if self.path != "/_spans":
                    self._answer(404, b"", "text/plain")
                    return
                self._answer(200, json.dumps(receiver.spans()).encode(), "application/json")

            def _answer(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass  # one line per export would drown the test's output

        return Handler


def main(argv: Sequence[str] | None = None) -> None:
    """Command-line entry point: ``python -m workers.testing.otlp_receiver --port 4318``."""
    parser = argparse.ArgumentParser(prog="python -m workers.testing.otlp_receiver")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=4318, help="0 picks a free port")
    args = parser.parse_args(argv)
    receiver = OtlpReceiver(args.host, args.port)
    print(f"OTLP/HTTP receiver on {receiver.endpoint}{TRACES_PATH}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C ends it without a traceback
        receiver.serve_forever()


if __name__ == "__main__":
    main()
