"""The lease keeper against a real Redis: it keeps every held lease alive with one call per
period and reports each lost lease once.

Redis database 4, flushed before and after each test.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import redis

from registry.errors import LeaseLost
from workers.leases import LeaseFence, LeaseKeeper
from workers.loop import LoopState
from workers.messages import Message
from workers.spawns import SpawnRecord, SpawnStore

TTL_MS = 600
PERIOD_S = 0.1
DEADLINE_S = 30.0


def _claimed(store: SpawnStore) -> tuple[str, str]:
    record = store.create(
        SpawnRecord(
            session_id="s",
            persona="p",
            prompt="q",
            state=LoopState(messages=[Message(role="user")]),
        )
    )
    _, token = store.claim(record.spawn_id, TTL_MS)
    assert token is not None
    return record.spawn_id, token


def _wait(predicate: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


class _Lost:
    def __init__(self) -> None:
        self.ids: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, spawn_id: str) -> None:
        with self.lock:
            self.ids.append(spawn_id)


def test_held_leases_outlive_their_ttl_and_a_stolen_one_is_reported_once(store: SpawnStore):
    lost = _Lost()
    keeper = LeaseKeeper(store, TTL_MS, PERIOD_S, lost)
    held = dict(_claimed(store) for _ in range(20))
    for spawn_id, token in held.items():
        keeper.hold(spawn_id, token)
    keeper.start()
    try:
        started = time.monotonic()
        _wait(lambda: time.monotonic() - started > 4 * TTL_MS / 1000, "four lease lifetimes")
        assert all(store.leased(spawn_id) for spawn_id in held), "a held lease expired"

        stolen, dropped, *_ = held
        keeper.drop(dropped)
        store.release(dropped, held[dropped])  # dropped first: not reported as lost
        store.r.set(store.lease_key(stolen), "another-attempt", px=60_000)
        _wait(lambda: lost.ids, "the stolen lease to be reported")
        _wait(lambda: stolen not in keeper.held(), "the stolen lease to be let go")
        time.sleep(5 * PERIOD_S)  # more periods: no second report
    finally:
        keeper.stop()

    assert lost.ids == [stolen]
    assert sorted(keeper.held()) == sorted(set(held) - {stolen, dropped})
    assert store.r.get(store.lease_key(stolen)) == b"another-attempt"


def test_an_expired_lease_is_reported_and_a_failing_callback_stops_nothing(store: SpawnStore):
    first, second = _claimed(store), _claimed(store)
    reported: list[str] = []

    def on_lost(spawn_id: str) -> None:
        reported.append(spawn_id)
        raise RuntimeError("a broken metric")

    keeper = LeaseKeeper(store, TTL_MS, PERIOD_S, on_lost)
    keeper.hold(*first)
    keeper.hold(*second)
    store.r.delete(store.lease_key(first[0]))
    assert keeper.renew_now() == [first[0]]
    store.r.delete(store.lease_key(second[0]))
    assert keeper.renew_now() == [second[0]]
    assert reported == [first[0], second[0]] and keeper.held() == {}


def test_an_unreachable_redis_is_retried_each_period_and_the_fence_gives_the_lease_up(
    store: SpawnStore,
):
    unreachable = SpawnStore(redis.Redis(port=1, socket_connect_timeout=0.2))
    lost = _Lost()
    keeper = LeaseKeeper(unreachable, TTL_MS, PERIOD_S, lost)
    keeper.hold("s1", "token")
    with pytest.raises(redis.ConnectionError):
        keeper.renew_now()
    assert keeper.held() == {"s1": "token"}  # one failed renewal loses nothing
    keeper.start()
    try:
        # Never confirmed again: reported lost by the fence, before Redis could expire it.
        _wait(lambda: lost.ids, "the fence to report the unconfirmed lease")
        assert keeper._thread.is_alive()
    finally:
        keeper.stop()
    assert lost.ids == ["s1"] and keeper.held() == {} and not keeper.valid("s1")


def test_a_lease_is_valid_only_while_recently_confirmed(store: SpawnStore):
    lost = _Lost()
    keeper = LeaseKeeper(store, TTL_MS, PERIOD_S, lost)
    spawn_id, token = _claimed(store)
    long_ago = time.monotonic() - TTL_MS / 1000
    keeper.hold(spawn_id, token, confirmed_at=long_ago)
    assert not keeper.valid(spawn_id)
    with pytest.raises(LeaseLost):
        LeaseFence(keeper, spawn_id).check()
    keeper.renew_now()  # Redis still has it: confirmed again
    assert keeper.valid(spawn_id) and keeper.fence_now() == []
    keeper.hold(spawn_id, token, confirmed_at=long_ago)
    assert keeper.fence_now() == [spawn_id] and lost.ids == [spawn_id]
    assert keeper.held() == {} and keeper.fence_now() == []  # reported once


def test_a_renewal_cannot_take_back_a_lease_another_attempt_holds(store: SpawnStore):
    lost = _Lost()
    keeper = LeaseKeeper(store, TTL_MS, PERIOD_S, lost)
    spawn_id, token = _claimed(store)
    keeper.hold(spawn_id, token)
    store.r.set(store.lease_key(spawn_id), "another-attempt")
    assert keeper.renew_now() == [spawn_id]
    assert store.r.get(store.lease_key(spawn_id)) == b"another-attempt"
