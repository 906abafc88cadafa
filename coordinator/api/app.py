"""The HTTP API application: built from one :class:`~registry.settings.Settings`, served by uvicorn.

``create_app(settings)`` wires the database (SQLite by default, PostgreSQL by URL; migrated at
start when reachable, else on first contact), the persona registry over the ``agents`` table, the
chat store, the spawn client (Celery + Redis), the tool catalog, the stream hub (one pub/sub
connection for every event stream of the process) and the per-user limits, then mounts the routers,
``/metrics``, the request telemetry (traces exported when ``otlp_endpoint`` is set) and the web
console at ``/``. While it serves, it announces where its database and Redis are, for workers
to check theirs against (:mod:`coordinator.topology`).
"""

from __future__ import annotations

import contextlib
import logging
import resource
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import redis
import uvicorn
from anyio import CapacityLimiter
from fastapi import FastAPI
from sqlalchemy.exc import SQLAlchemyError
from uvicorn.main import STARTUP_FAILURE

from coordinator import version
from coordinator.api import (
    agents,
    approvals,
    chat,
    health,
    me,
    notifications,
    plugins,
    skills,
    spawns,
    workers,
)
from coordinator.api import schedules as schedules_api
from coordinator.api._headers import FramingHeadersMiddleware
from coordinator.api.console import install_console
from coordinator.api.deps import Services
from coordinator.api.docs import install_docs
from coordinator.api.errors import BodyLimitMiddleware, JsonBodyMiddleware, install_error_handlers
from coordinator.api.limits import ApiLimiter
from coordinator.api.metrics import install_metrics
from coordinator.api.stream_hub import StreamHub
from coordinator.audit_follower import AuditFollower
from coordinator.notify.sender import NotificationSender
from coordinator.plugin_manager import PluginManager
from coordinator.schedules import ScheduleBook
from coordinator.storage.audit import AuditStore
from coordinator.storage.chats import ChatStore
from coordinator.storage.engine import Database, DatabaseUnavailable, database_url, make_engine
from coordinator.storage.notifications import NotificationStore
from coordinator.storage.personas import GuardedUserStore, SqlUserStore
from coordinator.storage.plugins import PluginStore
from coordinator.storage.schedules import ScheduleStore
from coordinator.topology import ApiAnnouncer
from coordinator.web import DIST
from registry.defaults import build_registry
from registry.settings import DEFAULT_API_PORT, Settings
from workers.celery_app import DEFAULT_REDIS_URL, celery_key_prefix, make_celery
from workers.client import SpawnClient
from workers.hardening import harden_process
from workers.reload import RegistryFollower, cluster_version
from workers.tools import default_catalog
from workers.tracing import init_tracing, shutdown_tracing

__all__ = ["MAX_BODY_BYTES", "build_services", "create_app", "serve"]

log = logging.getLogger(__name__)

#: Largest request body accepted (a persona with a long prompt fits many times over).
MAX_BODY_BYTES = 256 * 1024
#: Seconds the probe's Redis client waits to connect or for an answer.
PROBE_TIMEOUT = 3.0
#: Seconds open streams get to finish when the server stops, before they are cut.
SHUTDOWN_GRACE = 5


def build_services(settings: Settings) -> Services:
    """Everything the endpoints share. Does not fail when the database is down (see /readyz)."""
    database = Database(make_engine(database_url(settings)))
    try:
        database.ensure()
    except DatabaseUnavailable as exc:
        log.warning("starting without the database (not ready until it answers): %s", exc)
    url = settings.redis_url or DEFAULT_REDIS_URL
    # The cluster's registry version before the disk and the database are read: a reload that
    # lands in between is then seen as newer, not silently missed.
    version = cluster_version(redis.Redis.from_url(url), settings.key_prefix)
    users = GuardedUserStore(SqlUserStore(database.engine), database)
    plugin_store = PluginStore(database.engine)
    # Installed plugins come from the database, so API processes on several hosts agree.
    registry = build_registry(settings, users, plugin_store)
    # Spawns are checked against the registry that holds the user personas.
    client = SpawnClient(settings, registry=registry)
    audit = AuditStore(database.engine)
    outbox = NotificationStore(database.engine)
    return Services(
        settings=settings,
        database=database,
        users=users,
        registry=registry,
        follower=RegistryFollower(client.redis, registry, settings.key_prefix, seen=version),
        chats=ChatStore(database.engine),
        client=client,
        catalog=default_catalog(settings.tool_modules),
        probe=redis.Redis.from_url(
            url, socket_connect_timeout=PROBE_TIMEOUT, socket_timeout=PROBE_TIMEOUT
        ),
        audit=audit,
        audit_follower=AuditFollower(client.approvals, audit, database),
        schedules=ScheduleBook(ScheduleStore(database.engine), make_celery(settings)),
        plugins=PluginManager(
            settings.marketplace_root,
            plugin_store,
            broadcast=client.reload,
            allow_network=settings.plugins_allow_network,
            reserved_tools=default_catalog(settings.tool_modules).names(),
            config_servers=settings.mcp_servers,
        ),
        hub=StreamHub(url),
        limits=ApiLimiter(settings.limits, client.redis, settings.key_prefix),
        intake=CapacityLimiter(settings.intake_threads),
        notifications=outbox,
        notifier=NotificationSender(settings, outbox, database, client.redis),
    )


