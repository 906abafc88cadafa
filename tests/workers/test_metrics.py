"""The runtime's Prometheus metrics: each helper moves its series, the queue depths come from a
real Redis (DB 6) and a Redis that does not answer never fails a scrape, and a worker's metrics
server answers over HTTP and refuses a port in use by name."""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Iterator

import pytest
import redis
import redis_server
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

from registry.errors import UserError
from workers import metrics
from workers.celery_app import QUEUES
from workers.messages import TextDelta, ToolCallEvent, Usage

REDIS_URL = redis_server.url(6)


def value(name: str, **labels: str) -> float:
    """The sample's current value in the default registry (0 when it has none yet)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


class Delta:
    """How much one sample moved since this was made (the registry is the process's)."""

    def __init__(self, name: str, **labels: str) -> None:
        self.name, self.labels = name, labels
        self.before = value(name, **labels)

    def __call__(self) -> float:
        return value(self.name, **self.labels) - self.before


@pytest.fixture
def redis_db() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- the helpers the engine calls --------------------------------------------------------------


def test_a_spawn_is_in_flight_from_its_start_to_its_end_then_counted_by_status():
    running = Delta("ongrid_spawns_in_flight", persona="probe", status="running")
    done = Delta("ongrid_spawns_finished_total", persona="probe", status="succeeded")
    failed = Delta("ongrid_spawns_finished_total", persona="probe", status="failed")

    metrics.spawn_started("probe")
    metrics.spawn_started("probe")
    assert running() == 2
    metrics.spawn_ended("probe", "succeeded")
    assert (running(), done(), failed()) == (1, 1, 0)
    metrics.spawn_ended("probe", "failed")
    assert (running(), done(), failed()) == (0, 1, 1)


def test_queue_wait_turns_and_model_calls_are_observed_in_their_histograms():
    waits = Delta("ongrid_spawn_queue_wait_seconds_count", queue="ongrid.background")
    waited = Delta("ongrid_spawn_queue_wait_seconds_sum", queue="ongrid.background")
    fast = Delta("ongrid_spawn_queue_wait_seconds_bucket", queue="ongrid.background", le="0.01")
    turns = Delta("ongrid_turn_seconds_count", persona="probe")
    calls = Delta("ongrid_model_call_seconds_count", model="openai/gpt-4o-mini")

    metrics.spawn_claimed("ongrid.background", 2.5)
    metrics.spawn_claimed("ongrid.background", -0.1)  # clocks of two hosts: never negative
    metrics.turn_done("probe", 1.5)
    metrics.model_call("openai/gpt-4o-mini", "probe", 1.2, None, None)

    assert (waits(), waited(), fast()) == (2, 2.5, 1)
    assert (turns(), calls()) == (1, 1)


def test_a_model_call_counts_its_tokens_and_cost_or_its_error():
    model = "openai/metrics-test"
    prompt = Delta("ongrid_tokens_total", model=model, persona="probe", kind="prompt")
    completion = Delta("ongrid_tokens_total", model=model, persona="probe", kind="completion")
    cost = Delta("ongrid_cost_usd_total", model=model, persona="probe")
    written = Delta("ongrid_tokens_total", model=model, persona="probe", kind="cache_write")
    read = Delta("ongrid_tokens_total", model=model, persona="probe", kind="cache_read")
    errors = Delta("ongrid_model_errors_total", model=model, cause="rate-limit")

    usage = Usage(
        prompt_tokens=120,
        completion_tokens=30,
        total_tokens=150,
        cost=0.004,
        cache_write_tokens=20,
        cache_read_tokens=90,
    )
    metrics.model_call(model, "probe", 0.8, usage, None)
    metrics.model_call(model, "probe", 0.1, None, "rate-limit")

    assert (prompt(), completion(), errors()) == (120, 30, 1)
    assert (written(), read()) == (20, 90)
    assert cost() == pytest.approx(0.004)


def test_tool_calls_events_leases_and_resumptions_are_counted():
    ok = Delta("ongrid_tool_calls_total", tool="host_probe", outcome="ok")
    denied = Delta("ongrid_tool_calls_total", tool="host_probe", outcome="denied")
    texts = Delta("ongrid_events_published_total", type="text")
    calls = Delta("ongrid_events_published_total", type="tool_call")
    lost = Delta("ongrid_leases_lost_total")
    resumed = Delta("ongrid_reaper_resumptions_total")

    metrics.tool_call("host_probe", "ok")
    metrics.tool_call("host_probe", "denied")
    metrics.event_published(TextDelta(session_id="s", text="a"))
    metrics.event_published(TextDelta(session_id="s", text="b"))
    metrics.event_published(
        ToolCallEvent(session_id="s", call_id="c1", name="host_probe", arguments="{}")
    )
    metrics.lease_lost()
    metrics.reaper_resumed(3)

    assert (ok(), denied(), texts(), calls(), lost(), resumed()) == (1, 1, 2, 1, 1, 3)


# -- the queue depths, read from Redis at scrape time ------------------------------------------


def scrape(collector: metrics.QueueDepthCollector) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(collector)
    return registry


def test_queue_depth_is_the_length_of_each_queue_over_its_priority_lists(redis_db: redis.Redis):
    redis_db.rpush(QUEUES["interactive"], "m1", "m2")
    redis_db.rpush(QUEUES["interactive"] + "\x06\x163", "m3")  # kombu's list of priority 3
    redis_db.rpush(QUEUES["background"], "m4")
    registry = scrape(metrics.QueueDepthCollector(redis_db))

    def depth(queue: str) -> float | None:
        return registry.get_sample_value("ongrid_queue_depth", {"queue": queue})

    assert depth(QUEUES["interactive"]) == 3
    assert depth(QUEUES["background"]) == 1
    assert depth(QUEUES["coordinator"]) == 0
    assert registry.get_sample_value("ongrid_queue_depth_up") == 1
    redis_db.lpop(QUEUES["background"])
    assert depth(QUEUES["background"]) == 0  # read again at each scrape


def test_a_named_stack_counts_its_own_queues_only(redis_db: redis.Redis):
    redis_db.rpush("ongrid:blue:" + QUEUES["interactive"], "m1", "m2")  # kombu's global prefix
    redis_db.rpush(QUEUES["interactive"], "theirs")  # an unnamed stack on the same database
    registry = scrape(metrics.QueueDepthCollector(redis_db, key_prefix="ongrid:blue:"))

    assert registry.get_sample_value("ongrid_queue_depth", {"queue": QUEUES["interactive"]}) == 2


def test_a_redis_that_does_not_answer_leaves_the_scrape_whole():
    nobody = redis.Redis(port=free_port(), socket_connect_timeout=0.5, socket_timeout=0.5)
    registry = scrape(metrics.QueueDepthCollector(nobody))

    text = generate_latest(registry).decode()

    assert registry.get_sample_value("ongrid_queue_depth_up") == 0
    assert "ongrid_queue_depth{" not in text
    assert "# TYPE ongrid_queue_depth gauge" in text


# -- a worker's metrics server -----------------------------------------------------------------


def test_the_metrics_server_serves_the_registry_until_stopped():
    port = free_port()
    stop = metrics.serve_metrics("127.0.0.1", port)
    try:
        metrics.spawn_started("served")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
            body = response.read().decode()
    finally:
        metrics.spawn_ended("served", "succeeded")
        stop()
    assert 'ongrid_spawns_in_flight{persona="served",status="running"} 1.0' in body
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30)


