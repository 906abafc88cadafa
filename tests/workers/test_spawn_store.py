"""The spawn store against a real Redis: append-only checkpoints, lease deadlines, batched
renewal, failing an unheld spawn, and the asyncio store on the same keys.

Redis database 4, flushed before and after each test.
"""

from __future__ import annotations

import asyncio
import json
from typing import cast

import pytest
import redis
import redis.asyncio

from registry.errors import LeaseLost
from workers.loop import Approval, LoopState, approval_hash
from workers.messages import Message, ToolCall
from workers.spawns import AsyncSpawnStore, SpawnRecord, SpawnStore, decode_record

LEASE_MS = 60_000


def _message(i: int) -> Message:
    return Message(role="assistant" if i % 2 else "user", content=f"message {i}")


def _running(store: SpawnStore, messages: int = 2) -> tuple[SpawnRecord, str]:
    """A spawn claimed by an attempt, its state holding ``messages`` messages."""
    record = SpawnRecord(
        session_id="s1",
        persona="probe",
        prompt="why?",
        state=LoopState(messages=[_message(i) for i in range(messages)]),
    )
    store.create(record)
    claimed, token = store.claim(record.spawn_id, LEASE_MS)
    assert claimed is not None and token is not None
    return claimed, token


def _listed(r: redis.Redis, store: SpawnStore, spawn_id: str) -> list[str]:
    items = r.lrange(store.messages_key(spawn_id), 0, -1)
    return [Message.model_validate_json(item).content for item in items]  # type: ignore[union-attr]


def _raw(r: redis.Redis, store: SpawnStore, spawn_id: str) -> bytes:
    raw = r.get(store._key(spawn_id))
    assert isinstance(raw, bytes)
    return raw


def test_checkpoints_append_each_message_once_in_order(r: redis.Redis, store: SpawnStore):
    record, token = _running(store)
    assert record.state is not None
    for i in range(2, 12):
        record.state.messages.append(_message(i))
        record.state.turns += 1
        store.save(record, token)
        store.save(record, token)  # a checkpoint with nothing new appends nothing

    assert _listed(r, store, record.spawn_id) == [f"message {i}" for i in range(12)]
    assert "message 3" not in _raw(r, store, record.spawn_id).decode()  # not in the record
    again = store.get(record.spawn_id)
    assert again == record
    assert again is not None and again.state is not None and again.state.turns == 10
    ttl = r.ttl(store.messages_key(record.spawn_id))
    assert isinstance(ttl, int) and ttl > store.retention - 60


def test_a_record_read_without_its_messages_leaves_the_list_alone(
    r: redis.Redis, store: SpawnStore
):
    record, token = _running(store, messages=3)
    bare = decode_record(_raw(r, store, record.spawn_id))
    assert bare.state is not None and bare.state.messages == []
    bare.state.turns = 7
    store.save(bare, token)  # a worker writing back a record that never read the transcript
    store.save_unfenced(bare)

    assert _listed(r, store, record.spawn_id) == ["message 0", "message 1", "message 2"]
    again = store.get(record.spawn_id)
    assert again is not None and again.state is not None and again.state.turns == 7
    assert [m.content for m in again.state.messages] == _listed(r, store, record.spawn_id)


def test_a_save_without_the_lease_changes_neither_record_nor_list(
    r: redis.Redis, store: SpawnStore
):
    record, token = _running(store)
    before = (_raw(r, store, record.spawn_id), _listed(r, store, record.spawn_id))
    assert record.state is not None
    record.state.messages.append(_message(2))
    record.result = "stale"
    with pytest.raises(LeaseLost):
        store.save(record, "not-the-token")
    store.release(record.spawn_id, token)
    with pytest.raises(LeaseLost):
        store.save(record, token)  # the right token, once given back
    assert (_raw(r, store, record.spawn_id), _listed(r, store, record.spawn_id)) == before


def test_a_shorter_state_replaces_the_list(r: redis.Redis, store: SpawnStore):
    record, token = _running(store, messages=4)
    record.state = LoopState(messages=[_message(9)])
    store.save(record, token)
    assert _listed(r, store, record.spawn_id) == ["message 9"]
    record.state.messages.append(_message(10))
    store.save(record, token)
    assert _listed(r, store, record.spawn_id) == ["message 9", "message 10"]


