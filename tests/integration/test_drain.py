"""A worker asked to stop (SIGTERM: Celery's warm shutdown) hands its spawns back instead of
holding the shutdown until they end.

A specialist's worker stopped inside a model call lets that call finish, keeps its reply in the
checkpoint and hands the spawn over; the next worker runs the tool call the reply asked for.

The coordinator's worker is stopped while the turn waits on a specialist whose model call the
fake LLM holds: the worker exits (within a liveness deadline; waiting for the specialist would
take as long as the held call, which never ends by itself), the turn is left checkpointed with its
dispatch pending and back on its queue, and a new coordinator worker resumes it by re-attaching to
the same specialist. The answer arrives once; no spawn and no event is repeated.
"""

from __future__ import annotations

import uuid
from collections import Counter

from faults import release
from harness import MODEL, Cluster, call, final, turn_of, wait_for

from coordinator.agent_tool import child_spawn_id
from coordinator.turns import start_turn
from workers.celery_app import QUEUES

QUESTION = "Why does the uplink of sw4 flap?"
TASK = "Find out why the uplink of sw4 flaps."
FINDING = "The optic of the sw4 uplink reports low receive power."
ANSWER = "The uplink of sw4 flaps: its optic reports low receive power."
COORDINATOR_MARK = "You are Ongrid's coordinator"
#: Liveness only: the stopped worker must be gone by then (a held call would keep it forever).
EXIT_DEADLINE = 30.0


def test_a_coordinator_worker_stopped_mid_turn_exits_and_the_turn_resumes_elsewhere(
    cluster: Cluster,
):
    cluster.persona("netdoc", body="# Net doctor")
    dispatch = {"name": "spawn_agent", "arguments": {"agent": "netdoc", "prompt": TASK}}
    cluster.fake.script(
        [
            {
                "where": "system",
                "match": "# Net doctor",
                "reply": {"content": FINDING},
                "hold": "s",
            },
            {
                "where": "system",
                "match": COORDINATOR_MARK,
                "turn": 0,
                "reply": {"tool_calls": [dispatch]},
            },
            {"where": "system", "match": COORDINATOR_MARK, "reply": {"content": ANSWER}},
        ]
    )
    env = {"ONGRID_COORDINATOR_MODEL": MODEL, "ONGRID_LEASE_SECONDS": "2"}
    cluster.start_worker("specialists", env=env)
    stopped = cluster.start_worker("coordinator-1", queues=QUEUES["coordinator"], env=env)
    session = uuid.uuid4().hex
    turn = start_turn(cluster.client, session_id=session, prompt=QUESTION, user="u", role="admin")
    child = child_spawn_id(turn.spawn_id, "call_0_0")
    cluster.fake.wait_requests(TASK, 1)  # the specialist's call is held: the coordinator waits

    stopped.proc.terminate()
    wait_for(lambda: not stopped.alive(), EXIT_DEADLINE, "the stopped worker to exit")

    assert stopped.proc.returncode == 0, stopped.log()
    handed = cluster.client.store.get(turn.spawn_id)
    assert handed.status == "queued" and not cluster.client.store.leased(turn.spawn_id)
    assert [c.name for c in handed.state.pending] == ["spawn_agent"]
    assert handed.state.started == ["call_0_0"]  # the dispatch stays pending, to run again
    assert cluster.client.store.get(child).status == "running"  # the specialist runs on

    cluster.start_worker("coordinator-2", queues=QUEUES["coordinator"], env=env)
    wait_for(
        lambda: cluster.client.store.get(turn.spawn_id).attempts == 2, 60, "the turn to resume"
    )
    release(cluster.fake, "s")
    done = cluster.wait_status(turn.spawn_id, "ok", "failed", "cancelled", timeout=60)

    assert done.status == "ok", done.error
    assert done.result == ANSWER
    assert (done.attempts, done.lost_attempts) == (2, 0)  # handed back, not lost
    assert len(cluster.fake.requests_for(TASK)) == 1  # one specialist, called once
    coordinator_turns = [
        turn_of(r)
        for r in cluster.fake.requests()
        if COORDINATOR_MARK in r["messages"][0]["content"]
    ]
    assert sorted(coordinator_turns) == [0, 1]  # no model call of the turn was paid twice
    spawns = {k.decode() for k in cluster.redis.scan_iter("ongrid:spawn:*")}
    assert spawns == {f"ongrid:spawn:{turn.spawn_id}", f"ongrid:spawn:{child}"}

    events = cluster.history(session)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    tiles = Counter((e.spawn_id, e.persona) for e in events if e.type == "agent_tile")
    assert tiles == {(turn.spawn_id, "coordinator"): 1, (child, "netdoc"): 1}
    notes = Counter((e.spawn_id, e.status) for e in events if e.type == "task_notification")
    assert notes == {(turn.spawn_id, "ok"): 1, (child, "ok"): 1}
    calls = Counter((e.type, e.call_id) for e in events if e.type in ("tool_call", "tool_result"))
    assert calls == {("tool_call", "call_0_0"): 1, ("tool_result", "call_0_0"): 1}
    (result,) = [e for e in events if e.type == "tool_result"]
    assert result.content == FINDING and not result.is_error
    assert events[-1].type == "task_notification" and events[-1].spawn_id == turn.spawn_id


def test_a_specialist_worker_stopped_mid_call_hands_the_spawn_over_at_the_next_checkpoint(
    cluster: Cluster,
):
    cluster.persona("prober", tools=["count_probe"])
    cluster.fake.script(
        [
            call("count_probe", {"target": "sw4"}, turn=0, hold="first-call"),
            final(FINDING, turn=1),
        ]
    )
    env = {"ONGRID_LEASE_SECONDS": "2"}
    stopped = cluster.start_worker("stopped", env=env)
    record = cluster.client.spawn("prober", TASK)
    cluster.fake.wait_requests(TASK, 1)  # the worker is inside its first model call

    stopped.proc.terminate()
    stopped.wait_log("Warm shutdown")  # it drains: the call in flight is let finish
    release(cluster.fake, "first-call")
    wait_for(lambda: not stopped.alive(), EXIT_DEADLINE, "the stopped worker to exit")

    assert stopped.proc.returncode == 0, stopped.log()
    handed = cluster.client.store.get(record.spawn_id)
    assert handed.status == "queued" and not cluster.client.store.leased(record.spawn_id)
    assert [c.name for c in handed.state.pending] == ["count_probe"]  # the reply was kept
    assert handed.state.started == [] and cluster.tool_runs() == []  # the call never began

    resumed = cluster.start_worker("resumed", env=env)
    done = cluster.wait_status(record.spawn_id, "ok", "failed", "cancelled", timeout=60)

    assert done.status == "ok", done.error
    assert done.result == FINDING
    assert (done.attempts, done.lost_attempts) == (2, 0)
    assert cluster.tool_runs() == ["count_probe"] and cluster.tool_pids() == [resumed.pid]
    turns = Counter(turn_of(r) for r in cluster.fake.requests_for(TASK))
    assert turns == {0: 1, 1: 1}  # the model call that was in flight is not paid again
    events = cluster.history(record.session_id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    kinds = Counter(e.type for e in events)
    assert kinds["agent_tile"] == kinds["task_notification"] == 1
    assert kinds["tool_call"] == kinds["tool_result"] == 1
