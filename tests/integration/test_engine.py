"""The worker's engine against real Redis and a real worker process: the spawn time limit it
enforces itself, and the lease fence that stops an attempt whose lease another one took."""

from __future__ import annotations

import time

from harness import LEASE_SECONDS, Cluster, call, final

PROMPT = "Why does db1 answer slowly?"


def test_an_attempt_past_the_time_limit_is_failed_and_says_why(cluster: Cluster):
    cluster.persona("slowpoke")
    cluster.fake.script([final("Too late.", delay=60)])
    worker = cluster.start_worker(env={"ONGRID_SPAWN_TIME_LIMIT_SECONDS": "2"})

    record = cluster.client.spawn("slowpoke", PROMPT)
    done = cluster.wait_status(record.spawn_id, "ok", "failed", "cancelled", timeout=60)

    assert done.status == "failed"
    assert "time limit of 2 s (spawn_time_limit_seconds)" in done.error
    note = cluster.history(record.session_id)[-1]
    assert note.type == "task_notification" and note.status == "failed"
    assert "time limit" in note.message
    assert worker.alive  # the engine stopped the spawn, not the process
    assert not cluster.client.store.leased(record.spawn_id)


def test_an_attempt_whose_lease_was_taken_stops_at_once(cluster: Cluster):
    """Another attempt took the lease (as after a partition): the lease keeper finds it at its
    next renewal and the old attempt stops there, in the middle of its model call; neither the
    tool call that model call asks for nor any later event of the old attempt happens."""
    cluster.persona("prober", tools=["count_probe"])
    cluster.fake.script([call("count_probe", turn=0, delay=4 * LEASE_SECONDS), final("Done.")])
    worker = cluster.start_worker()
    client = cluster.client

    record = client.spawn("prober", PROMPT)
    cluster.fake.wait_requests(PROMPT, 1)  # the attempt waits on its (slow) model call
    events_before = len(cluster.history(record.session_id))
    cluster.redis.set(client.store.lease_key(record.spawn_id), "another-attempt")

    worker.wait_log("lease lost; stopped this attempt", timeout=10 * LEASE_SECONDS)
    time.sleep(LEASE_SECONDS)  # would the old attempt go on, it would do so now
    assert cluster.tool_runs() == []
    assert len(cluster.history(record.session_id)) == events_before
    saved = client.store.get(record.spawn_id)
    assert saved is not None and saved.status == "running" and saved.state is not None
    assert saved.state.turns == 0  # the old attempt's reply was never checkpointed
    # The lease the "other attempt" holds is untouched.
    assert cluster.redis.get(client.store.lease_key(record.spawn_id)) == b"another-attempt"
    assert worker.alive
