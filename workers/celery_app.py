"""The Celery application: Redis broker, settings for long LLM-bound tasks, three queues.

Why these settings:

- ``task_acks_late`` + ``task_reject_on_worker_lost``: a spawn's message is acknowledged after the
  run, so a crashed worker's spawn is delivered again instead of vanishing;
- ``worker_prefetch_multiplier=1``: a worker takes no more spawns than it has free slots;
- one ``visibility_timeout`` in the broker and result-backend transport options, longer than any
  spawn may run (``SPAWN_TIME_LIMIT``), so Redis never re-delivers a spawn that is still running;
  quick recovery after a crash comes from the spawn lease (see :mod:`workers.runtime`), not from
  this timeout;
- queues: ``ongrid.interactive`` (awaited spawns), ``ongrid.background`` (long investigations, so
  they never starve interactive ones) and ``ongrid.coordinator`` (coordinator turns, which wait
  on specialists: a separate worker pool for them means waiting can never deadlock the pool the
  specialists run on).

Pool: a spawn's work runs as a coroutine on the worker process's event loop
(:mod:`workers.engine`); the task only hands it over and waits on a future. Workers therefore
use the **threads** pool with a high concurrency (``-c``, default 1024): a waiting task thread
holds no GIL and little memory, and Celery keeps acknowledging, routing and reporting every spawn
(Flower sees each one). A pool of one process per spawn (prefork) would hold far fewer.

This app only knows how to send and route tasks; a worker process also needs the runtime its
spawn task runs on, which :func:`coordinator.worker.worker_app` adds (every entry point uses it).
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from kombu import Exchange, Queue

from registry.settings import Settings

__all__ = [
    "FIRE_TASK",
    "PING_TASK",
    "QUEUES",
    "SPAWN_TASK",
    "SPAWN_TIME_LIMIT",
    "VISIBILITY_TIMEOUT",
    "celery_key_prefix",
    "make_celery",
    "redis_unreachable",
]

SPAWN_TASK = "ongrid.spawn"
#: Sent by the beat at each due time of a schedule; starts its run (:mod:`workers.scheduling`).
FIRE_TASK = "ongrid.schedule.fire"
PING_TASK = "ongrid.ping"
QUEUES = {
    "interactive": "ongrid.interactive",
    "background": "ongrid.background",
    "coordinator": "ongrid.coordinator",
}
#: Hard limit of one spawn attempt, in seconds.
SPAWN_TIME_LIMIT = 6 * 3600
#: Longer than any attempt may take, so Redis never re-delivers a spawn that is still running.
VISIBILITY_TIMEOUT = SPAWN_TIME_LIMIT + 3600
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def redis_unreachable(settings: Settings, exc: Exception) -> str:
    """One line for a Redis that does not answer: where, why, and what to do."""
    from redis.connection import parse_url

    url = parse_url(settings.redis_url or DEFAULT_REDIS_URL)
    where = f"{url.get('host', '127.0.0.1')}:{url.get('port', 6379)}"
    return f"Redis at {where} is unreachable ({exc}); start it or set REDIS_URL"


def _run_spawn(task: Any, spawn_id: str, persona: str) -> dict[str, Any]:
    """Run or resume one spawn. ``persona`` is only there so Flower shows who runs. The runtime
    is the one the worker process's builder registered before the worker took any task."""
    from workers.runtime import worker_runtime

    return worker_runtime().execute(spawn_id)


def _fire_schedule(
    name: str, due_at: str, missed: int = 0, missed_since: str = ""
) -> dict[str, Any]:
    """Start (or skip) the run of schedule ``name`` due at ``due_at`` (ISO 8601); ``missed``:
    record that many due times up to ``due_at`` as missed (the beat was down)."""
    from workers.scheduling import fire

    return fire(name, due_at, missed, missed_since)


def _ping() -> str:
    """Health check: a task that does nothing; also the baseline of the spawn benchmark."""
    return "pong"


def celery_key_prefix(settings: Settings) -> str:
    """What Celery's own keys (queues, unacked messages, results) start with in Redis.

    A named stack (``ONGRID_CLUSTER``) keeps them under its key prefix, so stacks sharing a Redis
    database never take each other's spawns; without a name they stay where Celery puts them.
    """
    return settings.key_prefix if settings.cluster else ""


#: kombu's Redis transport, reusing one client per channel (:mod:`workers._kombu_redis`).
_REDIS_TRANSPORT = "workers._kombu_redis:Transport"


def _broker_transport(url: str) -> str | None:
    """The transport for ``url``: ours for a Redis URL, else whatever its scheme names."""
    scheme = url.partition("://")[0].lower()
    return _REDIS_TRANSPORT if scheme in ("redis", "rediss") else None


def make_celery(settings: Settings) -> Celery:
    from workers.scheduling import beat_config

    url = settings.redis_url or DEFAULT_REDIS_URL
    app = Celery("ongrid", broker=url, backend=url)
    transport: dict[str, Any] = {"visibility_timeout": VISIBILITY_TIMEOUT}
    if prefix := celery_key_prefix(settings):
        # kombu prefixes every key and pub/sub channel it uses, Celery's events included.
        transport["global_keyprefix"] = prefix
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_transport=_broker_transport(url),
        broker_transport_options=transport,
        result_backend_transport_options=transport,
        task_queues=[Queue(name, Exchange(name), routing_key=name) for name in QUEUES.values()],
        task_default_queue=QUEUES["interactive"],
        # A schedule's fire only starts a spawn: it waits behind no interactive spawn.
        task_routes={FIRE_TASK: {"queue": QUEUES["background"]}},
        task_time_limit=SPAWN_TIME_LIMIT,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_expires=7 * 86400,
        task_track_started=True,
        task_send_sent_event=True,
        worker_send_task_events=True,
        broker_connection_retry_on_startup=True,
        worker_pool="threads",
        worker_concurrency=1024,
        **beat_config(settings, url),
    )
    # A spawn's outcome is its record in the spawn store (and Flower reads Celery's events):
    # nobody reads Celery's result of it, so none is stored.
    app.task(name=SPAWN_TASK, bind=True, ignore_result=True)(_run_spawn)
    app.task(name=PING_TASK)(_ping)
    app.task(name=FIRE_TASK, ignore_result=True)(_fire_schedule)
    return app
