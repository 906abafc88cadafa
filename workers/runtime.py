"""One worker process's runtime: registry, tools, models, event bus, spawn leases.

``execute(spawn_id)`` is the body of the Celery spawn task. It claims the spawn: takes its lease
(a Redis key with a short TTL that a heartbeat thread renews), so at most one worker runs a spawn
at a time, and marks it ``running`` in the same transaction. When a worker dies, its leases
expire; the reaper thread of any live worker sees a running spawn with no lease and enqueues it
again, and the next attempt resumes from the last checkpoint. A spawn whose worker was lost
``MAX_ATTEMPTS`` times is failed instead of being tried again (resuming after a person's decision
is an attempt too, but not a lost one).

A worker asked to stop (:meth:`WorkerRuntime.drain`, connected to Celery's warm shutdown by
:func:`connect_drain`) takes no new spawn and stops each of its own at the next checkpoint, or as
soon as a coordinator stops waiting on a specialist: the spawn's last checkpoint is kept, its
lease given back and the spawn enqueued again at once, so the shutdown waits for at most one
model or tool call per spawn, and another worker resumes the spawn.

One window is left to the broker: a message that a worker has taken from the queue but whose
task has not yet claimed the spawn (the hand-over from Celery's consumer to a pool thread). A
worker killed inside it leaves the spawn ``queued`` with its message in the broker's unacked set,
which the broker delivers again only after its visibility timeout.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from registry.agent_registry import AgentRegistry, Snapshot, UserStore
from registry.defaults import build_registry
from registry.errors import (
    LeaseLost,
    NotFoundError,
    OngridError,
    PersonaUnavailable,
    SpawnCancelled,
    WorkerDraining,
)
from registry.parser import dump_persona, parse_persona
from registry.persona import Persona
from registry.policy import ToolBag, resolve_bag
from registry.settings import Settings
from registry.template import Rendered, render
from registry.tools import ToolCatalog, ToolContext
from workers.celery_app import DEFAULT_REDIS_URL
from workers.events import EventBus
from workers.hardening import ProviderCredentials
from workers.loop import LoopSetup, LoopState, Outcome, run_loop
from workers.messages import AgentTile, Event, Message, TaskNotification, Usage
from workers.model import (
    DEMO_MODEL,
    Model,
    ModelError,
    RetryAbandoned,
    RetryingModel,
    RetryPolicy,
    resolve_model_id,
)
from workers.reload import RegistryFollower, cluster_version
from workers.sandbox import Sandbox
from workers.spawns import SpawnRecord, SpawnStore
from workers.tools import default_catalog

__all__ = [
    "MAX_ATTEMPTS",
    "SpawnCancelled",
    "WorkerRuntime",
    "connect_drain",
    "use_worker_runtime",
    "worker_runtime",
]

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 3
#: Heartbeat and reaper periods as fractions of the lease (``Settings.lease_seconds``): a lease
#: survives four missed heartbeats; a dead worker's spawn is re-enqueued within 1.3 leases.
HEARTBEAT_FRACTION = 0.2
REAP_FRACTION = 0.3

BASE_PROMPT = (
    "You are a specialist of Ongrid, an operations platform for SRE teams. You investigate with "
    "the tools you are given and report what they show. Cite the tool output behind each claim. "
    "When a tool fails, say so and work with what you have; never invent data."
)


def _load_model_adapter() -> None:
    """Import litellm (seconds of CPU) at start-up: a worker that says it is ready is, and the
    first spawn it takes does not wait for the import."""
    from workers._litellm import load

    load()


def model_for(model_id: str, credentials: ProviderCredentials | None = None) -> Model:
    if model_id == DEMO_MODEL:
        from workers.demo_model import DemoModel

        return DemoModel()
    from workers._litellm import LitellmModel

    return LitellmModel(credentials=credentials)


def system_prompt(persona: Persona) -> str:
    parts = [] if persona.omit_claude_md else [BASE_PROMPT]
    parts.append(persona.body.strip())
    if persona.critical_reminder.strip():
        parts.append(
            f"<critical-reminder>\n{persona.critical_reminder.strip()}\n</critical-reminder>"
        )
    return "\n\n".join(p for p in parts if p)


def turn_reminder(persona: Persona, model_id: str, bag: ToolBag, locale: str) -> str:
    """The framework's reminders, then the persona's critical reminder (SPEC §5)."""
    tools = ", ".join(bag.names()) or "none"
    lines = [
        f"Answer in the locale {locale}.",
        f"You are running on the model {model_id}.",
        f"Tools available: {tools}.",
    ]
    if persona.critical_reminder.strip():
        lines.append(persona.critical_reminder.strip())
    return "\n".join(lines)


def first_message(persona: Persona, prompt: str, context: dict[str, Any]) -> Rendered:
    """The spawn's first user message: the rendered ``initial_prompt``, then the prompt; with
    the context keys the template lacked."""
    if not persona.initial_prompt:
        return Rendered(prompt, [])
    opening = render(persona.initial_prompt, context)
    return Rendered(f"{opening.text.rstrip()}\n\n{prompt}", opening.missing)


def _about_to_run(state: LoopState) -> bool:
    """The checkpoint being taken is the write-ahead mark of the call the loop runs next."""
    return bool(state.pending) and state.pending[0].id in state.started


def _ending(state: LoopState) -> bool:
    """The loop returns right after this checkpoint: it holds the final answer, or the next
    call has just been put to a person (its approval entry is new and undecided)."""
    if state.final is not None:
        return True
    approval = state.approvals.get(state.pending[0].id) if state.pending else None
    return approval is not None and not approval.approved_by and approval.denied_by is None


@dataclass
class _Held:
    spawn_id: str
    token: str


class WorkerRuntime:
    def __init__(self, settings: Settings, *, start_threads: bool = True) -> None:
        self.settings = settings
        self.redis = redis.Redis.from_url(settings.redis_url or DEFAULT_REDIS_URL)
        version = cluster_version(self.redis)  # before the disk is read: see RegistryFollower
        self.registry: AgentRegistry = build_registry(settings)
        self.catalog: ToolCatalog = default_catalog(settings.tool_modules)
        self.sandbox = Sandbox.for_worker(settings)
        #: Model provider keys; a worker process replaces them with those it took out of the
        #: environment (:func:`workers.hardening.harden_process`).
        self.credentials = ProviderCredentials.from_environ()
        self.bus = EventBus(self.redis)
        self.store = SpawnStore(self.redis)
        self.follower = RegistryFollower(self.redis, self.registry, seen=version)
        self.lease_ms = int(settings.lease_seconds * 1000)
        self._special: dict[str, Callable[[Snapshot], Persona]] = {}
        self._held: dict[str, str] = {}
        self._held_lock = threading.Lock()
        self._stop = threading.Event()
        #: Set once the worker shuts down: see :meth:`drain`.
        self.draining = threading.Event()
        if start_threads:  # a worker process: be ready to run spawns before taking any
            connect_drain(self)
            _load_model_adapter()
            why = self.sandbox.unavailable()
            if why is not None:
                log.warning("bash and host_bash are unavailable on this worker: %s", why)
            self.follower.start()
            threading.Thread(target=self._heartbeat, name="lease-heartbeat", daemon=True).start()
            threading.Thread(target=self._reaper, name="spawn-reaper", daemon=True).start()

    def _has_credentials(self, model_id: str) -> bool:
        from workers._litellm import has_credentials

        return has_credentials(model_id, self.credentials)

    def register_persona(self, name: str, factory: Callable[[Snapshot], Persona]) -> None:
        """Run spawns of ``name`` with the persona ``factory`` builds from the registry snapshot
        of their first attempt (the coordinator, whose prompt is the catalog)."""
        self._special[name] = factory

    def use_user_store(self, store: UserStore) -> None:
        """Read user personas from ``store`` (the database) from now on."""
        self.registry = build_registry(self.settings, store)
        self.follower.registry = self.registry

    # -- the spawn task ------------------------------------------------------------------------

    def execute(self, spawn_id: str) -> dict[str, Any]:
        if self.draining.is_set():
            return self._decline(spawn_id)
        record, token = self.store.claim(spawn_id, self.lease_ms)
        if record is None:
            return {"spawn_id": spawn_id, "status": "missing"}
        if token is None:
            if record.finished:
                return self._summary(record)
            return {"spawn_id": spawn_id, "status": "held-elsewhere"}
        with self._held_lock:
            self._held[spawn_id] = token
        try:
            return self._execute_held(record, token)
        except LeaseLost:
            log.warning("spawn %s: lease lost; another attempt owns it", spawn_id)
            return {"spawn_id": spawn_id, "status": "lease-lost"}
        finally:
            with self._held_lock:
                self._held.pop(spawn_id, None)
            self.store.release(spawn_id, token)

    def _execute_held(self, record: SpawnRecord, token: str) -> dict[str, Any]:
        spawn_id = record.spawn_id
        if record.lost_attempts >= MAX_ATTEMPTS:
            return self._finish(
                record,
                token,
                "failed",
                f"stopped after {MAX_ATTEMPTS} attempts: the worker running this spawn was lost "
                "each time",
            )
        if self.store.cancel_requested(spawn_id):  # e.g. cancelled while waiting for a person
            return self._finish(record, token, "cancelled", "cancelled on request")
        try:
            persona, bag = self._prepare(record, token)
        except (LeaseLost, redis.RedisError):
            raise  # infrastructure: leave the spawn to the next attempt
        except Exception as exc:  # noqa: BLE001 - a spawn that cannot start is failed, with why
            if not isinstance(exc, OngridError):
                log.exception("spawn %s could not start", spawn_id)
            return self._finish(record, token, "failed", str(exc))
        setup = LoopSetup(
            session_id=record.session_id,
            spawn_id=spawn_id,
            model_id=record.model_id,
            max_turns=persona.max_turns,
            reminder=turn_reminder(persona, record.model_id, bag, self.settings.default_locale),
            bag=bag,
            tool_context=ToolContext(
                session_id=record.session_id,
                spawn_id=spawn_id,
                user=record.user,
                role=record.role,
                settings=self.settings,
                sandbox=self.sandbox,
                context=record.context,
                stopping=self.draining,
            ),
        )
        assert record.state is not None

        def checkpoint(state: LoopState) -> None:
            if self.store.cancel_requested(spawn_id):
                raise SpawnCancelled(spawn_id)
            draining = self.draining.is_set() and not _ending(state)
            if draining and _about_to_run(state):
                # Stop before the call rather than after its write-ahead mark: the next attempt
                # then runs it, instead of reporting a call that never ran as "outcome unknown".
                raise WorkerDraining(spawn_id)
            record.state = state
            self.store.save(record, token)
            if draining:
                raise WorkerDraining(spawn_id)

        try:
            outcome = run_loop(
                setup,
                record.state,
                RetryingModel(
                    model_for(record.model_id, self.credentials),
                    RetryPolicy.from_settings(self.settings),
                    stop=self.draining,  # a shutdown does not sit out a backoff
                ),
                self._sink(spawn_id),
                checkpoint,
            )
        except SpawnCancelled:
            return self._finish(record, token, "cancelled", "cancelled on request")
        except (WorkerDraining, RetryAbandoned):
            return self._hand_back(spawn_id, token)
        except ModelError as exc:
            return self._finish(record, token, "failed", str(exc))
        except (LeaseLost, redis.RedisError):
            raise  # infrastructure: leave the spawn to the next attempt
        except Exception as exc:  # noqa: BLE001 - report why, rather than dying silently
            log.exception("spawn %s crashed", spawn_id)
            return self._finish(record, token, "failed", f"{type(exc).__name__}: {exc}")
        return self._conclude(record, token, outcome)

    def _prepare(self, record: SpawnRecord, token: str) -> tuple[Persona, ToolBag]:
        """First attempt: pin the persona version and build the opening messages."""
        if not record.persona_markdown:
            self.follower.catch_up()
            snapshot = self.registry.snapshot()
            special = self._special.get(record.persona)
            persona = special(snapshot) if special else snapshot.get(record.persona)
            if persona.name in snapshot.unavailable:
                reason = snapshot.unavailable[persona.name]
                raise PersonaUnavailable(f"agent {persona.name!r} is unavailable here: {reason}")
            record.persona_markdown = dump_persona(persona)
            record.persona_source = persona.source.value if persona.source else ""
            record.model_id = resolve_model_id(
                persona.model,
                default_model=self.settings.default_model,
                default_provider=self.settings.default_provider,
                has_credentials=self._has_credentials,
            )
        persona = parse_persona(record.persona_markdown).persona
        role = self.settings.roles.get(record.role)
        if role is None:
            raise NotFoundError("role", record.role)
        # Registered personas (the coordinator) may hold the AgentTool; specialists never do.
        worker = record.persona not in self._special
        bag = resolve_bag(persona, self.catalog, role.tools, role=record.role, for_worker=worker)
        if record.state is None:
            opening = first_message(persona, record.prompt, record.context)
            record.missing_context = opening.missing
            record.state = LoopState(
                messages=[
                    Message(role="system", content=system_prompt(persona)),
                    Message(role="user", content=opening.text),
                ]
            )
            tile = AgentTile(
                session_id=record.session_id,
                spawn_id=record.spawn_id,
                persona=persona.name,
                description=persona.description,
                tools=[e.describe() for e in bag],
                reason=record.reason or persona.catalog_hint,
                background=persona.background,
                missing_context=opening.missing,
            )
            self._sink(record.spawn_id)(tile, 0)
            record.state.event_index = 1
        self.store.save(record, token)
        return persona, bag

    def _hand_back(self, spawn_id: str, token: str) -> dict[str, Any]:
        """Put a spawn this draining worker holds back on its queue, as its last checkpoint left
        it (not as the loop's unsaved state), and give its lease back."""
        from workers.client import enqueue

        saved = self.store.get(spawn_id)
        if saved is None:
            raise LeaseLost(spawn_id)  # expired meanwhile: nothing left to hand back
        # "queued", not "running": the reaper leaves it to the message sent below, and the next
        # attempt does not count this one as lost.
        saved.status = "queued"
        self.store.save(saved, token, release=True)
        enqueue(self.settings, saved)
        log.info("spawn %s handed back to %s: this worker is shutting down", spawn_id, saved.queue)
        return self._summary(saved)

    def _decline(self, spawn_id: str) -> dict[str, Any]:
        """A spawn delivered to this worker while it shuts down: enqueued again, untouched."""
        from workers.client import enqueue

        record = self.store.get(spawn_id)
        if record is None:
            return {"spawn_id": spawn_id, "status": "missing"}
        if record.finished:
            return self._summary(record)
        enqueue(self.settings, record)
        return {"spawn_id": spawn_id, "status": "declined"}

    def _conclude(self, record: SpawnRecord, token: str, outcome: Outcome) -> dict[str, Any]:
        if outcome.kind == "interrupted":
            if self.store.cancel_requested(record.spawn_id):  # asked while this attempt ran
                return self._finish(record, token, "cancelled", "cancelled on request")
            record.status = "waiting"
            # Give the lease back in the same write: a decision taken the moment the spawn shows
            # as waiting enqueues it again, and that attempt must find the lease free.
            self.store.save(record, token, release=True)
            return self._summary(record)
        status = "ok" if outcome.kind == "final" else "failed"
        return self._finish(record, token, status, outcome.text)

    def _finish(self, record: SpawnRecord, token: str, status: str, text: str) -> dict[str, Any]:
        record.status = status  # type: ignore[assignment]
        if status == "ok":
            record.result = text
        else:
            record.error = text
        usage = record.state.usage if record.state else None
        index = record.state.event_index if record.state else 0
        note = TaskNotification(
            session_id=record.session_id,
            spawn_id=record.spawn_id,
            status=status,  # type: ignore[arg-type]
            persona=record.persona,
            message=text,
            usage=usage if usage is not None else Usage(),
        )
        self._sink(record.spawn_id)(note, index)
        if record.state:
            record.state.event_index += 1
        self.store.save(record, token, release=True)
        return self._summary(record)

    def _sink(self, spawn_id: str):
        def emit(event: Event, index: int) -> None:
            self.bus.publish(event, dedup_key=f"spawn:{spawn_id}", dedup_index=index)

        return emit

    @staticmethod
    def _summary(record: SpawnRecord) -> dict[str, Any]:
        return {
            "spawn_id": record.spawn_id,
            "persona": record.persona,
            "status": record.status,
            "result": record.result,
            "error": record.error,
            "attempts": record.attempts,
        }

    # -- background threads --------------------------------------------------------------------

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.settings.lease_seconds * HEARTBEAT_FRACTION):
            with self._held_lock:
                held = list(self._held.items())
            for spawn_id, token in held:
                try:
                    self.store.renew(spawn_id, token, self.lease_ms)
                except redis.RedisError as exc:
                    log.warning("lease renewal of %s failed: %s", spawn_id, exc)

    def _reaper(self) -> None:
        """Re-enqueue running spawns whose worker is gone (their lease expired)."""
        from workers.client import enqueue

        while not self._stop.wait(self.settings.lease_seconds * REAP_FRACTION):
            try:
                for spawn_id in self.store.active():
                    record = self.store.get(spawn_id)
                    if record is None or record.status != "running" or self.store.leased(spawn_id):
                        continue
                    claim = f"ongrid:requeue:{spawn_id}"
                    if self.redis.set(claim, "1", nx=True, px=self.lease_ms):
                        log.warning("spawn %s lost its worker; re-enqueuing", spawn_id)
                        enqueue(self.settings, record)
            except redis.RedisError as exc:
                log.warning("reaper: %s", exc)

    def drain(self) -> None:
        """Stop taking spawns and stop those running at their next checkpoint (see the module
        docstring); safe to call from a signal handler, and more than once."""
        self.draining.set()

    def stop(self) -> None:
        self._stop.set()
        self.follower.stop()


def connect_drain(runtime: WorkerRuntime) -> None:
    """Drain ``runtime`` when the Celery worker of this process begins to shut down."""
    from celery.signals import worker_shutting_down

    def on_shutdown(**_: Any) -> None:
        runtime.drain()

    # A strong reference: the receiver lives as long as the process, like the runtime.
    worker_shutting_down.connect(on_shutdown, weak=False)


_runtime: WorkerRuntime | None = None
_runtime_lock = threading.Lock()


def use_worker_runtime(runtime: WorkerRuntime | None) -> None:
    """Make ``runtime`` the one this process's spawn tasks run on (``None``: none any more).

    The worker process's builder (:mod:`coordinator.worker`) calls it once the runtime is built
    from the settings of the entry point; nothing here reads the environment.
    """
    global _runtime
    with _runtime_lock:
        _runtime = runtime


def worker_runtime() -> WorkerRuntime:
    """This process's runtime; a process that was not started as a worker has none."""
    with _runtime_lock:
        if _runtime is None:
            raise RuntimeError(
                "this process has no worker runtime: start workers with `ongrid worker` or "
                "`celery -A workers.app worker`, which build one before taking any task"
            )
        return _runtime
