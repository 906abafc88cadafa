"""Registry reload across worker processes (SPEC §3, §7): a broadcast reaches every live worker, a
worker that was down catches up from the versioned state, and a spawn in flight keeps the persona
version it started with."""

from __future__ import annotations

import uuid

from harness import RELOAD_LINE, Cluster, call, final, system_of, wait_for

from workers.client import enqueue
from workers.spawns import SpawnRecord


def _body(version: str) -> str:
    return f"# Reviewer\n\nReview the change. Playbook {version}."


def _spawn_on(cluster: Cluster, queue: str, prompt: str) -> SpawnRecord:
    """A spawn of ``reviewer`` sent to ``queue``, so the test picks the worker that runs it."""
    record = SpawnRecord(session_id=uuid.uuid4().hex, persona="reviewer", prompt=prompt)
    record.queue = queue
    cluster.client.store.create(record)
    enqueue(cluster.settings, record)
    return record


def _system_prompts(cluster: Cluster, record: SpawnRecord) -> list[str]:
    done = cluster.client.wait(record.spawn_id, timeout=60)
    assert done.status == "ok", done.error
    return [system_of(r) for r in cluster.fake.requests_for(record.prompt)]


def test_reload_reaches_every_worker_and_one_that_was_down_catches_up(cluster: Cluster):
    cluster.persona("reviewer", body=_body("v1"))
    cluster.fake.script([final("Reviewed.")])
    a = cluster.start_worker("a", queues="qa", ready=False)
    b = cluster.start_worker("b", queues="qb", ready=False)
    a.wait_ready()
    b.wait_ready()

    cluster.persona("reviewer", body=_body("v2"))
    version = cluster.client.reload()
    for worker in (a, b):
        worker.wait_log(f"{RELOAD_LINE} {version}")
    for queue, worker in (("qa", a), ("qb", b)):
        record = _spawn_on(cluster, queue, f"Review on {queue}, round 2")
        (system,) = _system_prompts(cluster, record)
        assert "Playbook v2." in system, queue
        worker.wait_log(f"'spawn_id': '{record.spawn_id}'")  # ran where it was sent

    b.stop()  # a warm shutdown, as a rolling deploy does
    cluster.persona("reviewer", body=_body("v3"))
    version = cluster.client.reload()
    a.wait_log(f"{RELOAD_LINE} {version}")
    late = _spawn_on(cluster, "qb", "Review on qb, round 3")  # waits in qb while b is down
    cluster.start_worker("b", queues="qb")

    (system,) = _system_prompts(cluster, late)
    assert "Playbook v3." in system


def test_spawn_in_flight_keeps_the_persona_version_it_started_with(cluster: Cluster):
    cluster.persona("reviewer", body=_body("v1"), tools=["wait_gate"])
    gate = cluster.root / "gate"
    cluster.fake.script(
        [call("wait_gate", {"path": str(gate)}, turn=0), final("Reviewed.", turn=1)]
    )
    worker = cluster.start_worker("a", queues="qa")

    record = _spawn_on(cluster, "qa", "Review in flight, round 1")
    wait_for(lambda: cluster.tool_runs() == ["wait_gate"], 60, "the spawn to reach its tool")
    cluster.persona("reviewer", body=_body("v2"))  # edited and reloaded mid-spawn
    version = cluster.client.reload()
    worker.wait_log(f"{RELOAD_LINE} {version}")
    gate.touch()  # let the spawn go on to its second model call

    first, second = _system_prompts(cluster, record)
    assert "Playbook v1." in first and "Playbook v1." in second
    assert "Playbook v2." not in second
    pinned = cluster.client.store.get(record.spawn_id).persona_markdown
    assert "Playbook v1." in pinned

    fresh = _spawn_on(cluster, "qa", "Review after reload, round 2")  # the next spawn: new one
    fresh_system = _system_prompts(cluster, fresh)[0]
    assert "Playbook v2." in fresh_system
