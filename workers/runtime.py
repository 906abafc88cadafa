"""One worker process's runtime: registry, tools, models, event bus, spawn leases.

Every spawn of the process runs as a coroutine on the process's :class:`~workers.engine.Engine`.
``execute(spawn_id)``, the body of the Celery spawn task, hands the spawn to the engine and
waits. The attempt claims the spawn: takes its lease (a Redis key with a short TTL), so at most
one worker runs a spawn at a time, and marks it ``running`` in the same transaction. One
:class:`~workers.leases.LeaseKeeper` thread renews every lease of the process in one Redis call
per period (a thread, so renewals go on while the loop is busy); a lease found taken stops its
spawn's coroutine at once. When a worker dies its leases expire, and the cluster's one elected
:class:`~workers.reaper.Reaper` enqueues those spawns again; the next attempt resumes from the
last checkpoint. A spawn whose worker was lost ``MAX_ATTEMPTS`` times is failed instead of being
tried again (resuming after a person's decision is an attempt too, but not a lost one). An
attempt that runs longer than ``spawn_time_limit_seconds`` is stopped and failed.

Events go through one :class:`~workers.publisher.EventWriter` per process: text deltas are
coalesced per spawn, everything is published in batches, and each checkpoint waits until what
the spawn emitted before it is published.

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

import asyncio
import contextlib
import functools
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import redis
import redis.asyncio
from pydantic import BaseModel

from marketplace.catalog import spawn_catalog
from marketplace.mcp import McpHub
from marketplace.mcp_catalog import McpToolPublisher
from marketplace.replica import PluginSource
from marketplace.skills import SKILLS_EXTRA, skills_prompt
from registry.agent_registry import AgentRegistry, Snapshot, UserStore
from registry.defaults import build_registry
from registry.errors import (
    LeaseLost,
    ModelUnusable,
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
from registry.tools import BaseTool, ToolCatalog, ToolContext, ToolResult
from workers import metrics, tool_tape, tracing
from workers.approvals import ApprovalFeed
from workers.budget import BudgetGuard, BudgetReached, Reached, notification_text, partial_answer
from workers.celery_app import DEFAULT_REDIS_URL
from workers.client import enqueue
from workers.context import ContextExhausted, ContextPolicy, Window, last_ledger
from workers.egress import EgressPolicy, EgressProxy
from workers.engine import Engine
from workers.events import EventBus
from workers.hardening import ProviderCredentials
from workers.leases import LeaseFence, LeaseKeeper
from workers.loop import LoopSetup, LoopState, Outcome, run_loop
from workers.messages import (
    AgentTile,
    ConfirmationRequired,
    Message,
    TaskNotification,
    ToolResultEvent,
    Usage,
)
from workers.model import (
    DEMO_MODEL,
    DEMO_NOTE,
    Model,
    ModelChoice,
    ModelError,
    RetryAbandoned,
    RetryingModel,
    RetryPolicy,
    resolve_model,
)
from workers.observed import MeasuredModel, TurnClock
from workers.prompts import first_message, system_prompt, turn_reminder
from workers.publisher import EventWriter, SpawnSink
from workers.reaper import Reaper
from workers.reload import RegistryFollower, cluster_version
from workers.sandbox import Sandbox
from workers.spawn_ends import SpawnEndFeed, spawn_ended
from workers.spawns import AsyncSpawnStore, SpawnRecord, SpawnStore
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
#: Renewal and reaper periods as fractions of the lease (``Settings.lease_seconds``): a lease
#: survives four missed renewals; a dead worker's spawn is re-enqueued within 1.3 leases.
HEARTBEAT_FRACTION = 0.2
REAP_FRACTION = 0.3


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


#: The window assumed for a model litellm's map does not know and ``models:`` does not describe:
#: small, so its conversations are compacted early rather than refused.
UNKNOWN_WINDOW = Window(context_window=32_768, max_output=4_096)


@functools.lru_cache(maxsize=256)
def _warn_unknown_window(model_id: str) -> None:
    log.warning(
        "model %s: its context window and output limit are unknown (litellm's model map has "
        "no entry); assuming %d and %d tokens: set models: {%s: {context_window: …, "
        "max_output_tokens: …}} in the config file",
        model_id,
        UNKNOWN_WINDOW.context_window,
        UNKNOWN_WINDOW.max_output,
        model_id,
    )


def model_window(model_id: str, settings: Settings) -> Window:
    """A model's limits: the config file's ``models:`` entry, else litellm's model map, else
    :data:`UNKNOWN_WINDOW` (with a warning, once per model)."""
    from workers._litellm import model_limits

    configured = settings.models.get(model_id)
    known = model_limits(model_id)
    if known is None and (configured is None or configured.context_window is None):
        _warn_unknown_window(model_id)
    window, output = known or (UNKNOWN_WINDOW.context_window, UNKNOWN_WINDOW.max_output)
    if configured is not None:
        window = configured.context_window or window
        output = configured.max_output_tokens or output
    return Window(context_window=window, max_output=min(output, window))


def _about_to_run(state: LoopState) -> bool:
    """The checkpoint being taken is the write-ahead mark of the call the loop runs next."""
    return bool(state.pending) and state.pending[0].id in state.started


def _ending(state: LoopState) -> bool:
    """The loop returns right after this checkpoint: it holds the final answer, or the next
    call has just been put to a person (its approval entry is new and undecided)."""
    if state.final is not None:
        return True
    approval = state.approvals.get(state.pending[0].id) if state.pending else None
    return approval is not None and not approval.approved_by and not approval.settled


class WorkerRuntime:
    """Everything a worker process runs spawns with; see the module docstring."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        url = settings.redis_url or DEFAULT_REDIS_URL
        self.redis = redis.Redis.from_url(url)
        prefix = settings.key_prefix
        version = cluster_version(
            self.redis, prefix
        )  # before the disk is read: see RegistryFollower
        self.registry: AgentRegistry = build_registry(settings)
        self.catalog: ToolCatalog = default_catalog(settings.tool_modules)
        self.sandbox = Sandbox.for_worker(settings)
        # Bundle code granted the network reaches it through this proxy only (made on first use).
        self.sandbox.egress = EgressProxy(EgressPolicy.for_settings(settings))
        #: Model provider keys; a worker process replaces them with those it took out of the
        #: environment (:func:`workers.hardening.harden_process`).
        self.credentials = ProviderCredentials.from_environ()
        self.bus = EventBus(self.redis, prefix)
        self.store = SpawnStore(self.redis, prefix)
        self.approvals = ApprovalFeed(self.redis, prefix)
        self.ends = SpawnEndFeed(self.redis, prefix)
        self.follower = RegistryFollower(self.redis, self.registry, prefix, seen=version)
        #: The MCP servers of the installed plugins and the config file (started on the first
        #: snapshot that names one), kept in step with every reload.
        self.mcp: McpHub | None = None
        self._mcp_published = McpToolPublisher(self.redis, prefix)
        self.follower.on_reload = self._sync_mcp
        self._sync_mcp(self.registry.snapshot(), wait=True)
        metrics.watch_mcp(lambda: self.mcp)
        self.lease_ms = int(settings.lease_seconds * 1000)
        self.time_limit = float(settings.spawn_time_limit_seconds)
        self._special: dict[str, Callable[[Snapshot], Persona]] = {}
        #: Set once the worker shuts down: see :meth:`drain`.
        self.draining = threading.Event()
        connect_drain(self)
        _load_model_adapter()
        self.engine = Engine(offload_threads=settings.tool_threads)
        # A pool that grows with the commands in flight. A bounded one made commands wait for
        # a connection, and when a stalled worker's spawns all resumed at once, 364 of 700
        # waited past its timeout and failed.
        self.aredis = redis.asyncio.Redis.from_url(url)
        self.astore = AsyncSpawnStore(self.aredis, prefix)
        self.writer = EventWriter(self.bus, self.aredis, on_published=metrics.event_published)
        self.engine.run(self._start_writer())
        #: The coroutine of each spawn this process holds, to stop one whose lease was lost.
        self._tasks: dict[str, asyncio.Task[Any]] = {}
        self._lost: set[str] = set()
        #: Spawns whose lease this attempt's last write gave back (no release call needed).
        self._given_back: set[str] = set()
        self.leases = LeaseKeeper(
            self.store,
            self.lease_ms,
            settings.lease_seconds * HEARTBEAT_FRACTION,
            on_lost=self._on_lease_lost,
        )
        self.reaper = Reaper(
            self.store,
            self.redis,
            worker_id=f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}",
            lease_ms=self.lease_ms,
            period_s=settings.lease_seconds * REAP_FRACTION,
            requeue=lambda record: enqueue(self.settings, record),
            on_resumed=lambda _spawn_id: metrics.reaper_resumed(),
            on_expired=lambda record, call_id: self.approvals.decided(record, call_id, "expired"),
        )
        self.follower.start()
        self.leases.start()
        self.reaper.start()

    async def _start_writer(self) -> None:
        self.writer.start()

    def model_choice(self, persona: Persona) -> ModelChoice:
        """The model ``persona`` runs on here, or why it cannot (:func:`resolve_model`)."""
        from workers._litellm import readiness

        return resolve_model(
            persona.model,
            default_model=self.settings.default_model,
            default_provider=self.settings.default_provider,
            readiness=lambda model_id: readiness(model_id, self.credentials),
        )

    def register_persona(self, name: str, factory: Callable[[Snapshot], Persona]) -> None:
        """Run spawns of ``name`` with the persona ``factory`` builds from the registry snapshot
        of their first attempt (the coordinator, whose prompt is the catalog)."""
        self._special[name] = factory

    def use_user_store(self, store: UserStore, plugins: PluginSource | None = None) -> None:
        """Read user personas from ``store`` (the database) from now on, and, with ``plugins``,
        unpack the installed plugins it lists into this host's marketplace root at each reload
        (:mod:`marketplace.replica`)."""
        self.registry = build_registry(self.settings, store, plugins)
        self.follower.registry = self.registry
        # The plugins just unpacked may bring MCP servers the first snapshot did not have.
        self._sync_mcp(self.registry.snapshot(), wait=True)

    def _sync_mcp(self, snapshot: Snapshot, *, wait: bool = False) -> None:
        """Start, stop and restart MCP servers to match ``snapshot``. ``wait``: at start-up,
        give new servers a bounded time to list their tools; after a reload they come up in the
        background and the next spawn waits for them (see :meth:`catalog_for`)."""
        servers = getattr(snapshot.bundle, "mcp_servers", None) or {}
        if not servers and self.mcp is None:
            return
        if self.mcp is None:
            # ${VAR} in a server's config reads only the variables mcp_env_allow lists (and,
            # for the config file's own servers, the skill secrets): never the keys and URLs
            # hardening took out of the environment.
            self.mcp = McpHub(
                allow=self.settings.mcp_env_allow,
                secrets=self.credentials.skill_secrets(),
                sandbox=self.sandbox,
                plugin_data=Path(self.settings.data_dir).resolve() / "plugin-data",
            )
        hub = self.mcp
        hub.reconcile(servers, wait=None if wait else 0)

        def report() -> None:  # for the API, once the new servers listed their tools
            hub.wait_started()
            self._mcp_published.publish(hub.tools())

        threading.Thread(target=report, name="mcp-report", daemon=True).start()

    def catalog_for(self, snapshot: Snapshot) -> ToolCatalog:
        """The tools a spawn may be given: the code tools, plus the skill, manifest and MCP
        tools of ``snapshot``'s bundles."""
        hub = self.mcp
        if hub is None:
            return spawn_catalog(self.catalog, snapshot.bundle)
        hub.wait_started()  # bounded: a server still starting after it is left out
        tools = hub.tools()
        self._mcp_published.publish(tools)  # for the API, which runs no MCP server
        return spawn_catalog(self.catalog, snapshot.bundle, tools)

    # -- the spawn task ------------------------------------------------------------------------

    def execute(self, spawn_id: str) -> dict[str, Any]:
        """The body of the Celery spawn task: run the spawn on the engine and wait for it.

        The waiting thread blocks on a future, holding neither the GIL nor the loop."""
        return self.engine.run(self.aexecute(spawn_id))

    async def aexecute(self, spawn_id: str) -> dict[str, Any]:
        if self.draining.is_set():
            return await self._decline(spawn_id)
        sent = time.monotonic()  # the lease counts from before the claim reached Redis
        record, token = await self.astore.claim(spawn_id, self.lease_ms)
        if record is None:
            return {"spawn_id": spawn_id, "status": "missing"}
        if token is None:
            if record.finished:
                return self._summary(record)
            return {"spawn_id": spawn_id, "status": "held-elsewhere"}
        if record.attempts == 1:
            metrics.spawn_claimed(record.queue, time.time() - record.created)
        self.leases.hold(spawn_id, token, confirmed_at=sent)
        task = asyncio.current_task()
        assert task is not None
        self._tasks[spawn_id] = task
        persona = record.persona
        metrics.spawn_started(persona)
        status = "lease-lost"
        ended = False  # the attempt reported back: its lease may be given back
        parent = tracing.extract(record.trace)  # the request that made the spawn
        try:
            with tracing.agent_span(persona, context=parent, session_id=record.session_id):
                summary = await self._within_time_limit(record, token)
            status, ended = str(summary.get("status", "")), True
            return summary
        except LeaseLost:
            metrics.lease_lost()
            log.warning("spawn %s: lease lost; another attempt owns it", spawn_id)
            return {"spawn_id": spawn_id, "status": "lease-lost"}
        except asyncio.CancelledError:
            if spawn_id not in self._lost:
                raise
            # The lease keeper found the lease taken: stop at once, so nothing more of this
            # attempt (a model call, a tool call) happens after another attempt took over.
            metrics.lease_lost()
            log.warning("spawn %s: lease lost; stopped this attempt", spawn_id)
            return {"spawn_id": spawn_id, "status": "lease-lost"}
        finally:
            metrics.spawn_ended(persona, status)
            self._tasks.pop(spawn_id, None)
            self._lost.discard(spawn_id)
            self.leases.drop(spawn_id)
            # An attempt that ended on an error (Redis gone, the engine stopping) keeps its
            # lease until it expires: its deadline entry stays too, and the reaper resumes the
            # spawn. Giving the lease back would remove that entry and leave it running.
            if ended and spawn_id not in self._given_back:
                with contextlib.suppress(redis.RedisError):
                    await self.astore.release(spawn_id, token)
            self._given_back.discard(spawn_id)

    async def _within_time_limit(self, record: SpawnRecord, token: str) -> dict[str, Any]:
        """Run the attempt; one that outlives the spawn time limit is stopped and failed.

        Celery's own time limit does not apply in the threads pool; this one does, and it ends
        in the spawn's ``task_notification`` rather than in a killed process."""
        limit = asyncio.timeout(self.time_limit)
        try:
            async with limit:
                return await self._execute_held(record, token)
        except TimeoutError:
            if not limit.expired():
                raise
        saved = await self.astore.get(record.spawn_id)
        return await self._finish(
            saved or record,
            token,
            "failed",
            f"stopped after the time limit of {self.time_limit:g} s (spawn_time_limit_seconds)",
        )

    def _sink(self, spawn_id: str, token: str) -> SpawnSink:
        """The attempt's event sink, fenced by its lease: once another attempt holds the spawn,
        Redis takes no event of this one (:mod:`workers.events`)."""
        return self.writer.sink(spawn_id, fence=(self.astore.lease_key(spawn_id), token))

    def _on_lease_lost(self, spawn_id: str) -> None:
        """From the lease keeper's thread: stop the spawn's coroutine on the loop."""

        def stop() -> None:
            task = self._tasks.get(spawn_id)
            if task is not None and not task.done():
                self._lost.add(spawn_id)
                task.cancel()

        self.engine.call_soon(stop)

    async def _execute_held(self, record: SpawnRecord, token: str) -> dict[str, Any]:
        spawn_id = record.spawn_id
        if record.lost_attempts >= MAX_ATTEMPTS:
            return await self._finish(
                record,
                token,
                "failed",
                f"stopped after {MAX_ATTEMPTS} attempts: the worker running this spawn was lost "
                "each time",
            )
        if await self.astore.cancel_requested(spawn_id):  # e.g. cancelled while waiting
            return await self._finish(record, token, "cancelled", "cancelled on request")
        sink = self._sink(spawn_id, token)
        fence = LeaseFence(self.leases, spawn_id)
        try:
            persona, bag, skills = await self._prepare(record, token, sink)
        except (LeaseLost, redis.RedisError):
            raise  # infrastructure: leave the spawn to the next attempt
        except Exception as exc:  # noqa: BLE001 - a spawn that cannot start is failed, with why
            if not isinstance(exc, OngridError):
                log.exception("spawn %s could not start", spawn_id)
            return await self._finish(record, token, "failed", str(exc))
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
                extras={SKILLS_EXTRA: skills},
                secrets=self.credentials.skill_secrets(),
            ),
            # No tool call of this attempt starts once its lease may have passed to another.
            run_tool=fence.run_tool(self._run_tool),
            stream=self._streaming(record.session_id),
            published=await self._published_results(record),
            persona=persona.name,
            approval_ttl_seconds=self.settings.approval_ttl_seconds,
            announce=self._announce,
        )
        assert record.state is not None
        guard = BudgetGuard(record.budget, record.state)  # checked before each call
        setup = replace(setup, run_tool=guard.run_tool(setup.run_tool))
        turns = TurnClock(persona.name, record.state.turns)

        async def checkpoint(state: LoopState) -> None:
            await sink.flushed()  # the saved event index never gets ahead of what is published
            draining = self.draining.is_set() and not _ending(state)
            if draining and _about_to_run(state):
                # Stop before the call rather than after its write-ahead mark: the next attempt
                # then runs it, instead of reporting a call that never ran as "outcome unknown".
                raise WorkerDraining(spawn_id)
            record.state = state
            guard.tick()  # the running seconds are saved with the state
            cancelled = await self.astore.save(record, token)  # and looks for a cancel
            turns.tick(state.turns)
            if cancelled:
                raise SpawnCancelled(spawn_id)
            if draining:
                raise WorkerDraining(spawn_id)

        setup = replace(setup, context=self._context_policy(record))
        model = MeasuredModel(
            RetryingModel(
                # Checked before each try: no model call once the lease may be another's.
                fence.model(model_for(record.model_id, self.credentials)),
                RetryPolicy.from_settings(self.settings),
                stop=self.draining,  # a shutdown does not sit out a backoff
            ),
            persona.name,
        )
        try:
            outcome = await run_loop(setup, record.state, guard.model(model), sink.emit, checkpoint)
        except (BudgetReached, ContextExhausted) as exc:
            # The last call names no tools: it is not offered any.
            locale = self.settings.default_locale
            reminder = turn_reminder(persona, record.model_id, ToolBag(()), locale)
            last = replace(setup, reminder=reminder)
            reached = (
                exc.reached
                if isinstance(exc, BudgetReached)
                else Reached(limit="context", spent=exc.tokens, maximum=exc.window)
            )
            if isinstance(exc, ContextExhausted):
                log.warning("spawn %s: %s", spawn_id, exc)
            return await self._stop_at_budget(record, token, last, model, guard, reached)
        except SpawnCancelled:
            return await self._finish(record, token, "cancelled", "cancelled on request")
        except (WorkerDraining, RetryAbandoned):
            return await self._hand_back(spawn_id, token)
        except ModelError as exc:
            return await self._finish(record, token, "failed", str(exc))
        except (LeaseLost, redis.RedisError):
            raise  # infrastructure: leave the spawn to the next attempt
        except Exception as exc:  # noqa: BLE001 - report why, rather than dying silently
            log.exception("spawn %s crashed", spawn_id)
            return await self._finish(record, token, "failed", f"{type(exc).__name__}: {exc}")
        return await self._conclude(record, token, outcome)

    def _context_policy(self, record: SpawnRecord) -> ContextPolicy | None:
        """How the spawn's conversation is kept inside its model's window; ``None`` for the
        demo model, which has none."""
        if record.model_id == DEMO_MODEL:
            return None
        return ContextPolicy(
            window=model_window(record.model_id, self.settings),
            store=self.astore.results(record.spawn_id),
            reply_tokens=self.settings.reply_tokens,
        )

    async def _announce(self, event: ConfirmationRequired, index: int) -> None:
        """A call put to people, before the checkpoint that records it: its deadline filed for
        the reaper's expiry sweep, the request published on the approvers' feed."""
        await self.astore.file_deadline(event.spawn_id, event.call_id, event.expires_at)
        await self.approvals.aannounce(event, index, self.aredis)

    async def _stop_at_budget(
        self,
        record: SpawnRecord,
        token: str,
        setup: LoopSetup,
        model: Model,
        guard: BudgetGuard,
        reached: Reached,
    ) -> dict[str, Any]:
        """End a spawn that reached a limit with its best partial answer (:mod:`workers.budget`);
        ``failed``, naming the limit, when that last model call fails."""
        assert record.state is not None
        record.budget.reached = reached
        sink = self._sink(record.spawn_id, token)
        try:
            text = await partial_answer(
                model, setup, record.state, reached, sink.emit, guard.completed
            )
        except (WorkerDraining, RetryAbandoned):
            return await self._hand_back(record.spawn_id, token)  # the next attempt asks again
        except (LeaseLost, redis.RedisError):
            raise
        except Exception as exc:  # noqa: BLE001 - a model error or a crash: the spawn says why
            if not isinstance(exc, ModelError):
                log.exception("spawn %s: the partial answer crashed", record.spawn_id)
            guard.tick()
            ledger = last_ledger(record.state.messages)
            if reached.limit == "context" and ledger:
                # The ledger the model last wrote is the best partial answer there is.
                return await self._finish(record, token, "ok", ledger)
            why = f"{reached}; its partial answer could not be written: {exc}"
            return await self._finish(record, token, "failed", why)
        guard.tick()
        return await self._finish(record, token, "ok", text)

    async def _published_results(self, record: SpawnRecord) -> dict[str, tuple[str, bool]]:
        """The results of calls this spawn started, did not checkpoint, and published: a lost
        attempt emits a call's result before the checkpoint that records it (so no event is
        ever lost), and may die in between. Read only when such a call exists (a resume)."""
        state = record.state
        unsettled = {c.id for c in state.pending if c.id in state.started} if state else set()
        if not unsettled:
            return {}
        return {
            event.call_id: (event.content, event.is_error)
            for event in await self.bus.ahistory(record.session_id, self.aredis)
            if isinstance(event, ToolResultEvent)
            and event.spawn_id == record.spawn_id
            and event.call_id in unsettled
        }

    async def _run_tool(
        self, tool: BaseTool, arguments: BaseModel, context: ToolContext
    ) -> ToolResult:
        """A tool call in the engine's bounded pool, with its span and its metric; recorded or
        replayed when the ``tool_tape`` setting says so."""
        tape = tool_tape.tape_for(self.settings.tool_tape)
        run = tool.run if tape is None else functools.partial(tape.run, tool)
        with tracing.tool_span(tool.name, context.call_id):
            try:
                result = await self.engine.offload(run, arguments, context)
            except Exception:
                metrics.tool_call(tool.name, "error")
                raise
        metrics.tool_call(tool.name, "error" if result.is_error else "ok")
        return result

    def _streaming(self, session_id: str) -> Callable[[], Awaitable[bool]]:
        """Whether a model call streams its text: by ``stream_replies``; ``watched`` asks Redis
        whether anyone follows the session live. A reply asked for in one piece costs a
        fraction of the CPU of one streamed token by token; a reader that comes later reads
        the same text from the session's stream, in one delta."""
        mode = self.settings.stream_replies
        channel = self.bus.keys(session_id).channel

        async def decide() -> bool:
            if mode != "watched":
                return mode == "always"
            counts = await self.aredis.pubsub_numsub(channel)
            return bool(counts and int(counts[0][1]) > 0)

        return decide

    async def _prepare(
        self, record: SpawnRecord, token: str, sink: SpawnSink
    ) -> tuple[Persona, ToolBag, dict[str, Any]]:
        """First attempt: pin the persona version and build the opening messages. Returns the
        persona, its bag and the skills it may load."""
        if not record.persona_markdown:
            version = int(await self.aredis.get(self.follower.version_key) or 0)
            if version != self.follower.seen:  # a reload this process missed
                # Reading the files and the database again is blocking work: off the loop.
                await self.engine.offload(self.follower.catch_up)
            snapshot = self.registry.snapshot()
            special = self._special.get(record.persona)
            persona = special(snapshot) if special else snapshot.get(record.persona)
            if persona.name in snapshot.unavailable:
                reason = snapshot.unavailable[persona.name]
                raise PersonaUnavailable(f"agent {persona.name!r} is unavailable here: {reason}")
            record.persona_markdown = dump_persona(persona)
            record.persona_source = persona.source.value if persona.source else ""
            choice = self.model_choice(persona)
            if choice.problem:  # never another model in its place
                raise ModelUnusable(f"agent {persona.name!r}: {choice.problem}")
            record.model_id = choice.model_id
        else:  # a resumed attempt runs the version its first attempt pinned
            persona = parse_persona(record.persona_markdown, plugin_name=True).persona
            snapshot = self.registry.snapshot()
        skills = _skills_of(snapshot, persona)
        role = self.settings.roles.get(record.role)
        if role is None:
            raise NotFoundError("role", record.role)
        # Registered personas (the coordinator) may hold the AgentTool; specialists never do.
        worker = record.persona not in self._special
        catalog = await self.engine.offload(self.catalog_for, snapshot)
        bag = resolve_bag(persona, catalog, role.tools, role=record.role, for_worker=worker)
        if record.state is None:
            opening = first_message(persona, record.prompt, record.context)
            record.missing_context = opening.missing
            record.state = LoopState(
                messages=[
                    Message(
                        role="system",
                        content=system_prompt(persona, skills_prompt(list(skills.values()))),
                    ),
                    Message(role="user", content=opening.text),
                ]
            )
            tile = AgentTile(
                session_id=record.session_id,
                spawn_id=record.spawn_id,
                persona=persona.name,
                description=persona.description,
                tools=[e.describe() for e in bag],
                reason=record.reason,  # the coordinator's own words, or nothing
                background=persona.background,
                missing_context=opening.missing,
                parent_spawn_id=record.parent_spawn_id,
                model=record.model_id,
                model_note=DEMO_NOTE if record.model_id == DEMO_MODEL else "",
            )
            sink.emit(tile, 0)
            record.state.event_index = 1
            await sink.flushed()
        record.budget.resolve(self.settings.budget, persona.metadata.ongrid.budget)
        await self.astore.save(record, token)
        return persona, bag, skills

    async def _hand_back(self, spawn_id: str, token: str) -> dict[str, Any]:
        """Put a spawn this draining worker holds back on its queue, as its last checkpoint left
        it (not as the loop's unsaved state), and give its lease back."""
        saved = await self.astore.get(spawn_id)
        if saved is None:
            raise LeaseLost(spawn_id)  # expired meanwhile: nothing left to hand back
        # "queued", not "running": the reaper leaves it to the message sent below, and the next
        # attempt does not count this one as lost.
        saved.status = "queued"
        await self._give_back(saved, token)
        await self.engine.offload(enqueue, self.settings, saved)
        log.info("spawn %s handed back to %s: this worker is shutting down", spawn_id, saved.queue)
        return self._summary(saved)

    async def _decline(self, spawn_id: str) -> dict[str, Any]:
        """A spawn delivered to this worker while it shuts down: enqueued again, untouched."""
        record = await self.astore.get(spawn_id)
        if record is None:
            return {"spawn_id": spawn_id, "status": "missing"}
        if record.finished:
            return self._summary(record)
        await self.engine.offload(enqueue, self.settings, record)
        return {"spawn_id": spawn_id, "status": "declined"}

    async def _conclude(self, record: SpawnRecord, token: str, outcome: Outcome) -> dict[str, Any]:
        if outcome.kind == "interrupted":
            if await self.astore.cancel_requested(record.spawn_id):  # asked while this ran
                return await self._finish(record, token, "cancelled", "cancelled on request")
            record.status = "waiting"
            # Give the lease back in the same write: a decision taken the moment the spawn shows
            # as waiting enqueues it again, and that attempt must find the lease free.
            await self._give_back(record, token)
            return self._summary(record)
        status = "ok" if outcome.kind == "final" else "failed"
        return await self._finish(record, token, status, outcome.text)

    async def _finish(
        self, record: SpawnRecord, token: str, status: str, text: str
    ) -> dict[str, Any]:
        record.status = status  # type: ignore[assignment]
        if status == "ok":
            record.result = text
        else:
            record.error = text
        usage = record.state.usage if record.state else None
        index = record.state.event_index if record.state else 0
        reached = record.budget.reached
        note = TaskNotification(
            session_id=record.session_id,
            spawn_id=record.spawn_id,
            status=status,  # type: ignore[arg-type]
            persona=record.persona,
            message=notification_text(reached, text) if reached and status == "ok" else text,
            usage=usage if usage is not None else Usage(),
            budget_reached=reached.limit if reached else None,
        )
        sink = self._sink(record.spawn_id, token)
        sink.emit(note, index)
        await sink.flushed()
        # On the spawn-end feed too (notifications read it), under the notification's index:
        # an attempt that ends the spawn again after a crash stores nothing twice.
        await self.ends.aannounce(spawn_ended(record), index, self.aredis)
        if record.state:
            record.state.event_index += 1
        await self._give_back(record, token)
        return self._summary(record)

    async def _give_back(self, record: SpawnRecord, token: str) -> None:
        """The attempt's last write, which gives the lease back in the same step."""
        self.leases.drop(record.spawn_id)  # first: no renewal may find the lease gone
        await self.astore.save(record, token, release=True)
        self._given_back.add(record.spawn_id)

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

    def drain(self) -> None:
        """Stop taking spawns and stop those running at their next checkpoint (see the module
        docstring); safe to call from a signal handler, and more than once."""
        self.draining.set()

    def stop(self) -> None:
        """After the pool has stopped: the background threads, the writer, then the loop."""
        self.reaper.stop()
        self.leases.stop()
        self.follower.stop()
        if self.mcp is not None:
            self.mcp.close()
        self.sandbox.egress.close()
        if self.engine.running:
            with contextlib.suppress(Exception):
                self.engine.run(self._close())
        self.engine.stop()

    async def _close(self) -> None:
        await self.writer.aclose()
        await self.aredis.aclose()


def _skills_of(snapshot: Snapshot, persona: Persona) -> dict[str, Any]:
    """The skills ``persona`` may load under ``snapshot`` (none without installed bundles)."""
    bundle = snapshot.bundle
    return bundle.skills_for(persona) if bundle is not None and persona.skills else {}


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
