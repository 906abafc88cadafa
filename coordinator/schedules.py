"""Scheduled investigations: the run a due time starts, and the schedules the beat knows.

:class:`ScheduleFirer` is what a worker's ``ongrid.schedule.fire`` task calls: it records the
run of that due time (once: the database's unique constraint), skips it when the schedule's
previous run has not finished, and otherwise starts a spawn like any other background one (so it
shows in Flower, the fleet, the budgets), with the schedule's notification channels.

:class:`ScheduleBook` is the API's side: the stored schedules, the config file's among them,
kept in step with the beat's RedBeat entries (one per enabled schedule).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import redis
from celery import Celery

from coordinator.storage.schedules import ScheduleRun, ScheduleStore, StoredSchedule
from registry.errors import OngridError
from registry.schedules import ScheduleSpec
from workers.client import SpawnClient
from workers.scheduling import ScheduleEntries

__all__ = ["ScheduleBook", "ScheduleFirer", "ScheduleView"]

log = logging.getLogger(__name__)

#: Longest a fire holds its schedule's lock (a few database and Redis round trips).
FIRE_LOCK_SECONDS = 60


class ScheduleFirer:
    """Start the run of one schedule at one due time, at most once, one run at a time."""

    def __init__(self, store: ScheduleStore, client: SpawnClient) -> None:
        self.store, self.client = store, client

    def __call__(
        self,
        name: str,
        due_at: datetime,
        *,
        missed: int = 0,
        missed_since: datetime | None = None,
    ) -> dict[str, Any]:
        stored = self.store.get(name)
        if stored is None or not stored.spec.enabled:
            log.info("schedule %s: due %s, but it is gone or disabled", name, due_at)
            return {"status": "ignored"}
        # One fire of a schedule at a time across the cluster: two due times sent together
        # (a beat catching up) must see each other's run.
        lock = self.client.redis.lock(
            f"{self.client.settings.key_prefix}schedule-fire:{name}",
            timeout=FIRE_LOCK_SECONDS,
            blocking_timeout=FIRE_LOCK_SECONDS,
        )
        with lock:
            if missed:
                return self._missed(name, due_at, missed, missed_since or due_at)
            return self._fire(stored.spec, due_at)

    def _missed(self, name: str, last: datetime, count: int, since: datetime) -> dict[str, Any]:
        """Record due times the beat got to too late (it was down) as one skipped run."""
        run, new = self.store.claim(name, last, "")
        if not new:
            return {"status": "duplicate"}
        times = "1 due time" if count == 1 else f"{count} due times"
        span = last.isoformat() if count == 1 else f"{since.isoformat()} to {last.isoformat()}"
        reason = (
            f"missed: {times} ({span}) passed while the beat was down, longer ago than "
            "schedule_catch_up_seconds when it came back"
        )
        self.store.settle(run.id, "skipped", reason)
        log.warning("schedule %s: %s", name, reason)
        return {"status": "skipped", "reason": reason}

    def _fire(self, spec: ScheduleSpec, due_at: datetime) -> dict[str, Any]:
        name = spec.name
        run, new = self.store.claim(name, due_at, uuid.uuid4().hex)
        if not new and not self._unstarted(run):
            return {"status": "duplicate", "spawn_id": run.spawn_id}
        busy = self._still_running(run)
        if busy:
            self.store.settle(run.id, "skipped", busy)
            log.info("schedule %s: run due %s skipped: %s", name, due_at.isoformat(), busy)
            return {"status": "skipped", "reason": busy}
        try:
            record = self.client.spawn(
                spec.persona,
                spec.prompt,
                context=spec.context,
                user=spec.owner,
                role=spec.role or None,
                budget=spec.budget,
                notify=spec.channels,
                background=True,
                spawn_id=run.spawn_id,
                reason=f"schedule {name}, due {due_at.isoformat()}",
            )
        except (OngridError, redis.RedisError) as exc:
            self.store.settle(run.id, "failed", str(exc))
            log.warning("schedule %s: run due %s failed to start: %s", name, due_at, exc)
            return {"status": "failed", "reason": str(exc)}
        return {"status": "started", "spawn_id": record.spawn_id}

    def _unstarted(self, run: ScheduleRun) -> bool:
        """A run claimed by a fire that died before its spawn existed: this one starts it."""
        return (
            run.status == "started"
            and bool(run.spawn_id)
            and (self.client.store.get(run.spawn_id or "") is None)
        )

    def _still_running(self, run: ScheduleRun) -> str:
        """Why ``run`` must not start: the schedule's latest other run still going ("" if not)."""
        previous = self.store.previous_started(run.schedule, run.id)
        if previous is None or not previous.spawn_id:
            return ""
        record = self.client.store.get(previous.spawn_id)
        if record is not None and record.finished:
            return ""
        if record is None:
            # Gone (expired long after it ended), or not written yet by a fire that died.
            return ""
        return (
            f"the previous run (spawn {previous.spawn_id}, due {previous.due_at.isoformat()}) "
            f"is still {record.status}"
        )


@dataclass(frozen=True)
class ScheduleView:
    """A schedule as the API shows it."""

    stored: StoredSchedule
    next_run_at: datetime | None
    runs: list[ScheduleRun]

    def as_dict(self) -> dict[str, Any]:
        spec = self.stored.spec
        return {
            **spec.model_dump(mode="json"),
            "cadence": spec.cadence,
            "source": self.stored.source,
            "created_by": self.stored.created_by,
            "created_at": self.stored.created_at.isoformat(),
            "updated_at": self.stored.updated_at.isoformat(),
            "next_run_at": self.next_run_at.isoformat() if self.next_run_at else None,
            "last_run": self.runs[0].as_dict() if self.runs else None,
            "runs": [run.as_dict() for run in self.runs],
        }


class ScheduleBook:
    """The stored schedules and their RedBeat entries, kept in step."""

    def __init__(self, store: ScheduleStore, app: Celery) -> None:
        self.store = store
        self.entries = ScheduleEntries(app)

    def sync(self, spec: ScheduleSpec) -> None:
        """An enabled schedule has its entry (due times kept); a disabled one has none."""
        if spec.enabled:
            self.entries.put(spec)
        else:
            self.entries.remove(spec.name)

    def sync_all(self, config: list[ScheduleSpec]) -> None:
        """At start: the config file's schedules stored, and every entry as the store says."""
        for name in self.store.sync_config(config):
            self.entries.remove(name)
        stored = self.store.list()
        for item in stored:
            self.sync(item.spec)
        for name in self.entries.installed() - {item.spec.name for item in stored}:
            self.entries.remove(name)

    def view(self, stored: StoredSchedule, runs: int) -> ScheduleView:
        return ScheduleView(
            stored, self.entries.next_run(stored.spec), self.store.runs(stored.spec.name, runs)
        )
