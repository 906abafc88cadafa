"""The test OTLP receiver decodes what the SDK's OTLP/HTTP exporter sends, as it sends it:
protobuf, compressed or not, and serves it back on ``GET /_spans``."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind

from workers.testing.otlp_receiver import OtlpReceiver


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as started:
        yield started


def _export(receiver: OtlpReceiver, compression: Compression) -> None:
    exporter = OTLPSpanExporter(endpoint=f"{receiver.endpoint}/v1/traces", compression=compression)
    provider = TracerProvider(resource=Resource.create({"service.name": "probe"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    outer = tracer.start_as_current_span("outer", kind=SpanKind.SERVER, attributes={"n": 3})
    inner = tracer.start_as_current_span("inner", attributes={"tags": ["a", "b"], "ok": True})
    with outer, inner:
        pass
    provider.shutdown()


@pytest.mark.parametrize("compression", [Compression.NoCompression, Compression.Gzip])
def test_spans_exported_over_otlp_http_are_served_back_decoded(
    receiver: OtlpReceiver, compression: Compression
):
    _export(receiver, compression)

    with urllib.request.urlopen(f"{receiver.endpoint}/_spans", timeout=10) as response:
        inner, outer = json.loads(response.read())
    assert (inner["name"], outer["name"]) == ("inner", "outer")  # in the order they ended
    assert inner["trace_id"] == outer["trace_id"] and len(outer["trace_id"]) == 32
    assert inner["parent_span_id"] == outer["span_id"] and outer["parent_span_id"] == ""
    assert outer["kind"] == "SPAN_KIND_SERVER" and outer["service"] == "probe"
    assert outer["attributes"] == {"n": 3}
    assert inner["attributes"] == {"tags": ["a", "b"], "ok": True}


def test_reset_forgets_the_spans(receiver: OtlpReceiver):
    _export(receiver, Compression.NoCompression)
    request = urllib.request.Request(f"{receiver.endpoint}/_reset", data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=10):
        pass
    assert receiver.spans() == []


def test_what_is_not_an_otlp_protobuf_request_is_refused(receiver: OtlpReceiver):
    for content_type, body, status in [
        ("application/json", b"{}", 415),
        ("application/x-protobuf", b"\xff\xff\xff", 400),
    ]:
        request = urllib.request.Request(
            f"{receiver.endpoint}/v1/traces", data=body, headers={"Content-Type": content_type}
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == status
    assert receiver.spans() == []