def test_a_state_rewritten_in_place_replaces_the_list(r: redis.Redis, store: SpawnStore):
    """Results shrunk to their previews keep the message count: the rewrite count tells."""
    record, token = _running(store, messages=4)
    assert record.state is not None
    record.state.messages[1] = Message(role="assistant", content="shrunk")
    record.state.rewrites += 1
    store.save(record, token)
    assert _listed(r, store, record.spawn_id) == ["message 0", "shrunk", "message 2", "message 3"]
    again = store.get(record.spawn_id)
    assert again is not None and again.state is not None
    again.state.messages.append(_message(4))
    store.save(again, token)  # read back, then appended to: only the new message is added
    assert _listed(r, store, record.spawn_id)[-2:] == ["message 3", "message 4"]
    assert len(_listed(r, store, record.spawn_id)) == 5


def test_stored_results_live_beside_the_record(store: SpawnStore, spawn_redis_url: str):
    record = store.create(SpawnRecord(session_id="s1", persona="probe", prompt="p"))

    async def roundtrip() -> tuple[str | None, str | None, int]:
        client = redis.asyncio.Redis.from_url(spawn_redis_url)
        try:
            results = AsyncSpawnStore(client).results(record.spawn_id)
            await results.put("call_1", "x" * 20_000)
            ttl = await client.ttl(store.results_key(record.spawn_id))
            return await results.get("call_1"), await results.get("call_2"), ttl
        finally:
            await client.aclose()

    stored, missing, ttl = asyncio.run(roundtrip())
    assert stored == "x" * 20_000 and missing is None
    assert 0 < ttl <= store.retention


def test_claim_and_decide_keep_the_list_and_track_the_lease(r: redis.Redis, store: SpawnStore):
    call = ToolCall(id="call_1", name="wipe_thing")
    record = SpawnRecord(
        session_id="s1",
        persona="wiper",
        prompt="wipe",
        status="waiting",
        state=LoopState(
            messages=[_message(0), Message(role="assistant", tool_calls=[call])],
            pending=[call],
            approvals={call.id: Approval()},
        ),
    )
    store.create(record)
    listed = _listed(r, store, record.spawn_id)
    args_hash = approval_hash(record.spawn_id, call)
    decided, settled = store.decide(record.spawn_id, "call_1", "alice", True, args_hash)
    assert settled and decided.status == "queued"
    assert _listed(r, store, record.spawn_id) == listed

    claimed, token = store.claim(record.spawn_id, LEASE_MS)
    assert claimed is not None and token is not None and claimed.state is not None
    assert [m.content for m in claimed.state.messages] == listed  # the attempt gets the transcript
    assert _listed(r, store, record.spawn_id) == listed
    assert r.zscore(store.leases_key, record.spawn_id) is not None
    assert store.claim(record.spawn_id, LEASE_MS)[1] is None  # held: nobody else claims it

    claimed.status = "waiting"
    store.save(claimed, token, release=True)
    assert r.zscore(store.leases_key, record.spawn_id) is None
    assert not store.leased(record.spawn_id)


def test_finishing_leaves_the_active_set_and_the_deadlines(r: redis.Redis, store: SpawnStore):
    record, token = _running(store)
    assert store.active() == [record.spawn_id]
    record.status = "ok"
    store.save(record, token)
    assert store.active() == [] and r.zscore(store.leases_key, record.spawn_id) is None


def test_a_record_written_before_messages_had_their_list_moves_them_there(
    r: redis.Redis, store: SpawnStore
):
    record, _ = _running(store, messages=0)
    assert record.state is not None
    record.state.messages = [_message(0), _message(1)]
    record.status = "queued"
    r.delete(store.lease_key(record.spawn_id))
    r.set(store._key(record.spawn_id), record.model_dump_json())  # messages inline, no list

    claimed, token = store.claim(record.spawn_id, LEASE_MS)
    assert claimed is not None and token is not None and claimed.state is not None
    assert [m.content for m in claimed.state.messages] == ["message 0", "message 1"]
    assert _listed(r, store, record.spawn_id) == ["message 0", "message 1"]
    assert "messages" not in json.loads(_raw(r, store, record.spawn_id))["state"]


