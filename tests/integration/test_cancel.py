"""Cancelling a spawn. Cancellation is cooperative: the worker looks at the request at its next
checkpoint (after a model call returns, around each tool call), so a model call in flight runs
to its end first and nothing after it does."""

from __future__ import annotations

from harness import Cluster, call, final

PROMPT = "Trace the slow query on db1."


def test_cancel_takes_effect_when_the_current_model_call_returns(cluster: Cluster):
    cluster.persona("tracer", tools=["count_probe"])
    cluster.fake.script([call("count_probe", turn=0, delay=3), final("Traced.", turn=1)])
    cluster.start_worker()

    record = cluster.client.spawn("tracer", PROMPT)
    cluster.fake.wait_requests(PROMPT, 1)  # parked in the (3 s) model call
    cluster.client.cancel(record.spawn_id)
    done = cluster.wait_status(record.spawn_id, "ok", "failed", "cancelled")

    assert done.status == "cancelled"
    assert cluster.tool_runs() == []  # the call the model asked for was not run
    assert len(cluster.fake.requests_for(PROMPT)) == 1  # and no further model call was made
    events = cluster.history(record.session_id)
    assert [e.type for e in events if e.type != "text"] == [
        "agent_tile",
        "tool_call",
        "task_notification",
    ]
    assert events[-1].status == "cancelled"
    assert events[-1].usage.model_calls == 1  # the call that did run is accounted for


def test_cancel_of_a_spawn_that_is_not_running(cluster: Cluster):
    cluster.persona("fixer", tools=["restart_thing"], permission_mode="mutating-with-confirm")
    cluster.fake.script([call("restart_thing", turn=0), final("Restarted.", turn=1)])
    client = cluster.client
    # No worker yet, on purpose: the spawn waits in its queue for the one started below.
    queued = client.spawn("fixer", "Cancelled before any worker took it.", require_consumer=False)
    client.cancel(queued.spawn_id)  # no worker runs yet: it sits in the queue
    cluster.start_worker()

    assert cluster.wait_status(queued.spawn_id, "ok", "failed", "cancelled").status == "cancelled"
    assert cluster.fake.requests_for("Cancelled before") == []  # not one model call paid

    waiting = client.spawn("fixer", PROMPT)
    assert client.wait(waiting.spawn_id, timeout=60).status == "waiting"
    client.cancel(waiting.spawn_id)  # nobody runs it: a worker is woken up to end it

    assert cluster.wait_status(waiting.spawn_id, "ok", "failed", "cancelled").status == "cancelled"
    assert cluster.tool_runs() == []
    for record in (queued, waiting):
        note = cluster.history(record.session_id)[-1]
        assert note.type == "task_notification" and note.status == "cancelled", record.prompt
