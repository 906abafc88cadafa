"""The caller's side of spawning: create the record, enqueue the task, wait, follow events.

Used by the CLI now and by the coordinator and HTTP API later.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import redis
from celery import Celery

from registry.agent_registry import AgentRegistry, Snapshot
from registry.defaults import build_registry
from registry.errors import NotFoundError, UserError
from registry.settings import Settings
from registry.template import check_context
from workers.celery_app import DEFAULT_REDIS_URL, QUEUES, SPAWN_TASK, make_celery
from workers.events import EventBus
from workers.messages import Event
from workers.reload import broadcast_reload
from workers.spawns import SpawnRecord, SpawnStore

__all__ = ["SpawnClient", "enqueue"]


_apps: dict[str, Celery] = {}


def _app(settings: Settings) -> Celery:
    """One Celery app (and its broker connection pool) per broker URL in this process."""
    url = settings.redis_url or DEFAULT_REDIS_URL
    if url not in _apps:
        _apps[url] = make_celery(settings)
    return _apps[url]


def enqueue(settings: Settings, record: SpawnRecord) -> None:
    """Send the spawn task for ``record`` to its queue (first time or again after a crash)."""
    _app(settings).send_task(SPAWN_TASK, args=[record.spawn_id, record.persona], queue=record.queue)


class SpawnClient:
    def __init__(self, settings: Settings, *, registry: AgentRegistry | None = None) -> None:
        self.settings = settings
        self.redis = redis.Redis.from_url(settings.redis_url or DEFAULT_REDIS_URL)
        self.store = SpawnStore(self.redis)
        self.bus = EventBus(self.redis)
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
    ) -> SpawnRecord:
        """Enqueue a spawn. Unknown persona or role: :class:`UserError` naming what exists.

        With ``spawn_id``, spawning is idempotent: a spawn of that id that exists already is
        returned as it is (a resumed coordinator re-attaches to the specialist it started).
        ``queue`` names a registered persona's own queue (the coordinator's); the registry is
        not consulted for it.
        """
        if spawn_id is not None:
            existing = self.store.get(spawn_id)
            if existing is not None:
                return existing
        background = False
        if queue is None:
            snapshot = self.snapshot()
            background = snapshot.get(persona).background
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
        record = SpawnRecord(
            session_id=session_id or uuid.uuid4().hex,
            persona=persona,
            prompt=prompt,
            context=context or {},
            role=role,
            user=user,
            background=background,
            queue=queue,
            reason=reason,
            **({"spawn_id": spawn_id} if spawn_id else {}),
        )
        self.store.create(record)
        enqueue(self.settings, record)
        return record

    def wait(self, spawn_id: str, timeout: float | None = None) -> SpawnRecord:
        """Block until the spawn is finished or waits for a person; TimeoutError otherwise.

        The ``task_notification`` event is published just before the final record is written
        (a crash in between then repeats the notification, de-duplicated, instead of losing it),
        so a reader that saw the event waits here for the record rather than reading it once.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.05
        while True:
            record = self.store.get(spawn_id)
            if record is None:
                raise NotFoundError("spawn", spawn_id)
            if record.finished or record.status == "waiting":
                return record
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"spawn {spawn_id} still {record.status} after {timeout}s")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def events(self, session_id: str, after_seq: int = 0, **kwargs: Any) -> Iterator[Event]:
        return self.bus.subscribe(session_id, after_seq, **kwargs)

    def reload(self) -> int:
        """Broadcast a registry reload to every worker and API process."""
        self.registry.reload()
        return broadcast_reload(self.redis)

    def cancel(self, spawn_id: str) -> None:
        """Ask a spawn to stop. A running one stops at its next checkpoint (a model call in
        flight finishes first); one waiting for a decision is enqueued so a worker ends it."""
        self.store.request_cancel(spawn_id)
        record = self.store.get(spawn_id)
        if record is not None and record.status == "waiting":
            record.status = "queued"
            self.store.save_unfenced(record)
            enqueue(self.settings, record)

    def decide(self, spawn_id: str, call_id: str, user: str, approve: bool) -> SpawnRecord:
        """Record a person's decision on a call that waits for confirmation, then resume."""
        record = self.store.get(spawn_id)
        if record is None or record.state is None:
            raise NotFoundError("spawn", spawn_id)
        if record.status != "waiting" or call_id not in record.state.approvals:
            raise UserError(f"spawn {spawn_id} is not waiting for a decision on {call_id!r}")
        approval = record.state.approvals[call_id]
        if approve:
            if user not in approval.approved_by:
                approval.approved_by.append(user)
        else:
            approval.denied_by = user
        record.status = "queued"
        self.store.save_unfenced(record)
        enqueue(self.settings, record)
        return record
