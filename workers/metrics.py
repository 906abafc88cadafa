"""Prometheus metrics of the runtime: what a worker holds and does, and what waits in the queues.

Every series lives in prometheus-client's default registry, named ``ongrid_…``. The engine
reports through the small functions below, once per spawn, turn, model call, tool call and
event; each costs a cached label child and one locked add (about a microsecond), because a
worker holding a thousand spawns calls them tens of thousands of times a minute. Label values
are names an operator chose (personas, models, tools, queues, event types), never user content.

A worker serves the registry with :func:`serve_metrics` (``Settings.metrics_port``); the API
serves it on ``GET /metrics`` together with a :class:`QueueDepthCollector`, which reads the
length of each Celery queue from Redis at scrape time.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal

import redis
from kombu.transport.redis import PRIORITY_STEPS, Channel
from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from registry.errors import UserError
from workers.celery_app import QUEUES
from workers.messages import Event, Usage

__all__ = [
    "McpServerCollector",
    "QueueDepthCollector",
    "ToolOutcome",
    "event_published",
    "lease_lost",
    "model_call",
    "reaper_resumed",
    "serve_metrics",
    "spawn_claimed",
    "spawn_ended",
    "spawn_started",
    "tool_call",
    "turn_done",
    "watch_mcp",
]

log = logging.getLogger(__name__)

ToolOutcome = Literal["ok", "error", "denied", "interrupted"]

#: Seconds from enqueue to claim: milliseconds when a slot is free, minutes when none is.
_WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)
#: Seconds of a model call or a whole turn: a reply takes from a second to minutes.
_CALL_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)

SPAWNS_IN_FLIGHT = Gauge(
    "ongrid_spawns_in_flight",
    "Spawns this worker process holds, by persona and status.",
    ["persona", "status"],
)
SPAWN_QUEUE_WAIT = Histogram(
    "ongrid_spawn_queue_wait_seconds",
    "Seconds from a spawn's enqueue to its claim by a worker, by queue.",
    ["queue"],
    buckets=_WAIT_BUCKETS,
)
SPAWNS_FINISHED = Counter(
    "ongrid_spawns_finished",
    "Spawn attempts this worker ended, by persona and the status they ended in.",
    ["persona", "status"],
)
TURN_SECONDS = Histogram(
    "ongrid_turn_seconds",
    "Seconds of one turn of the loop (model call and the tool calls it asked for), by persona.",
    ["persona"],
    buckets=_CALL_BUCKETS,
)
MODEL_CALL_SECONDS = Histogram(
    "ongrid_model_call_seconds",
    "Seconds of one model call, answered or failed, by model.",
    ["model"],
    buckets=_CALL_BUCKETS,
)
MODEL_ERRORS = Counter(
    "ongrid_model_errors",
    "Model calls that failed, by model and cause.",
    ["model", "cause"],
)
TOKENS = Counter(
    "ongrid_tokens",
    "Tokens of answered model calls, by model, persona and kind: prompt (all input, cached "
    "or not), completion, cache_write and cache_read (the parts of prompt the provider's "
    "prompt cache wrote and read).",
    ["model", "persona", "kind"],
)
COST_USD = Counter(
    "ongrid_cost_usd",
    "Cost in USD of answered model calls (litellm's accounting), by model and persona.",
    ["model", "persona"],
)
TOOL_CALLS = Counter(
    "ongrid_tool_calls",
    "Tool calls, by tool and outcome (ok, error, denied, interrupted).",
    ["tool", "outcome"],
)
EVENTS_PUBLISHED = Counter(
    "ongrid_events_published",
    "Events published to session streams, by event type.",
    ["type"],
)
LEASES_LOST = Counter(
    "ongrid_leases_lost",
    "Spawns this worker stopped running because another attempt took their lease.",
)
REAPER_RESUMPTIONS = Counter(
    "ongrid_reaper_resumptions",
    "Spawns the reaper enqueued again because their worker's lease had expired.",
)

# One cached child per label tuple: ``labels()`` takes a lock and builds a key on every call.
_in_flight = functools.cache(SPAWNS_IN_FLIGHT.labels)
_queue_wait = functools.cache(SPAWN_QUEUE_WAIT.labels)
_finished = functools.cache(SPAWNS_FINISHED.labels)
_turn = functools.cache(TURN_SECONDS.labels)
_model_seconds = functools.cache(MODEL_CALL_SECONDS.labels)
_model_errors = functools.cache(MODEL_ERRORS.labels)
_tokens = functools.cache(TOKENS.labels)
_cost = functools.cache(COST_USD.labels)
_tools = functools.cache(TOOL_CALLS.labels)
_events = functools.cache(EVENTS_PUBLISHED.labels)


def spawn_started(persona: str) -> None:
    """This process began to run an attempt of a spawn of ``persona``."""
    _in_flight(persona, "running").inc()


def spawn_ended(persona: str, status: str) -> None:
    """The attempt :func:`spawn_started` counted ended, in ``status`` (``succeeded``,
    ``failed``, ``cancelled``, ``waiting``, ``handed-back``, ``lease-lost``…)."""
    _in_flight(persona, "running").dec()
    _finished(persona, status).inc()


def spawn_claimed(queue: str, waited_seconds: float) -> None:
    """A spawn of ``queue`` was claimed ``waited_seconds`` after it was enqueued."""
    _queue_wait(queue).observe(max(waited_seconds, 0.0))


def turn_done(persona: str, seconds: float) -> None:
    """One turn of a spawn of ``persona`` took ``seconds``."""
    _turn(persona).observe(seconds)


def model_call(
    model: str, persona: str, seconds: float, usage: Usage | None, error_cause: str | None
) -> None:
    """One model call of ``persona`` on ``model`` took ``seconds``; answered with ``usage``, or
    failed for ``error_cause`` (a short stable word: ``rate-limit``, ``timeout``, ``status-500``).
    """
    _model_seconds(model).observe(seconds)
    if error_cause is not None:
        _model_errors(model, error_cause).inc()
    if usage is not None:
        if usage.prompt_tokens:
            _tokens(model, persona, "prompt").inc(usage.prompt_tokens)
        if usage.completion_tokens:
            _tokens(model, persona, "completion").inc(usage.completion_tokens)
        if usage.cache_write_tokens:
            _tokens(model, persona, "cache_write").inc(usage.cache_write_tokens)
        if usage.cache_read_tokens:
            _tokens(model, persona, "cache_read").inc(usage.cache_read_tokens)
        if usage.cost > 0:
            _cost(model, persona).inc(usage.cost)


def tool_call(tool: str, outcome: ToolOutcome) -> None:
    """One call of ``tool`` ended with ``outcome``."""
    _tools(tool, outcome).inc()


def event_published(event: Event) -> None:
    """``event`` was published to its session's stream."""
    _events(event.type).inc()


