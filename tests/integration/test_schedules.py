"""Scheduled investigations on a real beat (``ongrid beat``, RedBeat) and a real worker.

Two schedules every 2 s on one cluster: ``quick`` (its model answers at once) and ``slow`` (its
model takes 5 s, so the next due time finds the previous run going). The beat is SIGKILLed once
``quick`` has run a few times and started again: the due times recorded stay on the 2 s grid,
each once, whatever the runs' statuses, and every run started is one spawn that finishes.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

from harness import Cluster, final
from processes import Proc, wait_for

from coordinator.schedules import ScheduleBook, ScheduleFirer
from coordinator.storage.engine import database_url, make_engine, upgrade
from coordinator.storage.schedules import ScheduleRun, ScheduleStore
from registry.schedules import ScheduleSpec
from registry.settings import Settings
from workers.celery_app import make_celery

EVERY = 2.0
QUICK, SLOW = "quick filesystem check", "slow filesystem check"


def _beat(cluster: Cluster) -> Proc:
    env = {**cluster.env, "ONGRID_SCHEDULE_POLL_SECONDS": "0.5"}
    argv = [sys.executable, "-m", "coordinator", "beat", "--loglevel=INFO"]
    return Proc("beat", argv, cluster.root, env, forked=True)


def _runs(store: ScheduleStore, name: str) -> list[ScheduleRun]:
    return sorted(store.runs(name, 500), key=lambda run: run.due_at)


def test_schedules_run_on_a_real_beat_through_a_restart_and_skip_overlaps(cluster: Cluster):
    cluster.persona("checker", background=True)
    cluster.fake.script(
        [
            {"match": SLOW, "reply": {"content": "slow: all below 80 %."}, "delay": 5},
            final("quick: all below 80 %."),
        ]
    )
    # The worker's database: its default SQLite file under the site's .ongrid/.
    settings = Settings(data_dir=Path(cluster.root) / ".ongrid", redis_url=cluster.redis_url)
    engine = make_engine(database_url(settings))
    upgrade(engine)
    store = ScheduleStore(engine)
    book = ScheduleBook(store, make_celery(settings))
    for name, prompt in (("quick", QUICK), ("slow", SLOW)):
        spec = ScheduleSpec(
            name=name, persona="checker", prompt=prompt, interval_seconds=EVERY, owner="ops"
        )
        store.create(spec, "test")
        book.sync(spec)
    cluster.start_worker("w1")
    beat = _beat(cluster)
    try:
        wait_for(lambda: len(_runs(store, "quick")) >= 3, 30, "3 runs of quick")
        beat.kill()  # SIGKILL: no clean stop, its lock in Redis left to expire
        before = len(_runs(store, "quick"))
        beat = _beat(cluster)
        wait_for(lambda: len(_runs(store, "quick")) >= before + 3, 30, "3 more runs of quick")
    finally:
        beat.stop()
    book.entries.remove("quick")
    book.entries.remove("slow")

    quick = _runs(store, "quick")
    dues = [run.due_at for run in quick]
    # On the grid, each due time once, none missing across the restart.
    assert len(set(dues)) == len(dues)
    assert all(b - a == timedelta(seconds=EVERY) for a, b in zip(dues, dues[1:], strict=False)), [
        d.isoformat() for d in dues
    ]
    started = [run for run in quick if run.status == "started"]
    assert started and all(run.status in ("started", "skipped") for run in quick)
    for run in started:
        assert run.spawn_id is not None
        done = cluster.client.wait(run.spawn_id, timeout=30)
        assert (done.status, done.persona, done.user) == ("ok", "checker", "ops")
        assert done.background and done.queue == "ongrid.background"
    # One spawn per run started, no more: the model saw each once.
    assert len(cluster.fake.requests_for(QUICK)) == len(started)
    # A due time sent again (a beat killed between sending it and saving it) starts nothing.
    again = ScheduleFirer(store, cluster.client)("quick", started[-1].due_at)
    assert again == {"status": "duplicate", "spawn_id": started[-1].spawn_id}
    assert len(_runs(store, "quick")) == len(quick)
    # Due times the beat got to too late (it was down) are recorded as one skipped run, once.
    firer = ScheduleFirer(store, cluster.client)
    since, last = dues[-1] + timedelta(hours=1), dues[-1] + timedelta(hours=2)
    missed = firer("quick", last, missed=1800, missed_since=since)
    assert missed["status"] == "skipped" and "missed: 1800 due times" in missed["reason"]
    assert firer("quick", last, missed=1800, missed_since=since) == {"status": "duplicate"}
    (recorded,) = [run for run in _runs(store, "quick") if run.due_at == last]
    assert (recorded.status, recorded.spawn_id) == ("skipped", None)
    assert "while the beat was down" in recorded.reason

    slow = _runs(store, "slow")
    skipped = [run for run in slow if run.status == "skipped"]
    assert skipped, [(r.status, r.reason) for r in slow]
    assert all("is still" in run.reason and run.spawn_id is None for run in skipped)
    # Each skipped run names the started run it would have overlapped (two due times sent in one
    # tick may be taken by two worker threads in either order: one runs, the other is skipped).
    started_slow = {run.spawn_id for run in slow if run.status == "started"}
    assert started_slow and all(
        any(f"spawn {spawn_id}" in run.reason for spawn_id in started_slow) for run in skipped
    ), [(r.status, r.reason) for r in slow]
