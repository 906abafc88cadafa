"""The caller's side of spawning: create the record, enqueue the task, wait, follow events.

Used by the CLI now and by the coordinator and HTTP API later.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import redis
from celery import Celery

from registry.agent_registry import AgentRegistry, Snapshot
from registry.budget import Budget
from registry.defaults import build_registry
from registry.errors import NotFoundError, UserError, WorkerDraining
from registry.settings import Settings
from registry.template import check_context
from workers import tracing
from workers.approvals import ApprovalFeed
from workers.budget import SpawnBudget
from workers.celery_app import DEFAULT_REDIS_URL, QUEUES, SPAWN_TASK, make_celery
from workers.consumers import NoConsumer, live_consumers, start_command
from workers.events import EventBus
from workers.limits import RateWindow
from workers.messages import Event, QueueWaiting, TaskNotification
from workers.reload import broadcast_reload
from workers.spawns import UNHELD_STATUSES, SpawnRecord, SpawnStore

__all__ = [
    "NoConsumer",
    "SpawnClient",
    "StrandedWatch",
    "enqueue",
]


_apps: dict[tuple[str, str], Celery] = {}
#: Longest block of one read of the event stream in :meth:`SpawnClient.wait` (seconds): how
#: soon a wait notices its ``stop``.
_READ_SLICE = 0.5
#: How :meth:`SpawnClient.wait` reads the record after the event that announced its end: the
#: write follows the event by a round trip or two, so the first looks come quickly; after
#: ``_WRITE_WAIT`` seconds it goes back to following the stream (an attempt died in between).
_WRITE_FIRST_DELAY, _WRITE_MAX_DELAY, _WRITE_WAIT = 0.001, 0.05, 1.0
#: Event types after which the spawn's record is expected to show it finished or waiting.
_ENDING_EVENTS = ("task_notification", "confirmation_required")


def _app(settings: Settings) -> Celery:
    """One Celery app (and its broker connection pool) per broker URL and cluster name in this
    process."""
    key = (settings.redis_url or DEFAULT_REDIS_URL, settings.cluster)
    if key not in _apps:
        _apps[key] = make_celery(settings)
    return _apps[key]


def enqueue(settings: Settings, record: SpawnRecord) -> None:
    """Send the spawn task for ``record`` to its queue (first time or again after a crash).

    Its display name (Celery's ``shadow``) is ``spawn <persona>``: Flower's task list, and the
    worker's log, say which persona ran rather than ``ongrid.spawn`` for every one.
    """
    _app(settings).send_task(
        SPAWN_TASK,
        args=[record.spawn_id, record.persona],
        queue=record.queue,
        shadow=f"spawn {record.persona}",
        # The spawn's outcome lives in its record; Celery's result backend would subscribe
        # this process to a result channel per spawn and the worker would write one per spawn.
        ignore_result=True,
    )


class SpawnClient:
    def __init__(self, settings: Settings, *, registry: AgentRegistry | None = None) -> None:
        self.settings = settings
        unknown = sorted(set(settings.autoscaled_queues) - set(QUEUES.values()))
        if unknown:
            raise UserError(
                f"autoscaled_queues: unknown queue(s) {', '.join(unknown)} "
                f"(ONGRID_AUTOSCALED_QUEUES); known: {', '.join(QUEUES.values())}"
            )
        self.redis = redis.Redis.from_url(settings.redis_url or DEFAULT_REDIS_URL)
        prefix = settings.key_prefix
        self.store = SpawnStore(self.redis, prefix)
        self.bus = EventBus(self.redis, prefix)
        self.approvals = ApprovalFeed(self.redis, prefix)
        #: Spawns per user and minute, counted across the cluster (``limits.spawns_per_minute``).
        self.spawn_rate = RateWindow(
            self.redis,
            "spawns",
            settings.limits.spawns_per_minute,
            limit_name="spawns_per_minute",
            what="spawns",
            prefix=prefix,
        )
        self.registry = registry if registry is not None else build_registry(settings)

    def snapshot(self) -> Snapshot:
        return self.registry.snapshot()

    def spawn(
        self,
        persona: str,
        prompt: str,
        *,
        context: dict[str, Any] | None = None,
        role: str | None = None,
        user: str = "",
        session_id: str | None = None,
        spawn_id: str | None = None,
        reason: str = "",
        queue: str | None = None,
        require_consumer: bool = True,
        budget: Budget | None = None,
        budget_cap: Budget | None = None,
        parent_spawn_id: str = "",
        notify: list[str] | None = None,
        background: bool | None = None,
    ) -> SpawnRecord:
        """Enqueue a spawn. Unknown persona or role: :class:`UserError` naming what exists.

        ``budget`` is the request's (:mod:`workers.budget`); ``budget_cap`` what the spawn that
        dispatches this one has left for it. The spawn runs within the tightest of those, the
        organisation's and its persona's, resolved when it starts. ``parent_spawn_id`` names the
        spawn that dispatches this one, so a console can draw the child's tile under its parent.
        ``notify`` names notification channels told of the spawn's end besides those the
        routing rules name (a schedule's). ``background``: run it in the background whatever
        its persona says (a scheduled run: nobody waits on it); ``None``: as the persona says.

        With ``spawn_id``, spawning is idempotent: a spawn of that id that exists already is
        returned as it is (a resumed coordinator re-attaches to the specialist it started).
        ``queue`` names a registered persona's own queue (the coordinator's); the registry is
        not consulted for it. A queue no live worker consumes is refused with
        :class:`~workers.consumers.NoConsumer` before anything is written, unless
        ``require_consumer`` is false (for workers that scale up from zero on queue length).

        A ``user``'s spawns are counted across the cluster, a coordinator's dispatches included:
        past ``limits.spawns_per_minute`` a spawn is refused with
        :class:`~workers.limits.LimitExceeded` before anything is written.
        """
        if spawn_id is not None:
            existing = self.store.get(spawn_id)
            if existing is not None:
                return existing
        if queue is None:
            snapshot = self.snapshot()
            found = snapshot.get(persona)  # unknown: refused, naming those that exist
            if background is None:
                background = found.background
            if persona in snapshot.unavailable:
                why = snapshot.unavailable[persona]
                raise UserError(f"agent {persona!r} is unavailable: {why}")
            queue = QUEUES["background" if background else "interactive"]
        try:
            check_context(context or {})
        except ValueError as exc:
            raise UserError(f"invalid spawn context: {exc}") from None
        role = role or self.settings.default_role
        if role not in self.settings.roles:
            raise NotFoundError("role", role, sorted(self.settings.roles))
        if require_consumer and queue not in self.settings.autoscaled_queues:
            self.require_consumer(queue)
        if user:  # a spawn of nobody's (the CLI's, a script's) is the operator's own
            self.spawn_rate.take(user)
        record = SpawnRecord(
            session_id=session_id or uuid.uuid4().hex,
            persona=persona,
            prompt=prompt,
            context=context or {},
            role=role,
            user=user,
            background=bool(background),
            queue=queue,
            reason=reason,
            parent_spawn_id=parent_spawn_id,
            notify=list(notify or ()),
            spawn_id=spawn_id or uuid.uuid4().hex,
            budget=SpawnBudget(requested=budget or Budget(), inherited=budget_cap or Budget()),
            # The span current here (the API request, or the coordinator's tool call) is the
            # parent of the spawn's: one trace from the request down to every child spawn.
            trace=tracing.inject(),
        )
        self.store.create(record)
        enqueue(self.settings, record)
        return record

    # -- queues nobody consumes ---------------------------------------------------------------

    def consumers(self, *queues: str) -> dict[str, list[str]]:
        """The live workers of each queue (see :mod:`workers.consumers`)."""
        return live_consumers(self.redis, queues, self.settings.key_prefix)

    def require_consumer(self, queue: str) -> None:
        """:class:`NoConsumer` unless a live worker consumes ``queue``."""
        if not self.consumers(queue)[queue]:
            raise NoConsumer(queue)

    def fail_unconsumed(self, spawn_id: str, waited: float | None = None) -> SpawnRecord | None:
        """End a spawn that waits for a worker on a queue no live worker consumes.

        Only a spawn no attempt holds (``queued``, or ``running`` with its lease expired) is
        ended: ``failed``, its error and ``task_notification`` naming the queue and the command
        that starts a worker for it (and how long it ``waited``). The write is a transaction over
        the record and its lease, so a worker that claims the spawn at the same moment either
        wins or finds it finished. Returns the failed record; ``None`` when the spawn was left as
        it is.
        """

        def error(record: SpawnRecord) -> str:
            why = str(NoConsumer(record.queue))
            if waited is None:
                return why
            return f"{why}; gave up after waiting {waited:.0f} s (queue_wait_limit)"

        failed = self.store.fail_unheld(spawn_id, served=self.served, error=error)
        if failed is None:
            return None
        note = TaskNotification(
            session_id=failed.session_id,
            spawn_id=failed.spawn_id,
            status="failed",
            persona=failed.persona,
            message=failed.error,
        )
        index = failed.state.event_index if failed.state else 0
        self.bus.publish(note, dedup_key=f"spawn:{spawn_id}", dedup_index=index)
        return failed

    def served(self, record: SpawnRecord) -> bool:
        """Whether a live worker consumes the spawn's queue (a record without one: assume so)."""
        return not record.queue or bool(self.consumers(record.queue)[record.queue])

    def wait(
        self,
        spawn_id: str,
        timeout: float | None = None,
        *,
        stop: threading.Event | None = None,
        stranded: bool = False,
    ) -> SpawnRecord:
        """Block until the spawn is finished or waits for a person; TimeoutError otherwise.

        ``stop``: give up as soon as it is set (the waiting worker shuts down), raising
        :class:`~registry.errors.WorkerDraining`; the spawn itself runs on.

        ``stranded``: watch the spawn as :class:`StrandedWatch` does, so one left on a queue no
        worker consumes any more is announced (naming the queue) and, after
        ``queue_wait_limit``, failed instead of waited on to the end.

        Follows the session's event stream rather than polling the record: the record is read
        again when the spawn's ``task_notification`` or ``confirmation_required`` arrives. That
        event is published just before the final record is written (a crash in between then
        repeats the notification, de-duplicated, instead of losing it), so the record is then
        read again for a moment until it shows the end. Every ``stranded_check_seconds``
        the record is read anyway, so an event that never comes cannot make this hang.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        stop = stop if stop is not None else threading.Event()
        watch = StrandedWatch(self, [spawn_id]) if stranded else None
        record = self._record(spawn_id)
        if _settled(record):
            return record
        # The stream position is taken before the record read that decides to wait: whatever
        # is published after that read is then at a higher seq, and the subscription sees it.
        after = self.bus.last_seq(record.session_id)
        record = self._record(spawn_id)
        ended = self.bus.last_event_of(record.session_id, f"spawn:{spawn_id}")
        if not _settled(record) and ended is not None and _ends_wait(spawn_id)(ended):
            record = self._record_once_written(spawn_id, stop)  # notified before we looked
        every = self.settings.stranded_check_seconds
        next_check = time.monotonic() + every
        while not _settled(record):
            if stop.is_set():
                raise WorkerDraining(
                    f"stopped waiting for spawn {spawn_id} ({record.status}): this worker is "
                    "shutting down"
                )
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"spawn {spawn_id} still {record.status} after {timeout}s")
            if watch is not None and time.monotonic() >= next_check:
                watch.check()  # a stranded spawn is failed here and read just below
                next_check = time.monotonic() + every
            until = min(next_check, deadline if deadline is not None else next_check)
            after, notified = self._follow(record.session_id, spawn_id, after, stop, until)
            if notified:
                record = self._record_once_written(spawn_id, stop)
            else:
                record = self._record(spawn_id)
        return record

    def _record(self, spawn_id: str) -> SpawnRecord:
        record = self.store.get(spawn_id)
        if record is None:
            raise NotFoundError("spawn", spawn_id)
        return record

    def _follow(
        self, session_id: str, spawn_id: str, after: int, stop: threading.Event, until: float
    ) -> tuple[int, bool]:
        """Follow the session from ``after`` until the spawn's end is announced, ``stop`` is set
        or the clock reaches ``until``; returns the last ``seq`` seen and whether it ended."""
        ends = _ends_wait(spawn_id)
        while not stop.is_set():
            left = until - time.monotonic()
            if left <= 0:
                break
            # Read, not subscribe: a wait is nobody watching the session (see read_blocking).
            for event in self.bus.read_blocking(session_id, after, min(left, _READ_SLICE)):
                after = event.seq
                if ends(event):
                    return after, True
        return after, False

    def _record_once_written(self, spawn_id: str, stop: threading.Event) -> SpawnRecord:
        """The record, read again for a moment until it shows what the event announced."""
        delay, waited = _WRITE_FIRST_DELAY, 0.0
        record = self._record(spawn_id)
        while not _settled(record) and waited < _WRITE_WAIT and not stop.wait(delay):
            waited += delay
            delay = min(delay * 2, _WRITE_MAX_DELAY)
            record = self._record(spawn_id)
        return record

    def events(self, session_id: str, after_seq: int = 0, **kwargs: Any) -> Iterator[Event]:
        return self.bus.subscribe(session_id, after_seq, **kwargs)

    def reload(self) -> int:
        """Broadcast a registry reload to every worker and API process."""
        self.registry.reload()
        return broadcast_reload(self.redis, self.settings.key_prefix)

    def cancel(self, spawn_id: str) -> None:
        """Ask a spawn to stop. A running one stops at its next checkpoint (a model call in
        flight finishes first); one waiting for a decision is enqueued so a worker ends it."""
        self.store.request_cancel(spawn_id)
        record = self.store.get(spawn_id)
        if record is not None and record.status == "waiting":
            record.status = "queued"
            self.store.save_unfenced(record)
            enqueue(self.settings, record)

    def decide(
        self, spawn_id: str, call_id: str, user: str, approve: bool, args_hash: str
    ) -> tuple[SpawnRecord, bool]:
        """Record a person's decision on a call that waits for confirmation, naming the
        ``args_hash`` of its request; the decision that settles the call (a denial, or the last
        approval it needs) resumes the spawn. Returns the record and whether it settled.

        Atomic (:meth:`SpawnStore.decide`): concurrent decisions are each recorded or refused,
        never lost, and exactly one of them enqueues the spawn. Each recorded decision is
        published on the approval feed. Refused with a
        :class:`~workers.spawns.DecisionRefused` saying why.
        """
        record, settled = self.store.decide(spawn_id, call_id, user, approve, args_hash)
        if settled:
            enqueue(self.settings, record)
        self.approvals.decided(record, call_id, "approved" if approve else "denied", user)
        return record, settled


def _settled(record: SpawnRecord) -> bool:
    """Whether :meth:`SpawnClient.wait` is done with the spawn."""
    return record.finished or record.status == "waiting"


def _ends_wait(spawn_id: str) -> Callable[[Event], bool]:
    return lambda event: event.spawn_id == spawn_id and event.type in _ENDING_EVENTS


#: Seconds between two ``queue_waiting`` notices of one spawn.
NOTICE_EVERY = 60.0


class StrandedWatch:
    """The spawns a person waits on; :meth:`check` tells the person about those waiting on a
    queue nobody consumes, and fails them only after ``queue_wait_limit``.

    A spawn is stranded once it has waited unheld (``queued``, or ``running`` with no lease) on a
    queue with no live consumer for ``grace`` seconds on end (``Settings.stranded_grace_seconds``
    unless given); a consumer seen in between starts the count again. A stranded spawn keeps its
    place: a ``queue_waiting`` event names the queue and the command that starts a worker, again
    every :data:`NOTICE_EVERY` seconds while it lasts, and a worker that arrives resumes it. It
    is failed, naming the queue, once it has waited ``limit`` seconds
    (``Settings.queue_wait_limit``; 0: never); a background spawn never is. Whoever follows a
    spawn's events (the chat stream, ``ongrid spawn``) calls :meth:`check` every few seconds,
    so a worker that disappears after the spawn was accepted is never met with silence.
    """

    def __init__(
        self,
        client: SpawnClient,
        spawn_ids: Iterable[str] = (),
        grace: float | None = None,
        limit: float | None = None,
    ) -> None:
        self.client = client
        self.grace = client.settings.stranded_grace_seconds if grace is None else grace
        self.limit = client.settings.queue_wait_limit if limit is None else limit
        self._since: dict[str, float | None] = dict.fromkeys(spawn_ids)
        self._lock = threading.Lock()

    def watch(self, spawn_id: str) -> None:
        with self._lock:
            self._since.setdefault(spawn_id, None)

    @property
    def watching(self) -> bool:
        """Whether any spawn is watched (an ended one is forgotten at the next check)."""
        with self._lock:
            return bool(self._since)

    def check(self) -> list[SpawnRecord]:
        """Look at every watched spawn once; returns those this call failed."""
        with self._lock:
            watched = list(self._since)
        failed = []
        for spawn_id in watched:
            record = self.client.store.get(spawn_id)
            if record is None or record.finished:
                self._forget(spawn_id)
            elif self._unserved(record):
                waited = time.monotonic() - self._first_seen(spawn_id)
                if waited < self.grace:
                    continue
                limited = bool(self.limit) and not record.background
                if limited and waited >= self.limit:
                    done = self.client.fail_unconsumed(spawn_id, waited)
                    if done is not None:
                        failed.append(done)
                        self._forget(spawn_id)
                    continue
                self._notify(record, waited, self.limit - waited if limited else None)
            else:
                with self._lock:
                    self._since[spawn_id] = None
        return failed

    def _notify(self, record: SpawnRecord, waited: float, left: float | None) -> None:
        """Publish a ``queue_waiting`` notice of ``record``, at most one per spawn each
        :data:`NOTICE_EVERY` seconds of wall time, whoever else watches it too."""
        then = f", and fails if none has come within {left:.0f} s" if left is not None else ""
        if record.queue in self.client.settings.autoscaled_queues:
            why = f"no worker consumes {record.queue} yet: its workers are started on demand"
        else:
            why = f"no worker consumes {record.queue}: start one with {start_command(record.queue)}"
        notice = QueueWaiting(
            session_id=record.session_id,
            spawn_id=record.spawn_id,
            queue=record.queue,
            waited_seconds=round(waited, 1),
            fails_in_seconds=None if left is None else round(left, 1),
            message=f"{why}. The spawn keeps its place and runs when a worker arrives{then}.",
        )
        # One notice per minute-long slot of wall time: two watchers of one spawn (the chat
        # stream and the CLI) publish it once, and a later wait of the same spawn is told again.
        slot = int(time.time() // NOTICE_EVERY)
        self.client.bus.publish(notice, dedup_key=f"queue-wait:{record.spawn_id}", dedup_index=slot)

    def _unserved(self, record: SpawnRecord) -> bool:
        if record.status not in UNHELD_STATUSES or self.client.store.leased(record.spawn_id):
            return False
        return not self.client.served(record)

    def _first_seen(self, spawn_id: str) -> float:
        with self._lock:
            first = self._since.get(spawn_id)
            if first is None:
                first = self._since[spawn_id] = time.monotonic()
            return first

    def _forget(self, spawn_id: str) -> None:
        with self._lock:
            self._since.pop(spawn_id, None)
