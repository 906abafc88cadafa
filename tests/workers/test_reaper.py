"""The elected reaper against a real Redis: one leader at a time, a successor when it goes, and
each spawn whose worker is gone enqueued again exactly once; live and finished spawns never.

Redis database 4, flushed before and after each test. Reapers run as real threads, each with
its own connection, as in separate worker processes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
import redis

from workers.leases import LeaseKeeper
from workers.reaper import Reaper
from workers.spawns import SpawnRecord, SpawnStore

LEASE_MS = 400
PERIOD_S = 0.1
DEADLINE_S = 30.0


class _Requeued:
    """The ``requeue`` callback (records each spawn enqueued again) and ``on_resumed``."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.resumed: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, record: SpawnRecord) -> None:
        with self.lock:
            self.ids.append(record.spawn_id)

    def count(self, spawn_id: str) -> None:
        with self.lock:
            self.resumed.append(spawn_id)


@pytest.fixture
def requeued() -> _Requeued:
    return _Requeued()


@pytest.fixture
def reapers(store: SpawnStore, requeued: _Requeued, spawn_redis_url: str) -> Iterator[list[Reaper]]:
    made = [
        Reaper(
            store,
            redis.Redis.from_url(spawn_redis_url),
            worker_id,
            LEASE_MS,
            PERIOD_S,
            requeued,
            on_resumed=requeued.count,
        )
        for worker_id in ("worker-a", "worker-b", "worker-c")
    ]
    yield made
    for each in made:
        each.stop()
        each.r.close()


def _wait(predicate: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _leaders(reapers: list[Reaper]) -> list[Reaper]:
    return [r for r in reapers if r.is_leader]


def _claimed(store: SpawnStore, ttl_ms: int = LEASE_MS) -> tuple[SpawnRecord, str]:
    record = store.create(SpawnRecord(session_id="s", persona="p", prompt="q", queue="qa"))
    claimed, token = store.claim(record.spawn_id, ttl_ms)
    assert claimed is not None and token is not None
    return claimed, token


def test_one_leader_and_a_successor_when_it_resigns_or_dies(
    store: SpawnStore, reapers: list[Reaper]
):
    for reaper in reapers:
        reaper.start()
    _wait(lambda: _leaders(reapers), "a leader")
    for _ in range(10):
        assert len(_leaders(reapers)) == 1
        time.sleep(PERIOD_S)
    (leader,) = _leaders(reapers)
    others = [r for r in reapers if r is not leader]
    assert store.r.get(f"{store.prefix}reaper") == leader.worker_id.encode()

    leader.stop()  # resigns: another takes over at its next period
    _wait(lambda: _leaders(others), "another reaper to take over")
    (successor,) = _leaders(others)
    assert store.r.get(f"{store.prefix}reaper") == successor.worker_id.encode()

    successor.stop(resign=False)  # as if its process died: the key lapses with its TTL
    (last,) = [r for r in others if r is not successor]
    _wait(lambda: last.is_leader, "the last reaper to take over once the key expired")
    assert store.r.get(f"{store.prefix}reaper") == last.worker_id.encode()


def test_a_dead_spawn_is_enqueued_once_per_lease_until_an_attempt_claims_it(
    store: SpawnStore, reapers: list[Reaper], requeued: _Requeued
):
    dead, _ = _claimed(store)  # nobody renews it: its worker is gone
    for reaper in reapers:
        reaper.start()
    _wait(lambda: requeued.ids, "the dead spawn to be enqueued again")
    time.sleep(LEASE_MS / 2000)  # within the guard's lease: two reapers, one enqueue
    assert requeued.ids == [dead.spawn_id]
    # Nobody claims it (its message was lost): a lease later it is enqueued again.
    _wait(lambda: len(requeued.ids) >= 2, "a second enqueue of the unclaimed spawn")
    # An attempt claims it: its lease lives (renewed by nobody here, but long), no more enqueues.
    _, token = store.claim(dead.spawn_id, 3600_000)
    assert token is not None
    enqueued = len(requeued.ids)
    time.sleep(3 * LEASE_MS / 1000)
    assert len(requeued.ids) == enqueued
    assert set(requeued.resumed) == {dead.spawn_id}


def test_a_live_lease_is_never_reaped_and_finished_entries_are_cleaned(
    store: SpawnStore, reapers: list[Reaper], requeued: _Requeued
):
    live, token = _claimed(store)
    keeper = LeaseKeeper(store, LEASE_MS, LEASE_MS / 5000, lambda _: None)
    keeper.hold(live.spawn_id, token)
    keeper.start()
    finished, _ = _claimed(store)
    finished.status = "ok"
    store.r.set(store._key(finished.spawn_id), finished.model_dump_json())  # ended uncleanly
    store.r.delete(store.lease_key(finished.spawn_id))
    store.r.zadd(store.leases_key, {"no-such-spawn": 0})
    for reaper in reapers:
        reaper.start()
    try:
        _wait(
            lambda: store.r.zrange(store.leases_key, 0, -1) == [live.spawn_id.encode()],
            "the entries of the finished and the missing spawn to be removed",
        )
        time.sleep(5 * LEASE_MS / 1000)  # many lease lifetimes, each renewed in time
    finally:
        keeper.stop()

    assert requeued.ids == []
    assert store.leased(live.spawn_id)


def test_a_failing_enqueue_is_tried_again(store: SpawnStore):
    dead, _ = _claimed(store, ttl_ms=50)
    tries: list[str] = []

    def flaky(record: SpawnRecord) -> None:
        tries.append(record.spawn_id)
        if len(tries) == 1:
            raise OSError("broker unreachable")

    reaper = Reaper(store, store.r, "worker-f", LEASE_MS, PERIOD_S, flaky)
    _wait(lambda: not store.leased(dead.spawn_id), "the lease to expire")
    assert reaper.tick() == 0  # leader now; the enqueue failed: the entry stays
    assert store.r.zscore(store.leases_key, dead.spawn_id) is not None
    assert reaper.tick() == 1
    assert tries == [dead.spawn_id, dead.spawn_id]
    # The entry stays until an attempt claims the spawn (which moves its deadline).
    assert store.r.zscore(store.leases_key, dead.spawn_id) is not None
    reaper.stop()
