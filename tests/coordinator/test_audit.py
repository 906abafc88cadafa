"""The audit trail's copy of the approval feed, against a real Redis and a SQLite file: the
follower copies requests and expiries on its own, skips decisions (the API writes those),
and copying again (a second API process, a restart) or a Redis that lost its data adds
nothing twice and misses nothing.

Redis database 12, under a prefix of its own per test (removed afterwards).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redis_server

from coordinator.audit_follower import AuditFollower
from coordinator.storage.audit import AuditStore
from coordinator.storage.engine import Database, make_engine
from workers.approvals import ApprovalFeed
from workers.messages import ApprovalDecided, ConfirmationRequired, Requester

REDIS_URL = redis_server.url(12)
DEADLINE = 30.0


@pytest.fixture
def feed() -> Iterator[ApprovalFeed]:
    prefix = f"ongrid-test-{uuid.uuid4().hex}:"
    client = redis.Redis.from_url(REDIS_URL)
    yield ApprovalFeed(client, prefix=prefix)
    keys = list(client.scan_iter(f"{prefix}*"))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture
def database(tmp_path: Path) -> Iterator[Database]:
    made = Database(make_engine(f"sqlite:///{tmp_path / 'audit.db'}"))
    made.ensure()
    yield made
    made.engine.dispose()


def _request(call_id: str) -> ConfirmationRequired:
    return ConfirmationRequired(
        session_id="s1",
        spawn_id="w1",
        call_id=call_id,
        name="restart_thing",
        arguments="{}",
        confirmation="once",
        args_hash=f"hash-{call_id}",
        requested_by=Requester(user="alice", role="admin", persona="fixer"),
        expires_at=2_000_000_000.0,
    )


def _decided(call_id: str, decision: str, by: str = "") -> ApprovalDecided:
    return ApprovalDecided(
        session_id="s1",
        spawn_id="w1",
        call_id=call_id,
        name="restart_thing",
        args_hash=f"hash-{call_id}",
        decision=decision,  # type: ignore[arg-type]
        by=by,
        owner="alice",
        settled=True,
    )


def _rows(store: AuditStore) -> list[tuple[str, str, str]]:
    return [(r.action, r.call_id, r.actor) for r in reversed(store.list())]


def test_the_follower_copies_requests_and_expiries_once_and_skips_decisions(
    feed: ApprovalFeed, database: Database
) -> None:
    store = AuditStore(database.engine)
    follower = AuditFollower(feed, store, database)
    follower.start()
    try:
        feed.publish(_request("c1"))
        feed.publish(_decided("c1", "approved", "carol"))
        feed.publish(_request("c2"))
        feed.publish(_decided("c2", "expired"))
        deadline = time.monotonic() + DEADLINE
        while len(store.list()) < 3:  # copied by the thread alone: nobody reads the audit
            assert time.monotonic() < deadline, f"the follower copied only {_rows(store)}"
            time.sleep(0.05)
    finally:
        follower.stop()

    expected = [("requested", "c1", "alice"), ("requested", "c2", "alice"), ("expired", "c2", "")]
    assert _rows(store) == expected
    (request, _, expiry) = reversed(store.list())
    assert (request.role, request.tool, request.args_hash) == ("admin", "restart_thing", "hash-c1")
    assert "fixer asks for one person to approve by 2033-05-18T03:33:20+00:00" in request.outcome
    assert "expired undecided (approved by nobody of 1 needed)" in expiry.outcome
    # A second API process, or this one restarted, copies from where the table is: nothing twice.
    again = AuditFollower(feed, store, database)
    assert again.catch_up() == 4
    assert _rows(store) == expected


def test_a_redis_that_lost_its_data_starts_a_new_epoch_and_nothing_is_missed(
    feed: ApprovalFeed, database: Database
) -> None:
    store = AuditStore(database.engine)
    follower = AuditFollower(feed, store, database)
    feed.publish(_request("c1"))
    feed.publish(_request("c2"))
    first = feed.epoch()
    assert follower.catch_up() == 2
    feed._client.delete(*feed._client.keys(f"{feed.prefix}*"))  # the feed is gone, with its epoch

    feed.publish(_request("c3"))  # numbered 1 again
    assert follower.catch_up() == 1

    assert feed.epoch() != first
    assert [call for _action, call, _actor in _rows(store)] == ["c1", "c2", "c3"]
