"""Per-spawn budgets on real workers: each limit stops a spawn with its best partial answer.

Every limit comes from a different source: tool calls from the chat API's request body, tokens
from a persona's ``metadata.ongrid.budget``, cost from ``SpawnClient.spawn(budget=...)``, time
from the organisation's default in the workers' config file. The fake model answers the last
call (no tools, asked for a partial answer) with a summary of its own, which becomes the
spawn's result; the ``task_notification`` names the limit. A coordinator's budget covers the
specialist it dispatches: the child gets what the coordinator has left, and its tool calls
count in the coordinator's.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from harness import MODEL, Cluster, call, final
from test_context import Api

from coordinator.agent_tool import child_spawn_id
from coordinator.turns import start_turn
from registry.budget import Budget
from workers.messages import TaskNotification
from workers.spawns import SpawnRecord

#: Words of the request the runtime sends once a limit is reached (its last user message).
PARTIAL_MARK = "Write your best partial answer"
SUMMARY = "Partial: db1 answers its probes; db2 was not checked before the budget ran out."
COORDINATOR_MARK = "You are Ongrid's coordinator"


#: The organisation's budget when the config file sets none (``OrgBudget``): every limit a
#: request or persona leaves unset comes from here.
ORG = {
    "max_tokens": 5_000_000,
    "max_cost_usd": None,
    "max_seconds": 14_400.0,
    "max_tool_calls": 400,
}


def org(**limits: Any) -> Budget:
    """The organisation's default budget, tightened by ``limits``."""
    return Budget(**{**ORG, **limits})


def summary_rule(content: str = SUMMARY, **rule: Any) -> dict[str, Any]:
    """A fake rule that answers the request for a partial answer."""
    return final(content, match=PARTIAL_MARK, where="last_user", **rule)


def notification(cluster: Cluster, record: SpawnRecord) -> TaskNotification:
    (note,) = [
        e
        for e in cluster.history(record.session_id)
        if isinstance(e, TaskNotification) and e.spawn_id == record.spawn_id
    ]
    return note


def assert_stopped_at(cluster: Cluster, done: SpawnRecord, limit: str, summary: str) -> None:
    """``done`` ended ok with ``summary`` as its result, stopped by ``limit``, and its last
    model call was offered no tools and asked for the partial answer."""
    assert done.status == "ok", done.error
    assert done.result == summary
    assert done.budget.reached is not None and done.budget.reached.limit == limit
    note = notification(cluster, done)
    assert note.status == "ok" and note.budget_reached == limit
    assert note.message.startswith(f"Stopped: reached its {limit} budget (")
    assert note.message.endswith(f"Partial answer:\n\n{summary}")
    assert done.state is not None and done.state.messages[-1].content == summary
    (last,) = [
        r
        for r in cluster.fake.requests()
        if r["messages"][-1]["content"] == done.state.messages[-2].content
    ]
    assert not last.get("tools")
    assert PARTIAL_MARK in last["messages"][-1]["content"]
    assert f"reached its {limit} budget" in last["messages"][-1]["content"]


def sse_events(api: Api, body: dict[str, Any]) -> list[dict[str, Any]]:
    """POST a chat turn and read its stream to the end (the turn's task notification)."""
    with api.http.stream("POST", "/api/v1/chat", json=body, timeout=120) as response:
        assert response.status_code == 200, response.read()
        return [
            json.loads(line.removeprefix("data: "))
            for line in response.iter_lines()
            if line.startswith("data: ")
        ]


@pytest.fixture
def probe_api(cluster: Cluster) -> Iterator[Api]:
    """The API, once the ``probe`` persona is on disk (the API reads the registry at start)."""
    cluster.persona("probe", tools=["count_probe"], body="# Probe")
    server = Api(cluster)
    yield server
    server.close()


def test_the_tool_call_budget_of_a_chat_request_stops_the_spawn(cluster: Cluster, probe_api: Api):
    api = probe_api
    cluster.fake.script([summary_rule(), call("count_probe", {"target": "db1"})])
    cluster.start_worker()
    refused = api.http.post(
        "/api/v1/chat",
        json={"prompt": "Probe db1.", "agent": "probe", "budget": {"max_tool_calls": 0}},
    )
    assert refused.status_code == 422
    assert "budget.max_tool_calls" in refused.text

    events = sse_events(
        api, {"prompt": "Probe db1 and db2.", "agent": "probe", "budget": {"max_tool_calls": 2}}
    )

    note = events[-1]
    assert note["type"] == "task_notification" and note["budget_reached"] == "tool_calls"
    # The notification is published just before the final record is written: wait for it.
    done = cluster.wait_status(note["spawn_id"], "ok", "failed")
    assert done.budget.requested == Budget(max_tool_calls=2)
    assert done.budget.limits == org(max_tool_calls=2)
    assert_stopped_at(cluster, done, "tool_calls", SUMMARY)
    assert "(2 tool calls of max_tool_calls=2)" in note["message"]
    # Two calls ran; the model was not called a third time with tools.
    assert cluster.tool_runs() == ["count_probe", "count_probe"]
    assert done.budget.tool_calls == 2
    assert [bool(r.get("tools")) for r in cluster.fake.requests()] == [True, True, False]
    transcript = api.http.get(f"/api/v1/spawns/{done.spawn_id}").json()
    assert transcript["budget"]["limits"] == {**ORG, "max_tool_calls": 2}
    assert transcript["budget"]["tool_calls"] == 2
    assert transcript["budget"]["reached"]["limit"] == "tool_calls"


