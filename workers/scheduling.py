"""Scheduled investigations on Celery beat, with the schedule kept in Redis by RedBeat.

Each enabled schedule is one RedBeat entry (``<key prefix>redbeat:<name>``) whose task is
:data:`FIRE_TASK` with the schedule's name. The beat (``ongrid beat``) runs
:class:`ScheduleBeat`, a :class:`~redbeat.RedBeatScheduler` that adds the **due time** to each
message and keeps the entry's ``last_run_at`` on the schedule's own timeline:

- a message is sent before the entry's ``last_run_at`` is saved, so a beat killed in between
  sends that due time again when it restarts (never loses it); the worker's fire is idempotent
  per (schedule, due time), so it starts one spawn;
- ``last_run_at`` is saved as the due time itself, not the moment the beat got to it, so due
  times stay on the cron's or the interval's grid; a beat that was down sends every due time it
  missed within ``schedule_catch_up_seconds`` (one message each; the worker skips those that
  would overlap a run still going); older ones are not run but sent as one ``missed`` message,
  which the worker records as a skipped run, and the schedule goes on from its next due time,
  never sending one before it is due.

A worker runs :data:`FIRE_TASK` (on ``ongrid.background``) through the firer its process
registered with :func:`use_schedule_firer` (:mod:`coordinator.schedules`: database, spawn).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from celery import Celery
from celery.schedules import crontab
from celery.schedules import schedule as interval
from redbeat import RedBeatScheduler, RedBeatSchedulerEntry
from redbeat.schedulers import ensure_conf, get_redis

from registry.schedules import ScheduleSpec
from registry.settings import Settings
from workers.celery_app import FIRE_TASK

__all__ = [
    "FIRE_TASK",
    "MAX_SENDS_PER_TICK",
    "Missed",
    "ScheduleBeat",
    "ScheduleEntries",
    "beat_config",
    "catch_up",
    "celery_schedule",
    "due_after",
    "fire",
    "redbeat_prefix",
    "use_schedule_firer",
]

#: Most due times of one schedule the beat sends in one tick while catching up.
MAX_SENDS_PER_TICK = 100

Firer = Callable[..., dict[str, Any]]
_firer: Firer | None = None
_firer_lock = threading.Lock()


def redbeat_prefix(settings: Settings) -> str:
    """Where the cluster's RedBeat keys live: ``ongrid:redbeat:``, ``ongrid:<cluster>:redbeat:``."""
    return f"{settings.key_prefix}redbeat:"


def beat_config(settings: Settings, redis_url: str) -> dict[str, Any]:
    """What :func:`~workers.celery_app.make_celery` sets for RedBeat and the beat."""
    return {
        "redbeat_redis_url": redis_url,
        "redbeat_key_prefix": redbeat_prefix(settings),
        # Our own Redis client options (none): the broker's transport options are kombu's.
        "redbeat_redis_options": {},
        "beat_max_loop_interval": settings.schedule_poll_seconds,
        "beat_scheduler": "workers.scheduling:ScheduleBeat",
        "ongrid_schedule_catch_up_seconds": settings.schedule_catch_up_seconds,
    }


def celery_schedule(spec: ScheduleSpec) -> crontab | interval:
    """The Celery schedule of ``spec``: a ``crontab`` (UTC) or an interval."""
    if spec.cron is not None:
        minute, hour, day_of_month, month_of_year, day_of_week = spec.cron.split()
        return crontab(
            minute=minute,
            hour=hour,
            day_of_month=day_of_month,
            month_of_year=month_of_year,
            day_of_week=day_of_week,
        )
    return interval(run_every=timedelta(seconds=spec.interval_seconds or 0))


def due_after(when: crontab | interval, last: datetime) -> datetime:
    """The first due time of ``when`` after ``last`` (UTC)."""
    if isinstance(when, crontab):
        start, delta, _now = when.remaining_delta(last)
        return (start + delta).astimezone(UTC)  # type: ignore[no-any-return]
    return (last + when.run_every).astimezone(UTC)


