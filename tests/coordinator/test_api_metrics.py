"""``GET /metrics`` of the API and the telemetry of its requests: no token needed, the process's
series and the queue depths read from a real Redis (DB 6) in Prometheus text, requests counted
by route template, and one server span per request that continues a caller's ``traceparent`` and
is the current context of the endpoint (where a spawn's record takes it from)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redis_server
from fastapi import FastAPI
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client.parser import text_string_to_metric_families

from coordinator.api import create_app
from registry.settings import Settings
from workers import tracing
from workers.celery_app import QUEUES

REDIS_URL = redis_server.url(6)
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


@pytest.fixture
def redis_db() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def app(tmp_path: Path, redis_db: redis.Redis) -> FastAPI:
    (tmp_path / "agents").mkdir()
    (tmp_path / "marketplace").mkdir()
    settings = Settings(
        agents_dir=tmp_path / "agents",
        marketplace_root=tmp_path / "marketplace",
        shipped_agents=False,
        redis_url=REDIS_URL,
        database_url=f"sqlite:///{tmp_path / 'ongrid.db'}",
        data_dir=tmp_path / ".ongrid",
    )
    return create_app(settings)


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app) as made:
        yield made


def samples(client: TestClient) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def test_metrics_need_no_token_and_hold_the_queue_depths(client: TestClient, redis_db: redis.Redis):
    redis_db.rpush(QUEUES["background"], "m1", "m2")

    found = samples(client)  # no Authorization header

    depth = {q: found[("ongrid_queue_depth", frozenset({("queue", q)}))] for q in QUEUES.values()}
    assert depth == {QUEUES["interactive"]: 0, QUEUES["background"]: 2, QUEUES["coordinator"]: 0}
    assert found[("ongrid_queue_depth_up", frozenset())] == 1
    assert any(name == "process_cpu_seconds_total" for name, _ in found)  # the default registry


def test_requests_are_counted_by_route_template_and_status(client: TestClient):
    def count(route: str, status: str) -> float:
        key = ("ongrid_http_requests_total", frozenset({("route", route), ("status", status)}))
        return samples(client).get(key, 0.0)

    healthy, unknown = count("/healthz", "200"), count("unmatched", "404")
    refused = count("/api/v1/spawns/{spawn_id}", "401")
    assert client.get("/healthz").status_code == 200
    assert client.get("/no/such/path/4711").status_code == 404
    assert client.get("/api/v1/spawns/abc").status_code == 401  # no token

    assert count("/healthz", "200") == healthy + 1
    assert count("unmatched", "404") == unknown + 1
    assert count("/api/v1/spawns/{spawn_id}", "401") == refused + 1


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    tracing.init_tracing(Settings(), "ongrid-api-test", exporter=memory)
    yield memory
    tracing.shutdown_tracing()


def test_a_request_is_a_server_span_that_continues_the_callers_trace(
    app: FastAPI, exporter: InMemorySpanExporter
):
    # A blocking endpoint, as the spawning ones are: it runs in a thread of the pool.
    app.add_api_route("/_carried", lambda: tracing.inject(), methods=["GET"])
    with TestClient(app) as client:
        carried = client.get("/_carried", headers={"traceparent": TRACEPARENT}).json()
        assert client.get("/healthz").status_code == 200

    assert tracing.flush_tracing()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert sorted(spans) == ["GET /_carried", "GET /healthz"]  # one span per request, ours
    server = spans["GET /_carried"]
    assert server.kind is SpanKind.SERVER
    assert format(server.context.trace_id, "032x") == TRACE_ID
    assert server.parent is not None and server.parent.is_remote
    assert (server.attributes or {})["http.route"] == "/_carried"
    assert (server.attributes or {})["http.response.status_code"] == 200
    # What the endpoint would store on a spawn record: this request's span as the parent.
    assert carried["traceparent"] == f"00-{TRACE_ID}-{server.context.span_id:016x}-01"
    own = spans["GET /healthz"]
    assert own.parent is None and format(own.context.trace_id, "032x") != TRACE_ID
