"""Notifications from the feeds to real HTTP receivers, through the sender and its outbox.

Real Redis (database 12, a cluster name of its own per test), a SQLite file migrated as the API
migrates it, the sender's own threads, and the receivers of ``tests/receivers.py`` on real
sockets: a Slack-compatible one, a signed webhook checked with the documentation's own verifier,
one that fails twice before it accepts, one that never answers and one that refuses for good.
Events enter the feeds exactly as a worker publishes them.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
import redis_server
from processes import wait_for
from receivers import Receiver, verify_signature

from coordinator.notify.sender import NOTIFICATIONS, NotificationSender
from coordinator.storage.engine import Database, make_engine
from coordinator.storage.notifications import NotificationStore
from registry.notifications import ChannelConfig, NotificationSettings, RoutingRule
from registry.settings import Settings, TokenGrant
from workers.approvals import ApprovalFeed
from workers.messages import ApprovalDecided, ConfirmationRequired, Requester, SpawnEnded
from workers.spawn_ends import SpawnEndFeed

REDIS_URL = redis_server.url(12)
DEADLINE = 30.0
SECRET = "s3cret-s3cret-s3cret-s3cret-0123"
OTHER_SECRET = "another-secret-another-secret-99"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver({"pager": SECRET, "flaky": SECRET, "other": OTHER_SECRET}) as made:
        yield made


@pytest.fixture
def database(tmp_path: Path) -> Iterator[Database]:
    made = Database(make_engine(f"sqlite:///{tmp_path / 'notify.db'}"))
    made.ensure()
    yield made
    made.engine.dispose()


class Stack:
    """A sender over fresh feeds; ``publish`` puts events in as a worker does."""

    def __init__(self, settings: Settings, database: Database) -> None:
        self.settings = settings
        self.client = redis.Redis.from_url(REDIS_URL)
        self.store = NotificationStore(database.engine)
        self.approvals = ApprovalFeed(self.client, settings.key_prefix)
        self.ends = SpawnEndFeed(self.client, settings.key_prefix)
        self.sender = NotificationSender(settings, self.store, database, self.client)
        self._index = 0

    def publish(self, event: Any) -> None:
        approval = isinstance(event, ConfirmationRequired | ApprovalDecided)
        feed = self.approvals if approval else self.ends
        self._index += 1

        async def announce() -> None:
            client = redis.asyncio.Redis.from_url(REDIS_URL)
            try:
                await feed.aannounce(event, self._index, client)
            finally:
                await client.aclose()

        asyncio.run(announce())

    def close(self) -> None:
        self.sender.stop()
        keys = list(self.client.scan_iter(f"{self.settings.key_prefix}*"))
        if keys:
            self.client.delete(*keys)
        self.client.close()


def _settings(receiver: Receiver, **config: Any) -> Settings:
    channels = {
        "oncall": ChannelConfig(type="slack", url=f"{receiver.url}/slack/T1"),
        "pager": ChannelConfig(type="webhook", url=f"{receiver.url}/hook/pager", secret=SECRET),
    }
    defaults: dict[str, Any] = {
        "console_url": "https://ongrid.example.com",
        "channels": channels,
        "rules": [
            RoutingRule(
                events=["approval.requested", "spawn.finished", "spawn.failed"],
                channels=["oncall", "pager"],
            )
        ],
    }
    defaults.update(config)
    return Settings(
        redis_url=REDIS_URL,
        cluster=f"n{uuid.uuid4().hex[:12]}",
        notifications=NotificationSettings(**defaults),
        token_grants={
            "a": TokenGrant(user="alice", role="admin"),
            "c": TokenGrant(user="carol", role="operator"),
            "v": TokenGrant(user="victor", role="viewer"),
        },
        approvers={"alice": ["carol", "victor"]},
    )


@pytest.fixture
def stacks(database: Database) -> Iterator[list[Stack]]:
    made: list[Stack] = []
    yield made
    for stack in made:
        stack.close()


def _stack(stacks: list[Stack], settings: Settings, database: Database) -> Stack:
    stack = Stack(settings, database)
    stacks.append(stack)
    # The sender starts at the feeds' ends: it is started before anything is published.
    stack.sender.start()
    wait_for(lambda: stack.store.position("ends")[0], DEADLINE, "the sender to take its place")
    return stack


def _ended(
    spawn_id: str = "sp1",
    *,
    status: str = "ok",
    message: str = "All disks below 70 %.",
    persona: str = "disk_specialist",
    background: bool = True,
    **more: Any,
) -> SpawnEnded:
    return SpawnEnded(
        session_id="se1",
        spawn_id=spawn_id,
        status=status,  # type: ignore[arg-type]
        persona=persona,
        owner="alice",
        background=background,
        message=message,
        **more,
    )


def _request(call_id: str = "call-1") -> ConfirmationRequired:
    return ConfirmationRequired(
        session_id="se1",
        spawn_id="sp2",
        call_id=call_id,
        name="restart_thing",
        arguments='{"thing": "exporter <!channel>"}',
        confirmation="once",
        args_hash="h1",
        requested_by=Requester(user="alice", role="admin", persona="fixer"),
        expires_at=2_000_000_000.0,
        tool_class="write",
    )


def _count(channel: str, outcome: str) -> float:
    return NOTIFICATIONS.labels(channel, outcome)._value.get()  # noqa: SLF001 - the test reads it


# -- what reaches whom -------------------------------------------------------------------------


def test_a_background_spawns_end_reaches_slack_and_a_signed_webhook(
    receiver: Receiver, database: Database, stacks: list[Stack]
):
    stack = _stack(stacks, _settings(receiver), database)
    stack.publish(_ended(message="All disks below 70 %.\n" + "\n".join(f"l{i}" for i in range(40))))

    wait_for(lambda: len(receiver.received) == 2, DEADLINE, "both channels to be told")
    (slack,) = receiver.at("/slack/")
    (hook,) = receiver.at("/hook/pager")
    assert (slack.status, hook.status) == (200, 200)  # the hook's own check of the signature
    assert verify_signature(SECRET, hook.headers, hook.body)
    assert not verify_signature(OTHER_SECRET, hook.headers, hook.body)
    assert hook.headers["x-ongrid-event"] == "spawn.finished"
    payload = hook.json
    assert payload["version"] == 1 and payload["event"] == "spawn.finished"
    assert payload["id"] == hook.key == hook.headers["x-ongrid-delivery"]
    assert payload["spawn"] | {"id": "sp1"} == payload["spawn"]
    assert (payload["spawn"]["persona"], payload["spawn"]["status"]) == ("disk_specialist", "ok")
    assert payload["link"] == "https://ongrid.example.com/spawns/sp1"
    assert payload["text"].startswith("All disks below 70 %.\nl0") and payload["text"].endswith(
        "…"
    )  # the first lines only: the console has the rest

    message = slack.json
    assert "disk_specialist" in message["text"]
    (button,) = message["blocks"][-1]["elements"]
    assert button["url"] == "https://ongrid.example.com/spawns/sp1"
    sections = json.dumps(message["blocks"])
    assert "All disks below 70 %." in sections

    rows = stack.store.list()
    assert {(r.channel, r.status, r.attempts, r.last_status) for r in rows} == {
        ("oncall", "sent", 1, 200),
        ("pager", "sent", 1, 200),
    }


def test_an_approval_request_names_the_call_who_may_decide_and_links_to_its_card(
    receiver: Receiver, database: Database, stacks: list[Stack]
):
    stack = _stack(stacks, _settings(receiver), database)
    stack.publish(_request())

    wait_for(lambda: len(receiver.received) == 2, DEADLINE, "both channels to be told")
    (hook,) = receiver.at("/hook/pager")
    approval = hook.json["approval"]
    assert approval["tool"] == "restart_thing" and approval["tool_class"] == "write"
    assert approval["arguments"] == '{"thing": "exporter <!channel>"}'
    # Who may decide: alice's approvers whose role may approve (victor is a viewer).
    assert approval["may_decide"] == ["alice", "carol"]
    assert hook.json["link"] == "https://ongrid.example.com/approvals/sp2/call-1"
    (slack,) = receiver.at("/slack/")
    blocks = json.dumps(slack.json["blocks"])
    assert "restart_thing" in blocks and "write class" in blocks and "alice, carol" in blocks
    # Model text is escaped: it cannot mention a channel nor disguise a link.
    assert "<!channel>" not in blocks and "&lt;!channel&gt;" in blocks


def test_rules_choose_by_event_persona_owner_and_background(
    receiver: Receiver, database: Database, stacks: list[Stack]
):
    rules = [
        RoutingRule(events=["spawn.finished"], channels=["oncall"], personas=["disk_*"]),
        RoutingRule(events=["spawn.failed"], channels=["pager"], users=["bob"]),
        RoutingRule(events=["budget.reached"], channels=["pager"], background_only=False),
    ]
    stack = _stack(stacks, _settings(receiver, rules=rules), database)
    stack.publish(_ended("a", persona="disk_specialist"))  # oncall
    stack.publish(_ended("b", persona="change_reviewer"))  # no rule
    stack.publish(_ended("c", status="failed", message="boom"))  # alice's, not bob's: none
    stack.publish(_ended("d", persona="disk_specialist", background=False))  # watched live
    stack.publish(_ended("e", background=False, budget_reached="cost"))  # pager (all spawns)
    stack.publish(_ended("f", persona="disk_specialist", parent_spawn_id="coord"))  # a child
    stack.publish(_ended("g", persona="disk_specialist", status="cancelled"))  # asked for
    stack.publish(_ended("h", persona="other", notify=["pager", "unknown"]))  # its own channel
    stack.publish(_ended("z", persona="disk_specialist"))  # the last: all before are taken in

    wait_for(lambda: receiver.at("/slack/") and len(receiver.at("/slack/")) == 2, DEADLINE, "z")
    wait_for(lambda: len(receiver.at("/hook/")) == 2, DEADLINE, "the webhook's two")
    told = sorted((r.channel, r.spawn_id, r.kind) for r in stack.store.list())
    assert told == [
        ("oncall", "a", "spawn.finished"),
        ("oncall", "z", "spawn.finished"),
        ("pager", "e", "budget.reached"),
        ("pager", "h", "spawn.finished"),
    ]


def test_a_decision_and_an_expiry_reach_the_channels_their_rules_name(
    receiver: Receiver, database: Database, stacks: list[Stack]
):
    rules = [
        RoutingRule(events=["approval.decided"], channels=["oncall"]),
        RoutingRule(events=["approval.expired"], channels=["pager"]),
    ]
    stack = _stack(stacks, _settings(receiver, rules=rules), database)
    for call_id, decision, by in (("c1", "approved", "carol"), ("c2", "expired", "")):
        stack.publish(
            ApprovalDecided(
                session_id="se1",
                spawn_id="sp3",
                call_id=call_id,
                name="restart_thing",
                args_hash="h",
                decision=decision,  # type: ignore[arg-type]
                by=by,
                owner="alice",
                approved_by=[by] if by else [],
            )
        )

    wait_for(lambda: len(receiver.received) == 2, DEADLINE, "the decision and the expiry")
    (slack,) = receiver.at("/slack/")
    assert "Approval decided" in slack.json["text"] and "approved by carol" in str(slack.json)
    (hook,) = receiver.at("/hook/pager")
    assert hook.json["event"] == "approval.expired"
    assert hook.json["approval"] | {"decision": "expired", "call_id": "c2"} == hook.json["approval"]
    assert hook.json["link"] == "https://ongrid.example.com/approvals/sp3/c2"


# -- delivery that loses nothing and blocks nothing ---------------------------------------------


def test_a_receiver_that_fails_twice_gets_it_once_with_one_key_after_retry_after(
    receiver: Receiver, database: Database, stacks: list[Stack]
):
    channels = {
        "flaky": ChannelConfig(type="webhook", url=f"{receiver.url}/flaky/2/flaky", secret=SECRET)
    }
    rules = [RoutingRule(events=["spawn.finished"], channels=["flaky"])]
    settings = _settings(receiver, channels=channels, rules=rules, retry_base_seconds=0.05)
    stack = _stack(stacks, settings, database)
    retried = _count("flaky", "retried")
    stack.publish(_ended())

    wait_for(lambda: stack.store.list(status="sent"), DEADLINE, "the third attempt to land")
    tries = receiver.at("/flaky/")
    assert [t.status for t in tries] == [503, 503, 200]
    assert len({t.key for t in tries}) == 1  # one idempotency key: the receiver keeps one
    assert len({t.body for t in tries}) == 1  # the same body every time
    (row,) = stack.store.list()
    assert (row.status, row.attempts, row.last_status, row.id) == ("sent", 3, 200, tries[0].key)
    assert _count("flaky", "retried") - retried == 2
    # Retry-After: 1 was honoured, not the 0.05 s backoff.
    gaps = [b.headers["x-ongrid-timestamp"] for b in tries]
    assert int(gaps[-1]) - int(gaps[0]) >= 1


def test_a_receiver_that_never_answers_is_bounded_recorded_and_slows_no_other(
    receiver: Receiver, database: Database, stacks: list[Stack]
):
    channels = {
        "dead": ChannelConfig(type="slack", url=f"{receiver.url}/silent/x", timeout_seconds=3),
        "oncall": ChannelConfig(type="slack", url=f"{receiver.url}/slack/T1"),
        "gone": ChannelConfig(type="webhook", url=f"{receiver.url}/refuse/x", secret=SECRET),
    }
    rules = [RoutingRule(events=["spawn.finished"], channels=["dead", "oncall", "gone"])]
    settings = _settings(receiver, channels=channels, rules=rules, max_attempts=1)
    stack = _stack(stacks, settings, database)
    stack.publish(_ended())

    wait_for(lambda: stack.store.list(channel="oncall", status="sent"), DEADLINE, "oncall")
    wait_for(lambda: stack.store.list(channel="gone", status="failed"), DEADLINE, "410")
    # The dead receiver's attempt is still running: it held nobody else up.
    (dead,) = stack.store.list(channel="dead")
    assert (dead.status, dead.attempts) == ("pending", 0)
    (gone,) = stack.store.list(channel="gone")
    assert (gone.attempts, gone.last_status) == (1, 410) and "HTTP 410" in gone.last_error

    wait_for(lambda: stack.store.list(channel="dead", status="failed"), DEADLINE, "the timeout")
    (dead,) = stack.store.list(channel="dead")
    assert dead.last_status is None
    assert dead.last_error == "no answer within 3 s (gave up after 1 attempts)"


def test_taking_in_twice_adds_nothing_and_a_new_sender_resumes_where_the_last_stopped(
    receiver: Receiver, database: Database, stacks: list[Stack]
):
    settings = _settings(receiver)
    first = _stack(stacks, settings, database)
    first.publish(_ended("a"))
    wait_for(lambda: len(first.store.list(status="sent")) == 2, DEADLINE, "a's two")
    first.sender.stop()  # resigns: the next one takes over at once

    first.publish(_ended("b"))  # while no sender runs
    # A second sender takes in from the stored position, and taking in again adds nothing.
    second = Stack(settings, database)
    stacks.append(second)
    assert second.sender.take_in("ends", second.ends) == 2
    assert second.sender.take_in("ends", second.ends) == 0
    second.sender.start()
    wait_for(lambda: len(second.store.list(status="sent")) == 4, DEADLINE, "b's two")
    assert sorted(r.spawn_id for r in second.store.list()) == ["a", "a", "b", "b"]
    assert len(receiver.received) == 4


def test_an_attempt_cut_by_the_senders_stop_is_made_again_with_the_same_key(
    receiver: Receiver, database: Database, stacks: list[Stack]
):
    hung = {
        "pager": ChannelConfig(type="slack", url=f"{receiver.url}/silent/p", timeout_seconds=60)
    }
    rules = [RoutingRule(events=["spawn.finished"], channels=["pager"])]
    first = _stack(stacks, _settings(receiver, channels=hung, rules=rules), database)
    first.publish(_ended())
    wait_for(lambda: receiver.at("/silent/"), DEADLINE, "the attempt to reach the receiver")
    first.sender.stop()  # as a process stopping: the attempt in flight is not waited for
    (row,) = first.store.list()
    assert (row.status, row.attempts) == ("pending", 0)

    # The next sender (the same cluster, the receiver back) sends it again: same key, same body.
    answering = {"pager": ChannelConfig(type="slack", url=f"{receiver.url}/slack/T1")}
    settings = _settings(receiver, channels=answering, rules=rules)
    second = Stack(settings.model_copy(update={"cluster": first.settings.cluster}), database)
    stacks.append(second)
    second.sender.start()
    wait_for(lambda: second.store.list(status="sent"), DEADLINE, "the second attempt")
    (cut,) = receiver.at("/silent/")
    (again,) = receiver.at("/slack/")
    assert again.key == cut.key == row.id and again.body == cut.body


def test_one_sender_of_two_holds_the_duty(
    receiver: Receiver, database: Database, stacks: list[Stack]
):
    settings = _settings(receiver)
    one = _stack(stacks, settings, database)
    two = Stack(settings, database)
    stacks.append(two)
    two.sender.start()
    one.publish(_ended("a"))
    wait_for(lambda: len(one.store.list(status="sent")) == 2, DEADLINE, "a's two")
    assert [one.sender.election.held, two.sender.election.held] == [True, False]
    assert len(receiver.received) == 2


def test_a_config_with_a_rule_to_an_unknown_channel_or_an_unsigned_webhook_is_refused():
    with pytest.raises(ValueError, match=r"rule 1 names unknown channel\(s\) pagr"):
        NotificationSettings(
            channels={"pager": {"type": "slack", "url": "http://h/x"}},  # type: ignore[dict-item]
            rules=[{"events": ["spawn.failed"], "channels": ["pagr"]}],  # type: ignore[list-item]
        )
    with pytest.raises(ValueError, match="needs a secret of at least 32 characters"):
        ChannelConfig(type="webhook", url="https://h/x", secret="short")
    with pytest.raises(ValueError, match="http:// or https://"):
        ChannelConfig(type="slack", url="file:///etc/passwd")
    with pytest.raises(ValueError, match="events"):
        RoutingRule(events=["spawn.exploded"], channels=["x"])  # type: ignore[list-item]
