"""``GET /metrics`` (Prometheus text exposition) and the telemetry of each HTTP request.

No token is needed, as for the probes of :mod:`coordinator.api.health`, and for the same reason:
the caller is the operator's infrastructure (a Prometheus scraper), which holds no bearer token.
What it reads is counts and latencies labelled with names an operator chose (queues, routes,
personas, models, tools), never a prompt, a session, a user or a token; a site that wants it
private keeps it off the public interface as it does ``/readyz``.

:class:`RequestTelemetry` wraps the application: per request, a server span (the parent of the
spawns the request starts, continuing a caller's ``traceparent`` header when it sends one) and
``ongrid_http_requests_total{route,status}``, by route template, so that arbitrary paths cannot
grow the number of series.
"""

from __future__ import annotations

import functools

import redis
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response
from opentelemetry.trace import Span, SpanKind, StatusCode
from prometheus_client import REGISTRY, CollectorRegistry, Counter, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from workers import tracing
from workers.metrics import QueueDepthCollector

__all__ = ["SCRAPE_TIMEOUT", "RequestTelemetry", "install_metrics", "router"]

#: Seconds the queue-depth read may wait on Redis: a scrape must answer when Redis does not.
SCRAPE_TIMEOUT = 0.5
#: The route label of a request no route matched (a 404, a probe of random paths).
_UNMATCHED = "unmatched"

HTTP_REQUESTS = Counter(
    "ongrid_http_requests",
    "HTTP requests the API answered, by route template and status code.",
    ["route", "status"],
)
_requests = functools.cache(HTTP_REQUESTS.labels)

router = APIRouter(tags=["health"])


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text."}},
)
async def metrics(request: Request) -> Response:
    """The API process's metrics and the depth of each queue, in Prometheus text format."""
    scraped: CollectorRegistry = request.app.state.metrics_registry
    # Off the event loop: the queue-depth collector waits on Redis.
    body = await run_in_threadpool(lambda: generate_latest(REGISTRY) + generate_latest(scraped))
    return Response(body, media_type=CONTENT_TYPE_LATEST)


def install_metrics(app: FastAPI, redis_url: str, celery_prefix: str = "") -> redis.Redis:
    """Mount ``/metrics`` and the request telemetry on ``app``; the queue depths are read from
    ``redis_url`` (under Celery's key prefix). Returns the collector's Redis client, for the
    caller to close."""
    client = redis.Redis.from_url(
        redis_url, socket_connect_timeout=SCRAPE_TIMEOUT, socket_timeout=SCRAPE_TIMEOUT
    )
    # The app's own registry: each app built in a process has its own queue collector, and
    # the default registry keeps the process-wide series.
    scraped = CollectorRegistry(auto_describe=True)
    scraped.register(QueueDepthCollector(client, key_prefix=celery_prefix))
    app.state.metrics_registry = scraped
    app.include_router(router)
    app.add_middleware(RequestTelemetry)
    return client


class RequestTelemetry:
    """ASGI middleware: a server span and a counted status per HTTP request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method = scope["method"]
        status: int | None = None

        async def send_counted(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                _requests(_route(scope), str(status)).inc()
            await send(message)

        # A caller's trace is continued even when this process records nothing (its spawns
        # carry it on); without one and without recording, no span is made at all.
        carried = _trace_headers(scope)
        parent = tracing.extract(carried) if carried or tracing.tracing_enabled() else None
        with tracing.span(
            method,
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"http.request.method": method, "url.path": scope["path"]},
        ) as current:
            try:
                await self.app(scope, receive, send_counted)
            finally:
                if status is None:  # the app failed before answering: the server answers 500
                    status = 500
                    _requests(_route(scope), "500").inc()
                _finish(current, scope, status)


def _finish(current: Span, scope: Scope, status: int) -> None:
    if not current.is_recording():
        return
    route = _route(scope)
    current.update_name(f"{scope['method']} {route}")
    current.set_attribute("http.route", route)
    current.set_attribute("http.response.status_code", status)
    if status >= 500:
        current.set_status(StatusCode.ERROR)


def _route(scope: Scope) -> str:
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else _UNMATCHED


def _trace_headers(scope: Scope) -> dict[str, str]:
    headers: dict[str, str] = {}
    for name, value in scope.get("headers", ()):
        if name in (b"traceparent", b"tracestate"):
            headers[name.decode("latin-1")] = value.decode("latin-1")
    return headers
