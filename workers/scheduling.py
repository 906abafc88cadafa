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
  would overlap a run still going), and goes on from the next due time past older ones.

A worker runs :data:`FIRE_TASK` (on ``ongrid.background``) through the firer its process
registered with :func:`use_schedule_firer` (:mod:`coordinator.schedules`: database, spawn).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
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
    "ScheduleBeat",
    "ScheduleEntries",
    "beat_config",
    "celery_schedule",
    "due_after",
    "fire",
    "redbeat_prefix",
    "use_schedule_firer",
]

#: Most due times of one schedule the beat sends in one tick while catching up.
MAX_SENDS_PER_TICK = 100

Firer = Callable[[str, datetime], dict[str, Any]]
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
        due = _first_due(entry, now, window)
        result = None
        for _ in range(MAX_SENDS_PER_TICK):
            options = dict(entry.options or {})
            result = self.send_task(
                entry.task,
                entry.args,
                {**(entry.kwargs or {}), "due_at": due.isoformat()},
                producer=producer,
                **options,
            )
            # Saved after the send: a beat killed in between sends this due time again.
            entry = entry.next(last_run_at=due)
            due = due_after(entry.schedule, due)
            if due > now:
                break
        return result


def _first_due(entry: Any, now: datetime, window: timedelta) -> datetime:
    """The due time to send first: the one after ``last_run_at``, or the oldest one within
    ``window`` of ``now`` when the beat was down longer (``now`` if none is)."""
    if entry.last_run_at is None:
        return now
    due = due_after(entry.schedule, entry.last_run_at.astimezone(UTC))
    for _ in range(10_000):
        if now - due <= window:
            return due
        due = due_after(entry.schedule, due)
    return now


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


def fire(name: str, due_at: str) -> dict[str, Any]:
    """The body of :data:`FIRE_TASK`: start (or skip) the run of ``name`` due at ``due_at``."""
    with _firer_lock:
        firer = _firer
    if firer is None:
        raise RuntimeError("this process runs no schedules: it was not built by ongrid worker")
    return firer(name, datetime.fromisoformat(due_at).astimezone(UTC))