def lease_lost() -> None:
    """A spawn of this process lost its lease to another attempt."""
    LEASES_LOST.inc()


def reaper_resumed(count: int = 1) -> None:
    """The reaper enqueued ``count`` spawns again whose worker was lost."""
    REAPER_RESUMPTIONS.inc(count)


# -- exposition --------------------------------------------------------------------------------


def serve_metrics(host: str, port: int) -> Callable[[], None]:
    """Serve the default registry over HTTP on ``host:port`` from a daemon thread; returns the
    function that stops it. A port that cannot be bound is a :class:`UserError` naming it."""
    try:
        server, thread = start_http_server(port, addr=host)
    except OSError as exc:
        raise UserError(
            f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}; choose another port "
            "with ONGRID_METRICS_PORT (setting metrics_port; a plain `ongrid worker` also takes "
            "the next port for its coordinator pool) or 0 to serve none"
        ) from None
    log.info("serving Prometheus metrics on http://%s:%d/metrics", host, port)

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

    return stop


class QueueDepthCollector(Collector):
    """``ongrid_queue_depth{queue}``: messages waiting in each Celery queue, read from Redis at
    scrape time (one pipelined ``LLEN`` per queue and priority level), and
    ``ongrid_queue_depth_up``: 1 when Redis answered, 0 when it did not. A Redis that does not
    answer within its client's timeout yields no depth, never a failed scrape."""

    def __init__(
        self, client: redis.Redis, queues: Iterable[str] = QUEUES.values(), key_prefix: str = ""
    ) -> None:
        """``key_prefix``: Celery's (:func:`workers.celery_app.celery_key_prefix`)."""
        self.client = client
        self.queues = list(queues)
        self.key_prefix = key_prefix

    def describe(self) -> Iterator[Metric]:
        # What collect yields, without asking Redis (the registry calls this at register time).
        yield GaugeMetricFamily("ongrid_queue_depth", _DEPTH_HELP, labels=["queue"])
        yield GaugeMetricFamily("ongrid_queue_depth_up", _UP_HELP)

    def collect(self) -> Iterator[Metric]:
        depths = self._depths()
        yield GaugeMetricFamily("ongrid_queue_depth_up", _UP_HELP, value=int(depths is not None))
        depth = GaugeMetricFamily("ongrid_queue_depth", _DEPTH_HELP, labels=["queue"])
        for queue, count in (depths or {}).items():
            depth.add_metric([queue], count)
        yield depth

    def _depths(self) -> dict[str, int] | None:
        pipe = self.client.pipeline(transaction=False)
        for queue in self.queues:
            for key in _priority_keys(queue):
                pipe.llen(self.key_prefix + key)
        try:
            counts: list[Any] = pipe.execute()
        except redis.RedisError as exc:
            log.debug("queue depth unknown: Redis did not answer: %s", exc)
            return None
        per_queue = len(PRIORITY_STEPS)
        return {
            queue: sum(counts[i * per_queue : (i + 1) * per_queue])
            for i, queue in enumerate(self.queues)
        }