def test_the_token_budget_of_a_persona_stops_the_spawn(cluster: Cluster):
    cluster.persona(
        "probe",
        tools=["count_probe"],
        body="# Probe",
        metadata={"ongrid": {"budget": {"max_tokens": 1}}},
    )
    cluster.fake.script([summary_rule(), call("count_probe", {"target": "db1"})])
    cluster.start_worker()

    record = cluster.client.spawn("probe", "Probe db1.")
    done = cluster.client.wait(record.spawn_id, timeout=60)

    assert_stopped_at(cluster, done, "tokens", SUMMARY)
    assert done.budget.limits == org(max_tokens=1)
    # The first reply asked for a tool; by then the tokens were spent: it never ran.
    assert cluster.tool_runs() == []
    assert done.state is not None
    assert done.state.messages[-3].content.startswith("not run: the task reached its tokens")


def test_the_cost_budget_of_a_spawn_call_stops_the_spawn(cluster: Cluster):
    cluster.persona("probe", tools=["count_probe"], body="# Probe")
    cluster.fake.script([summary_rule(), call("count_probe", {"target": "db1"})])
    cluster.start_worker()

    record = cluster.client.spawn("probe", "Probe db1.", budget=Budget(max_cost_usd=1e-9))
    done = cluster.client.wait(record.spawn_id, timeout=60)

    assert_stopped_at(cluster, done, "cost", SUMMARY)
    assert notification(cluster, done).usage.cost > 0  # litellm prices gpt-4o-mini
    assert cluster.tool_runs() == []


def test_the_organisation_time_budget_cuts_off_a_slow_model_call(cluster: Cluster):
    config = cluster.root / "ongrid.yaml"
    config.write_text(yaml.safe_dump({"budget": {"max_seconds": 3}}), encoding="utf-8")
    cluster.persona("probe", tools=["count_probe"], body="# Probe")
    # Every call but the last answers after a minute: the first is still running at 3 s.
    slow = call("count_probe", {"target": "db1"}, delay=60)
    cluster.fake.script([summary_rule(), slow])
    cluster.start_worker(env={"ONGRID_CONFIG": str(config)})

    record = cluster.client.spawn("probe", "Probe db1.")
    done = cluster.client.wait(record.spawn_id, timeout=60)

    assert_stopped_at(cluster, done, "time", SUMMARY)
    # The config file's budget replaces the defaults key by key: the others stand.
    assert done.budget.limits == org(max_seconds=3)
    assert cluster.tool_runs() == []
    assert done.budget.reached is not None and done.budget.reached.spent >= 3


def test_a_coordinator_budget_covers_the_specialist_it_dispatches(cluster: Cluster):
    cluster.persona("netdoc", tools=["count_probe"], body="# Net doctor")
    dispatch = {"agent": "netdoc", "prompt": "Probe the uplinks.", "reason": "uplink flaps"}
    child_summary = "Partial: uplink 1 is stable; uplink 2 was not probed (tool-call budget)."
    answer = "Partial: netdoc found uplink 1 stable and ran out of budget before uplink 2."
    cluster.fake.script(
        [
            # The child asks for its partial answer after its two model calls, the coordinator
            # after its one: the number of assistant messages tells them apart.
            summary_rule(child_summary, turn=2),
            summary_rule(answer, turn=1),
            call("count_probe", {"target": "uplink"}, where="system", match="# Net doctor"),
            call("spawn_agent", dispatch, where="system", match=COORDINATOR_MARK, turn=0),
        ]
    )
    cluster.start_worker(
        "all",
        queues="ongrid.interactive,ongrid.background,ongrid.coordinator",
        env={"ONGRID_COORDINATOR_MODEL": MODEL},
    )

    turn = start_turn(
        cluster.client,
        session_id=uuid.uuid4().hex,
        prompt="Are the uplinks flapping?",
        user="alice",
        role="admin",
        budget=Budget(max_tool_calls=3),
    )
    done = cluster.client.wait(turn.spawn_id, timeout=90)

    assert_stopped_at(cluster, done, "tool_calls", answer)
    child = cluster.client.store.get(child_spawn_id(turn.spawn_id, "call_0_0"))
    assert child is not None
    # The dispatch was the coordinator's first tool call: two were left for the child, and
    # what was left of the organisation's tokens and seconds.
    inherited = child.budget.inherited
    assert inherited.max_tool_calls == 2 and inherited.max_cost_usd is None
    assert inherited.max_tokens is not None and 0 < inherited.max_tokens < ORG["max_tokens"]
    assert inherited.max_seconds is not None and 0 < inherited.max_seconds < ORG["max_seconds"]
    assert child.budget.limits == inherited
    assert_stopped_at(cluster, child, "tool_calls", child_summary)
    assert cluster.tool_runs() == ["count_probe", "count_probe"]
    # The child's spend counts in the coordinator's: its one call and the child's two.
    assert done.budget.tool_calls == 1 and done.budget.children.tool_calls == 2
    assert child.state is not None
    assert done.budget.children.tokens == child.state.usage.total_tokens > 0
    # The coordinator was told the child's answer is partial, and why.
    assert done.state is not None
    result = next(m for m in done.state.messages if m.role == "tool")
    assert result.content == (
        "netdoc stopped early: it reached its tool_calls budget (2 tool calls of "
        f"max_tool_calls=2). Its partial answer:\n\n{child_summary}"
    )
