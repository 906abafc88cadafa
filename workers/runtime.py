"""One worker process's runtime: registry, tools, models, event bus, spawn leases.

``execute(spawn_id)`` is the body of the Celery spawn task. It takes the spawn's lease (a Redis
key with a short TTL that a heartbeat thread renews), so at most one worker runs a spawn at a
time. When a worker dies, its leases expire; the reaper thread of any live worker sees an active
spawn with no lease and enqueues it again, and the next attempt resumes from the last checkpoint.
A spawn whose worker was lost ``MAX_ATTEMPTS`` times is failed instead of being tried again
(resuming after a person's decision is an attempt too, but not a lost one).
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
from registry.parser import dump_persona, parse_persona
from registry.persona import Persona
from registry.policy import ToolBag, resolve_bag
from registry.settings import Settings
from registry.template import render_template
from registry.tools import ToolCatalog, ToolContext
from workers.celery_app import DEFAULT_REDIS_URL
from workers.events import EventBus
from workers.hardening import ProviderCredentials
from workers.loop import LoopSetup, LoopState, Outcome, run_loop
from workers.messages import AgentTile, Event, Message, TaskNotification
from workers.model import DEMO_MODEL, Model, ModelError, resolve_model_id
from workers.reload import RegistryFollower, cluster_version
from workers.sandbox import Sandbox
from workers.spawns import LeaseLost, SpawnRecord, SpawnStore
from workers.tools import default_catalog

__all__ = ["MAX_ATTEMPTS", "WorkerRuntime", "worker_runtime"]

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


class SpawnCancelled(Exception):
    pass


def _load_model_adapter() -> None:
    """Import litellm (seconds of CPU) at start-up: a worker that says it is ready is, and the
    first spawn it takes does not wait for the import."""
    import workers._litellm  # noqa: F401


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


def first_message(persona: Persona, prompt: str, context: dict[str, Any]) -> str:
    if not persona.initial_prompt:
        return prompt
    return f"{render_template(persona.initial_prompt, context).rstrip()}\n\n{prompt}"


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
        if start_threads:  # a worker process: be ready to run spawns before taking any
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
        record = self.store.get(spawn_id)
        if record is None:
            return {"spawn_id": spawn_id, "status": "missing"}
        if record.finished:
            return self._summary(record)
        token = self.store.acquire(spawn_id, self.lease_ms)
        if token is None:
            return {"spawn_id": spawn_id, "status": "held-elsewhere"}
        with self._held_lock:
            self._held[spawn_id] = token
        try:
            return self._execute_held(spawn_id, token)
        except LeaseLost:
            log.warning("spawn %s: lease lost; another attempt owns it", spawn_id)
            return {"spawn_id": spawn_id, "status": "lease-lost"}
        finally:
            with self._held_lock:
                self._held.pop(spawn_id, None)
            self.store.release(spawn_id, token)

    def _execute_held(self, spawn_id: str, token: str) -> dict[str, Any]:
        record = self.store.get(spawn_id)
        assert record is not None
        if record.finished:
            return self._summary(record)
        record.attempts += 1
        if record.status == "running":
            # The previous attempt never reported back: its worker died or lost the lease. Only
            # those count against the limit, not resumptions after a person's decision.
            record.lost_attempts += 1
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
        except Exception as exc:  # noqa: BLE001 - a spawn that cannot start is failed, with why
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
            ),
        )
        assert record.state is not None

        def checkpoint(state: LoopState) -> None:
            if self.store.cancel_requested(spawn_id):
                raise SpawnCancelled(spawn_id)
            record.state = state
            self.store.save(record, token)

        try:
            outcome = run_loop(
                setup,
                record.state,
                model_for(record.model_id, self.credentials),
                self._sink(spawn_id),
                checkpoint,
            )
        except SpawnCancelled:
            return self._finish(record, token, "cancelled", "cancelled on request")
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
                raise ValueError(f"agent {persona.name!r} is unavailable here: {reason}")
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
            raise ValueError(f"unknown role {record.role!r}")
        # Registered personas (the coordinator) may hold the AgentTool; specialists never do.
        worker = record.persona not in self._special
        bag = resolve_bag(persona, self.catalog, role.tools, role=record.role, for_worker=worker)
        if record.state is None:
            record.state = LoopState(
                messages=[
                    Message(role="system", content=system_prompt(persona)),
                    Message(
                        role="user", content=first_message(persona, record.prompt, record.context)
                    ),
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
            )
            self._sink(record.spawn_id)(tile, 0)
            record.state.event_index = 1
        record.status = "running"
        self.store.save(record, token)
        return persona, bag

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
            **({"usage": usage} if usage else {}),
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

    def stop(self) -> None:
        self._stop.set()
        self.follower.stop()


_runtime: WorkerRuntime | None = None
_runtime_lock = threading.Lock()


def worker_runtime() -> WorkerRuntime:
    """This process's runtime, built on first use from the environment."""
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            _runtime = WorkerRuntime(Settings.load())
        return _runtime