class McpServerCollector(Collector):
    """``ongrid_mcp_server_up{server}`` (1 up, 0 starting or down), ``ongrid_mcp_server_restarts``
    and ``ongrid_mcp_server_tools`` of this worker's MCP servers, read from its hub at scrape
    time (``hub()`` gives the hub, or ``None`` while the worker runs none)."""

    def __init__(self, hub: Callable[[], Any]) -> None:
        self.hub = hub

    def describe(self) -> Iterator[Metric]:
        yield from self._families()

    def collect(self) -> Iterator[Metric]:
        hub = self.hub()
        up, restarts, tools = self._families()
        for key, status in (hub.status() if hub is not None else {}).items():
            up.add_metric([key], 1 if status.get("state") == "up" else 0)
            restarts.add_metric([key], status.get("restarts") or 0)
            tools.add_metric([key], len(status.get("tools") or ()))
        yield from (up, restarts, tools)

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily(
                "ongrid_mcp_server_up", "1 when the MCP server answers.", labels=["server"]
            ),
            GaugeMetricFamily(
                "ongrid_mcp_server_restarts", "Restarts since it was started.", labels=["server"]
            ),
            GaugeMetricFamily("ongrid_mcp_server_tools", "Tools it listed.", labels=["server"]),
        )


_mcp_collector: McpServerCollector | None = None


def watch_mcp(hub: Callable[[], Any]) -> None:
    """Report the MCP servers of ``hub()`` (this process's) on the default registry; the last
    call wins, so a process that builds its runtime again reports the new one."""
    global _mcp_collector
    if _mcp_collector is None:
        _mcp_collector = McpServerCollector(hub)
        REGISTRY.register(_mcp_collector)
    _mcp_collector.hub = hub


_DEPTH_HELP = "Messages waiting in each Celery queue of the runtime (read at scrape time)."
_UP_HELP = "1 when Redis answered the last queue-depth read, 0 when it did not."


def _priority_keys(queue: str) -> list[str]:
    """The Redis lists kombu keeps for ``queue``: one per priority step, the first unsuffixed."""
    return [queue if step == 0 else f"{queue}{Channel.sep}{step}" for step in PRIORITY_STEPS]
