"""Decisions on calls that wait for a person, against a real Redis: :meth:`SpawnStore.decide`.

Redis database 12, every test under a prefix of its own (removed afterwards), so concurrent runs
never see each other's keys. Races are started behind a :class:`threading.Barrier` and repeated,
each thread with its own connection.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import TypeVar

import pytest
import redis
from races import race

from registry.errors import NotFoundError
from workers.loop import Approval, LoopState
from workers.messages import Message, ToolCall
from workers.spawns import AlreadyDecided, NotWaiting, SpawnRecord, SpawnStore

REDIS_URL = "redis://127.0.0.1:6379/12"
ROUNDS = 20
T = TypeVar("T")


@pytest.fixture
def prefix() -> Iterator[str]:
    made = f"ongrid-test-{uuid.uuid4().hex}:"
    yield made
    with redis.Redis.from_url(REDIS_URL) as client:
        keys = list(client.scan_iter(f"{made}*"))
        if keys:
            client.delete(*keys)


@pytest.fixture
def store(prefix: str) -> Iterator[SpawnStore]:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.ConnectionError as exc:
        pytest.fail(f"no Redis at {REDIS_URL} (./dev test starts one): {exc}")
    yield SpawnStore(client, prefix=prefix)
    client.close()


def _waiting(store: SpawnStore, needed: int = 1, status: str = "waiting") -> SpawnRecord:
    """A spawn parked on one call, as a worker leaves it."""
    call = ToolCall(id="call_1", name="wipe_thing", arguments='{"thing": "tmp"}')
    record = SpawnRecord(
        session_id=uuid.uuid4().hex,
        persona="wiper",
        prompt="wipe /tmp",
        user="alice",
        status=status,  # type: ignore[arg-type]
        state=LoopState(
            messages=[Message(role="assistant", content="", tool_calls=[call])],
            pending=[call],
            approvals={call.id: Approval(needed=needed)},
        ),
    )
    return store.create(record)


def _decide_at_once(
    stores: list[SpawnStore], record: SpawnRecord, decisions: list[tuple[str, bool]]
) -> list[tuple[SpawnRecord, bool] | BaseException]:
    """Decision ``i`` (user, approve) on ``call_1`` through ``stores[i]``, all released at once."""

    def decide(i: int) -> tuple[SpawnRecord, bool]:
        user, approve = decisions[i]
        return stores[i].decide(record.spawn_id, "call_1", user, approve)

    return race(len(decisions), decide)


def _stores(store: SpawnStore, count: int) -> list[SpawnStore]:
    """One store per thread, each on its own connection pool, like separate API processes."""
    return [SpawnStore(redis.Redis.from_url(REDIS_URL), prefix=store.prefix) for _ in range(count)]


def test_concurrent_approvals_are_all_recorded_and_exactly_one_settles_the_call(
    store: SpawnStore,
) -> None:
    stores = _stores(store, 8)
    users = [f"approver{i}" for i in range(8)]
    for _ in range(ROUNDS):
        record = _waiting(store, needed=8)
        results = _decide_at_once(stores, record, [(user, True) for user in users])
        assert all(isinstance(r, tuple) for r in results), results
        settled = [r[1] for r in results if isinstance(r, tuple)]
        assert settled.count(True) == 1, settled
        final = store.get(record.spawn_id)
        assert final is not None and final.state is not None
        assert sorted(final.state.approvals["call_1"].approved_by) == users
        assert final.status == "queued"
    for made in stores:
        made.r.close()


def test_of_two_people_settling_one_call_at_once_the_first_decision_stands(
    store: SpawnStore,
) -> None:
    stores = _stores(store, 8)
    for _ in range(ROUNDS):
        record = _waiting(store, needed=1)
        # Even threads approve, odd ones deny: the call is settled by whoever is first.
        decisions = [(f"user{i}", i % 2 == 0) for i in range(8)]
        results = _decide_at_once(stores, record, decisions)
        won = [i for i, r in enumerate(results) if isinstance(r, tuple)]
        assert len(won) == 1, results
        winner = won[0]
        final = store.get(record.spawn_id)
        assert final is not None and final.state is not None and final.status == "queued"
        approval = final.state.approvals["call_1"]
        if winner % 2 == 0:
            assert (approval.approved_by, approval.denied_by) == ([f"user{winner}"], None)
        else:
            assert (approval.approved_by, approval.denied_by) == ([], f"user{winner}")
        word = "approved" if winner % 2 == 0 else "denied"
        for i, result in enumerate(results):
            if i == winner:
                continue
            assert isinstance(result, AlreadyDecided), result
            assert result.decided_by == [f"user{winner}"] and result.decision == word
            assert f"already {word} by user{winner}; the first decision stands" in str(result)
    for made in stores:
        made.r.close()


def test_a_dual_call_waits_for_a_second_person_and_a_denial_settles_it(store: SpawnStore) -> None:
    record = _waiting(store, needed=2)
    first, settled = store.decide(record.spawn_id, "call_1", "alice", approve=True)
    assert (first.status, settled) == ("waiting", False)
    again, settled = store.decide(record.spawn_id, "call_1", "alice", approve=True)
    assert (again.status, settled) == ("waiting", False)  # the same person is one signature
    assert again.updated == first.updated  # a repeat writes nothing
    denied, settled = store.decide(record.spawn_id, "call_1", "bob", approve=False)
    assert (denied.status, settled) == ("queued", True)
    assert denied.state is not None
    assert denied.state.approvals["call_1"].model_dump() == {
        "approved_by": ["alice"],
        "denied_by": "bob",
        "needed": 2,
    }
    with pytest.raises(AlreadyDecided, match="already denied by bob"):
        store.decide(record.spawn_id, "call_1", "alice", approve=True)
    with pytest.raises(NotWaiting, match="is not waiting for a decision on 'call_1'") as info:
        store.decide(record.spawn_id, "call_1", "bob", approve=False)  # bob's own, repeated
    assert (info.value.status, info.value.waiting_on) == ("queued", [])


def test_decisions_the_spawn_is_not_waiting_for_are_refused_and_change_nothing(
    store: SpawnStore,
) -> None:
    with pytest.raises(NotFoundError, match="unknown spawn 'nope'"):
        store.decide("nope", "call_1", "alice", approve=True)
    waiting = _waiting(store)
    with pytest.raises(NotWaiting, match="not waiting for a decision on 'guess'") as info:
        store.decide(waiting.spawn_id, "guess", "alice", approve=True)
    assert (info.value.status, info.value.waiting_on) == ("waiting", ["call_1"])
    running = _waiting(store, status="running")
    with pytest.raises(NotWaiting) as info:
        store.decide(running.spawn_id, "call_1", "alice", approve=True)
    assert (info.value.status, info.value.waiting_on) == ("running", [])
    for record in (waiting, running):
        assert store.get(record.spawn_id) == record
