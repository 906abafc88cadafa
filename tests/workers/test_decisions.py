"""Decisions on calls that wait for a person, against a real Redis: the hash that binds an
approval to its arguments, :meth:`SpawnStore.decide` and its refusals, and the expiry of a
request nobody decided (:meth:`SpawnStore.expire_approval`, swept by the reaper).

Redis database 12, every test under a prefix of its own (removed afterwards), so concurrent runs
never see each other's keys. Races are started behind a :class:`threading.Barrier` and repeated,
each thread with its own connection.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterator

import pytest
import redis
import redis_server
from races import race

from registry.errors import NotFoundError
from workers.loop import Approval, LoopState, approval_hash
from workers.messages import Message, ToolCall
from workers.reaper import Reaper
from workers.spawns import (
    AlreadyDecided,
    Expired,
    HashMismatch,
    NotWaiting,
    Replayed,
    SpawnRecord,
    SpawnStore,
    deadline_member,
)

REDIS_URL = redis_server.url(12)
ROUNDS = 20
CALL = ToolCall(id="call_1", name="wipe_thing", arguments='{"thing": "tmp"}')


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


def _now(store: SpawnStore) -> float:
    seconds, micros = store.r.time()
    return seconds + micros / 1_000_000


def _waiting(
    store: SpawnStore,
    needed: int = 1,
    status: str = "waiting",
    expires_in: float = 3600.0,
    hashed: bool = True,
) -> SpawnRecord:
    """A spawn parked on one call, as a worker leaves it."""
    spawn_id = uuid.uuid4().hex
    approval = Approval(
        needed=needed,
        args_hash=approval_hash(spawn_id, CALL) if hashed else "",
        expires_at=_now(store) + expires_in,
    )
    record = SpawnRecord(
        spawn_id=spawn_id,
        session_id=uuid.uuid4().hex,
        persona="wiper",
        prompt="wipe /tmp",
        user="alice",
        status=status,  # type: ignore[arg-type]
        state=LoopState(
            messages=[Message(role="assistant", content="", tool_calls=[CALL])],
            pending=[CALL],
            approvals={CALL.id: approval},
        ),
    )
    return store.create(record)


def _hash(record: SpawnRecord) -> str:
    return approval_hash(record.spawn_id, CALL)


def _stores(store: SpawnStore, count: int) -> list[SpawnStore]:
    """One store per thread, each on its own connection pool, like separate API processes."""
    return [SpawnStore(redis.Redis.from_url(REDIS_URL), prefix=store.prefix) for _ in range(count)]


def _decide_at_once(
    stores: list[SpawnStore], record: SpawnRecord, decisions: list[tuple[str, bool]]
) -> list[tuple[SpawnRecord, bool] | BaseException]:
    """Decision ``i`` (user, approve) on ``call_1`` through ``stores[i]``, all released at once."""

    def decide(i: int) -> tuple[SpawnRecord, bool]:
        user, approve = decisions[i]
        return stores[i].decide(record.spawn_id, "call_1", user, approve, _hash(record))

    return race(len(decisions), decide)


# -- the hash ----------------------------------------------------------------------------------


def test_the_hash_is_sha256_of_the_canonical_spawn_call_tool_and_parsed_arguments() -> None:
    call = ToolCall(id="c1", name="restart", arguments='{ "unit": "nginx",  "force": true }')
    canonical = '["s1","c1","restart",{"force":true,"unit":"nginx"}]'
    assert approval_hash("s1", call) == hashlib.sha256(canonical.encode()).hexdigest()
    # The same arguments spelled differently bind the same; anything else changes the hash.
    respelled = call.model_copy(update={"arguments": '{"force":true,"unit":"nginx"}'})
    assert approval_hash("s1", respelled) == approval_hash("s1", call)
    others = {
        approval_hash("s2", call),
        approval_hash("s1", call.model_copy(update={"id": "c2"})),
        approval_hash("s1", call.model_copy(update={"name": "stop"})),
        approval_hash("s1", call.model_copy(update={"arguments": '{"unit": "sshd"}'})),
        approval_hash("s1", call.model_copy(update={"arguments": '{"unit": "nginx"}'})),
    }
    assert len(others) == 5 and approval_hash("s1", call) not in others
    not_json = call.model_copy(update={"arguments": "unit=nginx"})
    as_text = json.dumps(["s1", "c1", "restart", "unit=nginx"], separators=(",", ":"))
    assert approval_hash("s1", not_json) == hashlib.sha256(as_text.encode()).hexdigest()


# -- decisions ---------------------------------------------------------------------------------


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


def test_a_dual_call_needs_two_different_people_and_nobody_signs_twice(
    store: SpawnStore,
) -> None:
    record = _waiting(store, needed=2)
    args_hash = _hash(record)
    first, settled = store.decide(record.spawn_id, "call_1", "alice", True, args_hash)
    assert (first.status, settled) == ("waiting", False)
    with pytest.raises(Replayed, match="1 more approval must come from someone else") as info:
        store.decide(record.spawn_id, "call_1", "alice", True, args_hash)
    assert (info.value.code, info.value.details) == (
        "replayed",
        {"user": "alice", "approved_by": ["alice"], "needed": 2},
    )
    with pytest.raises(Replayed):  # nor may she turn her signature into a denial
        store.decide(record.spawn_id, "call_1", "alice", False, args_hash)
    unchanged = store.get(record.spawn_id)
    assert unchanged is not None and unchanged.updated == first.updated  # refusals write nothing
    second, settled = store.decide(record.spawn_id, "call_1", "bob", True, args_hash)
    assert (second.status, settled) == ("queued", True)
    assert second.state is not None
    assert second.state.approvals["call_1"].approved_by == ["alice", "bob"]
    with pytest.raises(Replayed, match="a decision is taken once"):
        store.decide(record.spawn_id, "call_1", "bob", True, args_hash)  # bob's, replayed
    with pytest.raises(AlreadyDecided, match="already approved by alice and bob"):
        store.decide(record.spawn_id, "call_1", "carol", False, args_hash)


def test_a_denial_settles_a_dual_call_at_once(store: SpawnStore) -> None:
    record = _waiting(store, needed=2)
    store.decide(record.spawn_id, "call_1", "alice", True, _hash(record))
    denied, settled = store.decide(record.spawn_id, "call_1", "bob", False, _hash(record))
    assert (denied.status, settled) == ("queued", True)
    assert denied.state is not None
    assert denied.state.approvals["call_1"].model_dump(include={"approved_by", "denied_by"}) == {
        "approved_by": ["alice"],
        "denied_by": "bob",
    }


def test_a_decision_for_another_hash_is_refused_and_changes_nothing(store: SpawnStore) -> None:
    record = _waiting(store)
    other_call = CALL.model_copy(update={"arguments": '{"thing": "/"}'})
    for wrong in (
        approval_hash(record.spawn_id, other_call),  # other arguments
        approval_hash(uuid.uuid4().hex, CALL),  # the same call of another spawn
        "0" * 64,
    ):
        with pytest.raises(HashMismatch, match="is not the hash of call 'call_1'") as info:
            store.decide(record.spawn_id, "call_1", "alice", True, wrong)
        assert info.value.code == "hash_mismatch"
        assert info.value.details == {"args_hash": _hash(record)}
    assert store.get(record.spawn_id) == record


def test_a_state_saved_before_hashes_binds_to_its_pending_call(store: SpawnStore) -> None:
    record = _waiting(store, hashed=False)
    with pytest.raises(HashMismatch):
        store.decide(record.spawn_id, "call_1", "alice", True, "")
    decided, settled = store.decide(record.spawn_id, "call_1", "alice", True, _hash(record))
    assert (decided.status, settled) == ("queued", True)


def test_a_decision_after_the_deadline_is_refused_before_any_sweep(store: SpawnStore) -> None:
    record = _waiting(store, expires_in=-1.0)  # the sweep has not run: not marked expired
    with pytest.raises(Expired, match="expired at") as info:
        store.decide(record.spawn_id, "call_1", "alice", True, _hash(record))
    assert info.value.code == "expired"
    assert store.get(record.spawn_id) == record


def test_decisions_the_spawn_is_not_waiting_for_are_refused_and_change_nothing(
    store: SpawnStore,
) -> None:
    with pytest.raises(NotFoundError, match="unknown spawn 'nope'"):
        store.decide("nope", "call_1", "alice", True, "x")
    waiting = _waiting(store)
    with pytest.raises(NotWaiting, match="not waiting for a decision on 'guess'") as info:
        store.decide(waiting.spawn_id, "guess", "alice", True, _hash(waiting))
    assert (info.value.status, info.value.waiting_on) == ("waiting", ["call_1"])
    running = _waiting(store, status="running")
    with pytest.raises(NotWaiting) as info:
        store.decide(running.spawn_id, "call_1", "alice", True, _hash(running))
    assert (info.value.status, info.value.waiting_on) == ("running", [])
    for record in (waiting, running):
        assert store.get(record.spawn_id) == record


# -- expiry ------------------------------------------------------------------------------------


def test_an_undecided_request_past_its_deadline_expires_once(store: SpawnStore) -> None:
    record = _waiting(store, expires_in=-1.0)
    assert store.expire_approval(record.spawn_id, "call_1", _now(store) - 3600)[0] == "keep"

    outcome, expired = store.expire_approval(record.spawn_id, "call_1", _now(store))

    assert outcome == "expired" and expired is not None
    saved = store.get(record.spawn_id)
    assert saved is not None and saved.state is not None and saved.status == "queued"
    assert saved.state.approvals["call_1"].expired and saved.state.approvals["call_1"].settled
    assert saved.state.messages == record.state.messages  # type: ignore[union-attr]
    # A sweep that died before its enqueue is repeated: enqueue again; once claimed, forget.
    assert store.expire_approval(record.spawn_id, "call_1", _now(store))[0] == "requeue"
    with pytest.raises(Expired):
        store.decide(record.spawn_id, "call_1", "alice", True, _hash(record))
    saved.status = "running"
    store.save_unfenced(saved)
    assert store.expire_approval(record.spawn_id, "call_1", _now(store))[0] == "forget"


def test_a_request_expires_only_while_its_spawn_waits_undecided(store: SpawnStore) -> None:
    running = _waiting(store, status="running", expires_in=-1.0)  # parking, or resumed
    assert store.expire_approval(running.spawn_id, "call_1", _now(store))[0] == "keep"
    decided = _waiting(store)
    store.decide(decided.spawn_id, "call_1", "alice", True, _hash(decided))
    assert store.expire_approval(decided.spawn_id, "call_1", _now(store) + 7200)[0] == "forget"
    assert store.expire_approval("gone", "call_1", _now(store))[0] == "forget"
    assert store.get(running.spawn_id) == running


def test_the_elected_reaper_sweeps_expired_requests_and_leaves_the_rest(store: SpawnStore) -> None:
    enqueued: list[str] = []
    announced: list[tuple[str, str]] = []
    expired = _waiting(store, expires_in=-1.0)
    later = _waiting(store, expires_in=3600.0)
    parking = _waiting(store, status="running", expires_in=-1.0)
    deadlines = store.approval_deadlines_key
    for record in (expired, later, parking):
        approval = record.state.approvals["call_1"]  # type: ignore[union-attr]
        store.r.zadd(deadlines, {deadline_member(record.spawn_id, "call_1"): approval.expires_at})
    reaper = Reaper(
        store,
        store.r,
        "worker-x",
        lease_ms=1000,
        period_s=0.1,
        requeue=lambda record: enqueued.append(record.spawn_id),
        on_expired=lambda record, call_id: announced.append((record.spawn_id, call_id)),
    )

    assert reaper.tick() == 1
    assert reaper.tick() == 0  # once

    assert enqueued == [expired.spawn_id] and announced == [(expired.spawn_id, "call_1")]
    left = {m.decode() for m in store.r.zrange(deadlines, 0, -1)}
    assert left == {deadline_member(r.spawn_id, "call_1") for r in (later, parking)}
    swept = store.get(expired.spawn_id)
    assert swept is not None and swept.state is not None and swept.status == "queued"
    assert swept.state.approvals["call_1"].expired
    reaper.stop()
