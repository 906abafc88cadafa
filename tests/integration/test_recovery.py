"""Workers die mid-spawn (SIGKILL: no shutdown, no acks): the spawn resumes on another worker from
its last checkpoint, and a spawn that kills every worker running it is failed, not retried forever.

Recovery goes through the spawn lease: the dead worker's lease expires (``LEASE_SECONDS``) and a
live worker's reaper enqueues the spawn again.
"""

from __future__ import annotations

import signal
import time
from collections import Counter

from harness import Cluster, Worker, call, final, text_of, turn_of, wait_for

from workers.runtime import MAX_ATTEMPTS

PROMPT = "Why does the uplink of sw1 flap?"
ANSWER = "The uplink flaps because its optic reports low receive power."


def test_spawn_of_a_killed_worker_resumes_elsewhere_without_repeating_work(cluster: Cluster):
    cluster.persona("probe", tools=["count_probe"])
    cluster.fake.script(
        [
            call("count_probe", {"target": "sw1"}, turn=0),
            final(ANSWER, turn=1, delay=30),  # the worker parks in this model call
        ]
    )
    workers = [cluster.start_worker("a", ready=False), cluster.start_worker("b", ready=False)]
    for worker in workers:
        worker.wait_ready()

    record = cluster.client.spawn("probe", PROMPT)
    wait_for(lambda: cluster.tool_runs() == ["count_probe"], 60, "the probe to run")
    cluster.fake.wait_requests(PROMPT, 2)  # turn 1 is in flight at the fake
    (holder,) = [w for w in workers if w.pid == cluster.tool_pids()[0]]
    (survivor,) = [w for w in workers if w is not holder]
    holder.kill()
    cluster.fake.script([final(ANSWER, turn=1)])  # the resumed call answers at once

    done = cluster.wait_status(record.spawn_id, "ok", "failed", "cancelled", timeout=90)

    assert done.status == "ok", done.error
    assert done.result == ANSWER
    assert done.attempts == 2
    assert cluster.tool_runs() == ["count_probe"]  # the completed call was not run again
    turns = Counter(turn_of(r) for r in cluster.fake.requests_for(PROMPT))
    assert turns == {0: 1, 1: 2}  # the finished model call was not paid again
    survivor.wait_log(f"'spawn_id': '{record.spawn_id}', 'persona': 'probe', 'status': 'ok'")

    events = cluster.history(record.session_id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    kinds = Counter(e.type for e in events)
    assert (kinds["agent_tile"], kinds["task_notification"]) == (1, 1)
    assert Counter(e.call_id for e in events if e.type == "tool_call") == {"call_0_0": 1}
    assert Counter(e.call_id for e in events if e.type == "tool_result") == {"call_0_0": 1}
    assert text_of(events) == ANSWER
    assert events[-1].type == "task_notification" and events[-1].status == "ok"


def test_poison_spawn_that_kills_every_worker_is_failed_after_max_attempts(cluster: Cluster):
    cluster.persona("poison", tools=["crash_worker"])
    cluster.fake.script([call("crash_worker")])  # every turn: a new call, a new dead worker
    live = [cluster.start_worker("p0", ready=False), cluster.start_worker("p1", ready=False)]
    for worker in live:
        worker.wait_ready()

    record = cluster.client.spawn("poison", PROMPT)
    dead: list[Worker] = []
    deadline = time.monotonic() + 180
    while not (done := cluster.client.store.get(record.spawn_id)).finished:
        assert time.monotonic() < deadline, f"spawn still {done.status} after {len(dead)} deaths"
        for worker in [w for w in live if not w.alive()]:  # the supervisor: replace the dead
            live.remove(worker)
            dead.append(worker)
            live.append(cluster.start_worker(f"p{len(dead) + 1}", ready=False))
        time.sleep(0.1)

    assert done.status == "failed"
    assert f"stopped after {MAX_ATTEMPTS} attempts" in done.error
    assert [w.proc.returncode for w in dead] == [-signal.SIGKILL] * MAX_ATTEMPTS
    assert sorted(cluster.tool_pids()) == sorted(w.pid for w in dead)  # each ran one call
    assert cluster.tool_runs() == ["crash_worker"] * MAX_ATTEMPTS
    requests = cluster.fake.requests_for(PROMPT)
    assert [turn_of(r) for r in requests] == list(range(MAX_ATTEMPTS))
    for turn, request in enumerate(requests[1:], start=1):
        # The call that killed the previous worker is reported as interrupted, never re-run.
        (result,) = [
            m for m in request["messages"] if m.get("tool_call_id") == f"call_{turn - 1}_0"
        ]
        assert result["content"].startswith("interrupted"), result
    note = cluster.history(record.session_id)[-1]
    assert note.type == "task_notification" and note.status == "failed"
    assert f"{MAX_ATTEMPTS} attempts" in note.message