class ScheduleBeat(RedBeatScheduler):
    """RedBeat's scheduler sending each due time once, with the due time (see the module)."""

    def apply_async(
        self, entry: Any, producer: Any = None, advance: bool = True, **kwargs: Any
    ) -> Any:
        now = self.app.now().astimezone(UTC)
        window = timedelta(seconds=float(self.app.conf.get("ongrid_schedule_catch_up_seconds", 0)))
        last = entry.last_run_at.astimezone(UTC) if entry.last_run_at is not None else None
        missed, due = catch_up(entry.schedule, last, now, window)
        result = None
        if missed is not None:
            # Too old to run now: one message says so, and the worker records them as skipped.
            result = self._send(entry, producer, missed.newest, missed.as_kwargs())
            entry = entry.next(last_run_at=missed.newest)
        for _ in range(MAX_SENDS_PER_TICK):
            if due > now:
                break  # the next due time is still to come: nothing is sent early
            result = self._send(entry, producer, due, {})
            # Saved after the send: a beat killed in between sends this due time again.
            entry = entry.next(last_run_at=due)
            due = due_after(entry.schedule, due)
        return result

    def _send(self, entry: Any, producer: Any, due: datetime, extra: dict[str, Any]) -> Any:
        kwargs = {**(entry.kwargs or {}), "due_at": due.isoformat(), **extra}
        return self.send_task(
            entry.task, entry.args, kwargs, producer=producer, **dict(entry.options or {})
        )


@dataclass(frozen=True)
class Missed:
    """Due times the beat got to too late to run (it was down): how many, the first, the last."""

    count: int
    oldest: datetime
    newest: datetime

    def as_kwargs(self) -> dict[str, Any]:
        return {"missed": self.count, "missed_since": self.oldest.isoformat()}


#: Due times :func:`catch_up` counts at most (a schedule every second, a beat down for hours).
_MAX_COUNTED = 100_000


def catch_up(
    when: crontab | interval, last: datetime | None, now: datetime, window: timedelta
) -> tuple[Missed | None, datetime]:
    """After ``last``: the due times older than ``window`` at ``now`` (missed, not run), and the
    first due time to send (``now`` for an entry that never ran; may be in the future)."""
    if last is None:
        return None, now
    due, count, oldest, newest = due_after(when, last), 0, None, None
    while now - due > window and count < _MAX_COUNTED:
        count, oldest, newest = count + 1, oldest or due, due
        due = due_after(when, due)
    if oldest is None or newest is None:
        return None, due
    return Missed(count, oldest, newest), due


# -- the entries, from the API's side ----------------------------------------------------------


class ScheduleEntries:
    """Create, remove and read the RedBeat entries of schedules (the API's side)."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        ensure_conf(app)

    def put(self, spec: ScheduleSpec, now: datetime | None = None) -> None:
        """Install or update ``spec``'s entry, keeping the due times it had; a new entry's first
        due time is one period after ``now``."""
        entry = RedBeatSchedulerEntry(
            name=spec.name,
            task=FIRE_TASK,
            schedule=celery_schedule(spec),
            kwargs={"name": spec.name},
            app=self.app,
        )
        last = self.last_run_at(spec.name)
        entry.last_run_at = last or (now or datetime.now(UTC)).replace(microsecond=0)
        entry.save()

    def remove(self, name: str) -> None:
        RedBeatSchedulerEntry(name=name, app=self.app).delete()

    def last_run_at(self, name: str) -> datetime | None:
        key = RedBeatSchedulerEntry.generate_key(self.app, name)
        meta = RedBeatSchedulerEntry.load_meta(key, app=self.app)
        last = meta.get("last_run_at")
        return last.astimezone(UTC) if isinstance(last, datetime) else None

    def installed(self) -> set[str]:
        """The names of the schedules that have an entry."""
        conf = self.app.redbeat_conf
        keys = get_redis(self.app).zrange(conf.schedule_key, 0, -1)
        return {key.removeprefix(conf.key_prefix) for key in keys}

    def next_run(self, spec: ScheduleSpec) -> datetime | None:
        """When ``spec`` runs next (a past time: due now, the beat is late or down)."""
        if not spec.enabled:
            return None
        last = self.last_run_at(spec.name)
        return due_after(celery_schedule(spec), last) if last is not None else None


# -- the worker's side -------------------------------------------------------------------------


def use_schedule_firer(firer: Firer | None) -> None:
    """Make ``firer`` what this process's :data:`FIRE_TASK` calls (None: forget it)."""
    global _firer
    with _firer_lock:
        _firer = firer


def fire(name: str, due_at: str, missed: int = 0, missed_since: str = "") -> dict[str, Any]:
    """The body of :data:`FIRE_TASK`: start (or skip) the run of ``name`` due at ``due_at``;
    with ``missed``, record that many due times (from ``missed_since`` to ``due_at``) as
    skipped: the beat got to them too late."""
    with _firer_lock:
        firer = _firer
    if firer is None:
        raise RuntimeError("this process runs no schedules: it was not built by ongrid worker")
    due = datetime.fromisoformat(due_at).astimezone(UTC)
    if missed:
        return firer(name, due, missed=missed, missed_since=datetime.fromisoformat(missed_since))
    return firer(name, due)