def test_renew_all_renews_many_at_once_and_names_the_leases_lost(r: redis.Redis, store: SpawnStore):
    held = {}
    for _ in range(50):
        record, token = _running(store, messages=0)
        held[record.spawn_id] = token
    stolen, expired, *_ = held
    r.set(store.lease_key(stolen), "another-attempt", px=LEASE_MS)
    r.delete(store.lease_key(expired))
    for spawn_id in held:
        r.pexpire(store.lease_key(spawn_id), 1000)
    before = {s: r.zscore(store.leases_key, s) for s in held}

    lost = store.renew_all({**held, stolen: held[stolen]}, 5 * LEASE_MS)

    assert sorted(lost) == sorted([stolen, expired])
    for spawn_id in held:
        if spawn_id in lost:
            continue
        assert r.pttl(store.lease_key(spawn_id)) > LEASE_MS  # type: ignore[operator]
        assert r.zscore(store.leases_key, spawn_id) > before[spawn_id]  # type: ignore[operator]
    assert r.get(store.lease_key(stolen)) == b"another-attempt"  # not touched
    assert store.renew_all({}, LEASE_MS) == []


def test_lease_deadlines_are_redis_time(r: redis.Redis, store: SpawnStore):
    record, _ = _running(store, messages=0)
    seconds, micros = cast(tuple[int, int], r.time())
    now_ms = seconds * 1000 + micros // 1000
    deadline = cast("float | None", r.zscore(store.leases_key, record.spawn_id))
    assert deadline is not None and now_ms < deadline <= now_ms + LEASE_MS


def test_fail_unheld_fails_only_a_spawn_no_attempt_holds(r: redis.Redis, store: SpawnStore):
    record, token = _running(store)

    def never_served(_: SpawnRecord) -> bool:
        return False

    def why(failing: SpawnRecord) -> str:
        return f"nobody consumes {failing.queue!r}"

    assert store.fail_unheld(record.spawn_id, served=never_served, error=why) is None  # held
    r.delete(store.lease_key(record.spawn_id))  # its worker died: the lease expired
    assert store.fail_unheld(record.spawn_id, served=lambda _: True, error=why) is None
    failed = store.fail_unheld(record.spawn_id, served=never_served, error=why)

    assert failed is not None and failed.status == "failed" and failed.error == "nobody consumes ''"
    stored = store.get(record.spawn_id)
    assert stored is not None and stored.status == "failed" and stored.state is not None
    assert [m.content for m in stored.state.messages] == ["message 0", "message 1"]
    assert store.active() == [] and r.zscore(store.leases_key, record.spawn_id) is None
    assert store.fail_unheld("missing", served=never_served, error=why) is None


def test_the_async_store_shares_keys_and_semantics(
    r: redis.Redis, store: SpawnStore, spawn_redis_url: str
):
    record = store.create(
        SpawnRecord(
            session_id="s1", persona="probe", prompt="p", state=LoopState(messages=[_message(0)])
        )
    )

    async def attempt() -> tuple[SpawnRecord | None, list[str], bool]:
        client = redis.asyncio.Redis.from_url(spawn_redis_url)
        try:
            engine = AsyncSpawnStore(client)
            claimed, token = await engine.claim(record.spawn_id, LEASE_MS)
            assert claimed is not None and token is not None and claimed.state is not None
            assert (await engine.claim(record.spawn_id, LEASE_MS))[1] is None
            for i in range(1, 4):
                claimed.state.messages.append(_message(i))
                await engine.save(claimed, token)
            lost = await engine.renew_all({record.spawn_id: token, "gone": "x"}, LEASE_MS)
            with pytest.raises(LeaseLost):
                await engine.save(claimed, "stale")
            cancelled = await engine.cancel_requested(record.spawn_id)
            await engine.release(record.spawn_id, token)
            return await engine.get(record.spawn_id), lost, cancelled
        finally:
            await client.aclose()

    got, lost, cancelled = asyncio.run(attempt())

    assert got is not None and got.state is not None and got.status == "running"
    assert [m.content for m in got.state.messages] == [f"message {i}" for i in range(4)]
    assert got == store.get(record.spawn_id)
    assert lost == ["gone"] and not cancelled
    assert not store.leased(record.spawn_id) and r.zscore(store.leases_key, record.spawn_id) is None


def test_a_long_transcript_is_replaced_in_one_save(r: redis.Redis, store: SpawnStore):
    record, token = _running(store, messages=2500)
    record.state = LoopState(messages=[_message(i) for i in range(2400)])
    store.save(record, token)  # more messages than one Lua call may unpack at once
    assert r.llen(store.messages_key(record.spawn_id)) == 2400