def _sync_schedules(services: Services) -> None:
    """The config file's schedules stored, and the beat's entries as the database says. With
    the database or Redis down the API starts anyway; the entries stay as they were."""
    try:
        services.database.ensure()
        services.schedules.sync_all(services.settings.schedules)
    except (DatabaseUnavailable, SQLAlchemyError, redis.RedisError) as exc:
        log.warning("schedules not synced with the beat at start: %s", exc)


def create_app(settings: Settings, *, console_dist: Path = DIST) -> FastAPI:
    """The ASGI application for ``settings``; ``console_dist`` holds the web console's build."""
    services = build_services(settings)
    traced = init_tracing(settings, "ongrid-api")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        _sync_schedules(services)
        services.audit_follower.start()
        services.notifier.start()
        services.hub.start()
        # Where this API's database and Redis are, for workers to check theirs against.
        announcer = ApiAnnouncer(settings, services.database).start()
        yield
        announcer.stop()
        await services.hub.aclose()
        services.close()
        scrape_client.close()
        if traced:
            shutdown_tracing()  # the spans of the last requests are sent before the exit

    app = FastAPI(
        title="Ongrid persona runtime",
        version=version(),
        description="Chat with the coordinator and its specialist personas, stream their events, "
        "manage custom personas. Every `/api` and `/v1` route needs `Authorization: Bearer`.",
        lifespan=lifespan,
        docs_url=None,  # served from local assets by install_docs
        redoc_url=None,
        # The API traces and counts requests itself (coordinator.api.metrics). FastAPI's own
        # telemetry would, once some library set a global OpenTelemetry provider, add a second
        # server span and put request validation errors with the values sent (prompts) on
        # spans; and it looks those providers up on every request, off or not.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    install_docs(app)
    app.state.services = services
    install_error_handlers(app)
    app.add_middleware(JsonBodyMiddleware)
    app.add_middleware(BodyLimitMiddleware, max_bytes=MAX_BODY_BYTES)
    # Outermost: requests the body limit refuses are counted and traced too.
    scrape_client = install_metrics(
        app, settings.redis_url or DEFAULT_REDIS_URL, celery_key_prefix(settings)
    )
    # Outside even the metrics: no response leaves without its framing headers (errors too).
    app.add_middleware(FramingHeadersMiddleware)
    for module in (me, chat, spawns, agents, skills, plugins, workers, notifications, health):
        app.include_router(module.router)
    app.include_router(schedules_api.router)
    app.include_router(approvals.router)
    app.include_router(approvals.audit_router)
    install_console(app, console_dist)
    return app


def _raise_open_files_limit() -> int:
    """Raise this process's soft limit of open files to its hard limit and return it: each open
    event stream holds a socket, and 1,024 (a common default) is soon reached."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open files limit from %s to %s: %s", soft, hard, exc)
    return soft


def serve(settings: Settings, host: str = "127.0.0.1", port: int = DEFAULT_API_PORT) -> None:
    """Serve the API with uvicorn until interrupted. Access logs carry no headers (no tokens)."""
    files = _raise_open_files_limit()
    app = create_app(settings)
    harden_process()  # the settings are built: secrets leave os.environ
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        timeout_graceful_shutdown=SHUTDOWN_GRACE,
        proxy_headers=False,
    )
    # Logged once uvicorn has set up its logging, so the figure shows beside its own lines.
    limit = "unlimited" if files == resource.RLIM_INFINITY else str(files)
    logging.getLogger("uvicorn.error").info("open files limit: %s (one per event stream)", limit)
    server = uvicorn.Server(config)
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    if not server.started:  # as uvicorn.run: a server that could not start exits non-zero
        sys.exit(STARTUP_FAILURE)