def test_a_port_in_use_is_refused_naming_the_port_and_the_setting():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(UserError) as refused:
            metrics.serve_metrics("127.0.0.1", port)
    message = str(refused.value)
    assert f"127.0.0.1:{port}" in message
    assert "ONGRID_METRICS_PORT" in message and "metrics_port" in message


class _Hub:
    def __init__(self, status: dict) -> None:
        self._status = status

    def status(self) -> dict:
        return self._status


def test_mcp_servers_are_reported_from_the_hub_at_scrape_time():
    registry = CollectorRegistry()
    hub: list[_Hub | None] = [None]
    registry.register(metrics.McpServerCollector(lambda: hub[0]))
    assert "ongrid_mcp_server_up{" not in generate_latest(registry).decode()

    hub[0] = _Hub(
        {
            "p_time": {"state": "up", "restarts": 0, "tools": ["a", "b"]},
            "p_tickets": {"state": "down", "restarts": 3, "tools": ["c"]},
        }
    )
    text = generate_latest(registry).decode()
    assert 'ongrid_mcp_server_up{server="p_time"} 1.0' in text
    assert 'ongrid_mcp_server_up{server="p_tickets"} 0.0' in text
    assert 'ongrid_mcp_server_restarts{server="p_tickets"} 3.0' in text
    assert 'ongrid_mcp_server_tools{server="p_time"} 2.0' in text
