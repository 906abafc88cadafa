"""The worker process, built in one place for every way of starting it.

``ongrid worker``, ``celery -A workers.app worker …``, ``ongrid up`` (which runs ``ongrid
worker``) and the Compose services all run the Celery app :func:`worker_app` returns. The entry
point loads the settings once and passes them here; nothing reads the environment at import.

The app carries three bootsteps, which run only when it starts a worker (never for Flower,
``celery inspect`` or a process that only sends tasks):

* :class:`_Runtime`, before the worker takes anything: migrates the database, refuses a
  configuration that cannot work with the one the API announced (:mod:`coordinator.topology`),
  builds the :class:`~workers.runtime.WorkerRuntime` (registry caught up, lease and reaper
  threads, litellm loaded), hardens the process (secrets leave ``os.environ``, provider keys go
  to the runtime), reads user personas from the database, installs the coordinator persona and
  the AgentTool, and makes the runtime the one this process's spawn tasks run on. Any failure
  stops the worker with the reason before it consumes a message.
* :class:`_Observe`, before the worker takes anything: serves the process's Prometheus metrics
  on ``metrics_port`` when it is set (a port in use stops the worker, naming it) and installs
  the OTLP trace exporter when ``otlp_endpoint`` is set (its spans name the worker's node as
  their ``service.instance.id``); both stop after the pool has.
* :class:`_Advertise`, once the consumer consumes: advertises the queues it actually consumes
  (those of ``-Q``), so callers can refuse a spawn nobody would run (:mod:`workers.consumers`),
  and reports the registry version and persona set the process runs, for the fleet view
  (:mod:`workers.fleet`); both withdrawn when the consumer stops.

This module lives under ``coordinator/`` because a worker process is composed of both packages:
the runtime from ``workers/``, the database and the coordinator from here. ``workers.app``, the
module the raw Celery command names, reaches it only when Celery first asks for ``app``.

A plain ``ongrid worker`` also serves coordinator turns, in a :class:`ChildWorker`: a child
``ongrid worker --queues ongrid.coordinator`` process with slots of its own. A coordinator turn
holds its slot while it waits on specialists; in a pool of its own, turns can never take every
slot the specialists need. Its metrics are served on the next port, ``metrics_port + 1``.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import redis
from celery import Celery, bootsteps
from celery.signals import worker_shutdown, worker_shutting_down

from registry.errors import OngridError
from registry.settings import Settings
from workers.celery_app import DEFAULT_REDIS_URL, QUEUES, make_celery, redis_unreachable
from workers.consumers import QueueAdvertiser
from workers.fleet import FleetReporter, runtime_report, runtime_version
from workers.metrics import serve_metrics
from workers.presence import RENEW_FRACTION
from workers.runtime import WorkerRuntime, use_worker_runtime
from workers.tracing import init_tracing, shutdown_tracing

__all__ = ["ChildWorker", "build_runtime", "die_with_parent", "entry_app", "worker_app"]

log = logging.getLogger(__name__)

#: Seconds the advertiser's Redis client waits to connect or for an answer.
_REDIS_TIMEOUT = 5.0


def build_runtime(settings: Settings) -> WorkerRuntime:
    """The runtime of a worker process, ready to run specialists and coordinator turns."""
    from coordinator.schedules import ScheduleFirer
    from coordinator.storage.engine import database_url, make_engine, upgrade
    from coordinator.storage.personas import SqlUserStore
    from coordinator.storage.plugins import PluginStore
    from coordinator.storage.schedules import ScheduleStore
    from coordinator.topology import CHECK_TIMEOUT, check_worker
    from coordinator.turns import install
    from workers.client import SpawnClient
    from workers.hardening import harden_process
    from workers.scheduling import use_schedule_firer

    engine = make_engine(database_url(settings))
    upgrade(engine)  # concurrent upgrades wait for each other
    # Before any thread starts: a worker set up for another database or Redis than the API
    # announced stops here, saying what to set.
    probe = redis.Redis.from_url(
        settings.redis_url or DEFAULT_REDIS_URL,
        socket_connect_timeout=CHECK_TIMEOUT,
        socket_timeout=CHECK_TIMEOUT,
    )
    try:
        check_worker(settings, engine, probe)
    finally:
        probe.close()
    runtime = WorkerRuntime(settings)  # registry caught up, lease/reaper threads started
    runtime.credentials = harden_process()  # settings are built: secrets leave os.environ
    # User personas and installed plugins from the database, which every host shares.
    runtime.use_user_store(SqlUserStore(engine), PluginStore(engine))
    install(runtime)  # the coordinator persona and the AgentTool
    # The runs of schedules the beat sends here start as spawns from this process.
    client = SpawnClient(settings, registry=runtime.registry)
    use_schedule_firer(ScheduleFirer(ScheduleStore(engine), client))
    return runtime


def worker_app(settings: Settings) -> Celery:
    """The Celery app of a worker process: :func:`~workers.celery_app.make_celery` plus the
    bootsteps that build the runtime and advertise the queues when it starts a worker."""
    app = make_celery(settings)
    app.steps["worker"].add(_observe_step(settings, app))
    app.steps["worker"].add(_runtime_step(settings, app))
    app.steps["consumer"].add(_advertise_step(settings))
    return app


_entry: Celery | None = None
_entry_lock = threading.Lock()


def entry_app() -> Celery:
    """The app of ``celery -A workers.app …``: settings loaded once, on first use."""
    global _entry
    with _entry_lock:
        if _entry is None:
            _entry = worker_app(Settings.load())
        return _entry


# -- bootsteps ---------------------------------------------------------------------------------


def _runtime_step(settings: Settings, app: Celery) -> type[bootsteps.StartStopStep]:
    class _Runtime(bootsteps.StartStopStep):
        name = "ongrid.runtime"

        def __init__(self, worker: Any, **kwargs: Any) -> None:
            super().__init__(worker, **kwargs)
            try:
                runtime = build_runtime(settings)
            except Exception as exc:  # noqa: BLE001 - a worker that cannot run spawns must not consume
                why = _why_not(settings, exc)
                # A refused setting or an unreachable service is the whole story; anything else
                # is a bug, whose traceback the log keeps.
                expected = isinstance(exc, OngridError | redis.RedisError)
                log.critical("the worker cannot start: %s", why, exc_info=not expected)
                raise SystemExit(f"ongrid worker: cannot start: {why}") from exc
            use_worker_runtime(runtime)
            # Said where it matters: a worker of coordinator turns only (whose one tool is
            # spawn_agent) never runs a command.
            consumed = set(getattr(worker.app.amqp.queues, "consume_from", None) or ())
            no_sandbox = runtime.sandbox.unavailable()
            if no_sandbox is not None and consumed != {QUEUES["coordinator"]}:
                log.warning("bash and host_bash are unavailable on this worker: %s", no_sandbox)

            # After the pool has stopped (every spawn ended or handed back), not before: the
            # lease keeper must outlive the spawns it renews.
            def on_shutdown(sender: Any = None, **_: Any) -> None:
                if getattr(sender, "app", None) is app:
                    runtime.stop()
                    use_worker_runtime(None)

            worker_shutdown.connect(on_shutdown, weak=False)

    return _Runtime


def _observe_step(settings: Settings, app: Celery) -> type[bootsteps.StartStopStep]:
    class _Observe(bootsteps.StartStopStep):
        name = "ongrid.observe"

        def __init__(self, worker: Any, **kwargs: Any) -> None:
            super().__init__(worker, **kwargs)
            stop_metrics = None
            if settings.metrics_port:
                try:
                    stop_metrics = serve_metrics(settings.metrics_host, settings.metrics_port)
                except OngridError as exc:
                    log.critical("the worker cannot start: %s", exc)
                    raise SystemExit(f"ongrid worker: cannot start: {exc}") from None
            traced = init_tracing(settings, "ongrid-worker", instance=worker.hostname)

            # Once the pool has stopped: the spans of the last spawns are flushed, and the
            # metrics are served while spawns still end.
            def on_shutdown(sender: Any = None, **_: Any) -> None:
                if getattr(sender, "app", None) is app:
                    if traced:
                        shutdown_tracing()
                    if stop_metrics is not None:
                        stop_metrics()

            worker_shutdown.connect(on_shutdown, weak=False)

    return _Observe


def _why_not(settings: Settings, exc: Exception) -> str:
    """Why the runtime could not be built, naming the service when one is unreachable."""
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError):
        return redis_unreachable(settings, exc)
    return str(exc)


def _advertise_step(settings: Settings) -> type[bootsteps.StartStopStep]:
    url = settings.redis_url or DEFAULT_REDIS_URL

    class _Advertise(bootsteps.StartStopStep):
        name = "ongrid.advertise-queues"
        requires = ("celery.worker.consumer.tasks:Tasks",)

        def __init__(self, consumer: Any, **kwargs: Any) -> None:
            super().__init__(consumer, **kwargs)
            self.advertiser: QueueAdvertiser | None = None
            self.reporter: FleetReporter | None = None

        def start(self, consumer: Any) -> None:
            def queues() -> list[str]:
                task_consumer = consumer.task_consumer
                return [q.name for q in task_consumer.queues] if task_consumer else []

            _warn_if_shared(queues())
            client = redis.Redis.from_url(
                url, socket_connect_timeout=_REDIS_TIMEOUT, socket_timeout=_REDIS_TIMEOUT
            )
            ttl = settings.presence_ttl_seconds
            every = ttl * RENEW_FRACTION
            self.advertiser = QueueAdvertiser(
                client, consumer.hostname, queues, ttl=ttl, every=every,
                prefix=settings.key_prefix,
            )  # fmt: skip
            self.advertiser.start()
            log.info("advertising the queues %s", ", ".join(sorted(queues())))
            # The runtime step ran before the consumer started: the runtime exists.
            member = self.advertiser.member
            self.reporter = FleetReporter(
                client, member, runtime_report(member, queues),
                watch=runtime_version, ttl=ttl, every=every, prefix=settings.key_prefix,
            )  # fmt: skip
            self.reporter.start()

        def stop(self, consumer: Any) -> None:
            if self.reporter is not None:
                self.reporter.stop()
                self.reporter = None
            if self.advertiser is not None:
                self.advertiser.stop()
                self.advertiser.client.close()
                self.advertiser = None

        shutdown = terminate = stop

    return _Advertise


def _warn_if_shared(queues: list[str]) -> None:
    coordinator = QUEUES["coordinator"]
    others = sorted(q for q in queues if q != coordinator)
    if coordinator in queues and others:
        log.warning(
            "this worker consumes %s and %s in one pool: coordinator turns hold their slots "
            "while they wait on specialists and can take every slot the specialists need; run "
            "them in pools of their own (a plain `ongrid worker` does)",
            coordinator,
            ", ".join(others),
        )


# -- the coordinator pool of a plain `ongrid worker` -------------------------------------------

_PR_SET_PDEATHSIG = 1
#: Seconds a restarted coordinator pool must live to count as recovered (its back-off resets).
_STABLE_AFTER = 60.0
_MAX_BACKOFF = 60.0


def die_with_parent(parent_pid: int) -> None:
    """Have the kernel send this process SIGTERM when ``parent_pid`` (its parent) exits, so a
    killed ``ongrid worker`` leaves no coordinator pool behind. Linux only; elsewhere a no-op."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is not None:
        libc = ctypes.CDLL(libc_name, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        raise SystemExit("ongrid worker: the parent worker is gone")


class ChildWorker:
    """An ``ongrid worker`` child process of a plain ``ongrid worker``: its coordinator pool
    (``ongrid.coordinator``), or one more process for the specialists' queues (``--processes``).

    Started before the parent hardens itself, with a copy of its environment (which the
    restarts reuse: the parent's own ``os.environ`` no longer holds the secrets then). Restarted
    with a growing back-off when it dies; told to shut down as soon as the parent begins to;
    killed with the parent by the kernel (:func:`die_with_parent`). ``port_offset``: its metrics
    port is the parent's plus this (two processes cannot serve one).
    """

    def __init__(
        self,
        *,
        name: str,
        queues: str,
        concurrency: int,
        loglevel: str,
        port_offset: int,
        what: str,
    ) -> None:
        self.argv = [
            sys.executable,
            "-m",
            "coordinator",
            "worker",
            f"--queues={queues}",
            f"--name={name}",
            f"--concurrency={concurrency}",
            f"--loglevel={loglevel}",
            f"--exit-with-parent={os.getpid()}",
        ]
        self.port_offset = port_offset
        #: How the log names it: "the coordinator pool", "worker process 2"…
        self.what = what
        self._env: dict[str, str] = {}
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    @classmethod
    def coordinator_pool(cls, *, name: str, slots: int, loglevel: str) -> ChildWorker:
        return cls(
            name=f"{name}-coordinator",
            queues=QUEUES["coordinator"],
            concurrency=slots,
            loglevel=loglevel,
            port_offset=1,
            what="the coordinator pool",
        )

    def start(self) -> ChildWorker:
        self._env = _child_environ(dict(os.environ), self.port_offset)
        self._spawn()
        threading.Thread(target=self._supervise, name=f"child-{self.what}", daemon=True).start()
        worker_shutting_down.connect(self._on_parent_shutdown, weak=False)
        return self

    def _spawn(self) -> None:
        with self._lock:
            if not self._stopping.is_set():
                self._proc = subprocess.Popen(self.argv, env=self._env)
                log.info("%s started (pid %d)", self.what, self._proc.pid)

    def _supervise(self) -> None:
        backoff = 1.0
        while self._proc is not None:
            started = time.monotonic()
            code = self._proc.wait()
            if self._stopping.is_set():
                return
            if time.monotonic() - started > _STABLE_AFTER:
                backoff = 1.0
            log.error(
                "%s (pid %d) exited with status %s; starting it again in %.0f s",
                self.what,
                self._proc.pid,
                code,
                backoff,
            )
            if self._stopping.wait(backoff):
                return
            backoff = min(backoff * 2, _MAX_BACKOFF)
            self._spawn()

    def _on_parent_shutdown(self, **_: Any) -> None:
        # In the parent's signal handler: only ask, never wait.
        self._stopping.set()
        with contextlib.suppress(ProcessLookupError):
            if self._proc is not None and self._proc.poll() is None:
                self._proc.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 60.0) -> None:
        """Warm shutdown of the child (its turns hand back at their next checkpoint); SIGKILL
        after ``timeout`` seconds."""
        with self._lock:
            self._stopping.set()
            proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            log.error("%s did not stop within %.0f s; killing it", self.what, timeout)
            proc.kill()
            proc.wait()


def _child_environ(environ: dict[str, str], port_offset: int) -> dict[str, str]:
    """A child worker's environment: the parent's, with the parent's metrics port plus
    ``port_offset`` (two processes cannot serve one), whether the parent's came from the
    environment or the file."""
    port = Settings.load(environ).metrics_port
    return {**environ, "ONGRID_METRICS_PORT": str(port + port_offset)} if port else environ
