"""Tool calls that need people: the spawn parks as ``waiting`` and any worker resumes it after the
decision (SPEC §4: once per write call; two people for a destructive call)."""

from __future__ import annotations

from collections import Counter

import pytest
from harness import Cluster, call, final

from workers.spawns import Replayed

PROMPT = "Restart the stuck exporter on db1."


def _confirmations(cluster: Cluster, session_id: str) -> list:
    return [e for e in cluster.history(session_id) if e.type == "confirmation_required"]


def test_write_call_waits_for_one_approval_then_runs_once(cluster: Cluster):
    cluster.persona(
        "fixer", tools=["count_probe", "restart_thing"], permission_mode="mutating-with-confirm"
    )
    cluster.fake.script(
        [call("restart_thing", {"thing": "exporter"}, turn=0), final("Restarted.", turn=1)]
    )
    cluster.start_worker()

    record = cluster.client.spawn("fixer", PROMPT)
    waiting = cluster.client.wait(record.spawn_id, timeout=60)

    assert waiting.status == "waiting"
    (asked,) = _confirmations(cluster, record.session_id)
    assert (asked.call_id, asked.name, asked.confirmation) == ("call_0_0", "restart_thing", "once")
    assert cluster.tool_runs() == []
    tile = cluster.history(record.session_id)[0]
    assert {t["name"]: t["confirmation"] for t in tile.tools} == {
        "count_probe": "none",
        "restart_thing": "once",
    }

    cluster.client.decide(record.spawn_id, "call_0_0", "alice", True, asked.args_hash)
    done = cluster.client.wait(record.spawn_id, timeout=60)

    assert done.status == "ok", done.error
    assert done.result == "Restarted."
    assert cluster.tool_runs() == ["restart_thing"]
    assert len(_confirmations(cluster, record.session_id)) == 1
    events = cluster.history(record.session_id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert Counter(e.type for e in events)["task_notification"] == 1
    with pytest.raises(Replayed, match="alice already decided call 'call_0_0'"):
        cluster.client.decide(record.spawn_id, "call_0_0", "alice", True, asked.args_hash)


def test_destructive_call_needs_two_different_people(cluster: Cluster):
    cluster.persona("wiper", tools=["wipe_thing"], permission_mode="dual-sign-required")
    cluster.fake.script([call("wipe_thing", {"thing": "tmp"}, turn=0), final("Wiped.", turn=1)])
    cluster.start_worker()
    client = cluster.client

    record = client.spawn("wiper", "Wipe /tmp on db1.")
    assert client.wait(record.spawn_id, timeout=60).status == "waiting"
    (asked,) = _confirmations(cluster, record.session_id)
    assert asked.confirmation == "dual"

    client.decide(record.spawn_id, asked.call_id, "alice", True, asked.args_hash)
    with pytest.raises(Replayed):  # the same person twice is still one signature
        client.decide(record.spawn_id, asked.call_id, "alice", True, asked.args_hash)
    again = client.wait(record.spawn_id, timeout=60)
    assert again.status == "waiting", again.error
    assert cluster.tool_runs() == []
    client.decide(record.spawn_id, asked.call_id, "bob", True, asked.args_hash)
    done = client.wait(record.spawn_id, timeout=60)

    assert done.status == "ok", done.error
    assert cluster.tool_runs() == ["wipe_thing"]
    assert done.state.approvals[asked.call_id].approved_by == ["alice", "bob"]
    assert len(_confirmations(cluster, record.session_id)) == 1


def test_denied_call_is_reported_to_the_model_and_never_runs(cluster: Cluster):
    cluster.persona("fixer", tools=["restart_thing"], permission_mode="mutating-with-confirm")
    cluster.fake.script(
        [call("restart_thing", turn=0), final("Not restarted: the operator said no.", turn=1)]
    )
    cluster.start_worker()

    record = cluster.client.spawn("fixer", PROMPT)
    assert cluster.client.wait(record.spawn_id, timeout=60).status == "waiting"
    (asked,) = _confirmations(cluster, record.session_id)
    cluster.client.decide(record.spawn_id, "call_0_0", "carol", False, asked.args_hash)
    done = cluster.client.wait(record.spawn_id, timeout=60)

    assert done.status == "ok", done.error
    assert cluster.tool_runs() == []
    last = cluster.fake.requests_for(PROMPT)[-1]
    (result,) = [m for m in last["messages"] if m.get("tool_call_id") == "call_0_0"]
    assert "denied by carol" in result["content"]
    (event,) = [e for e in cluster.history(record.session_id) if e.type == "tool_result"]
    assert event.is_error and "denied by carol" in event.content
