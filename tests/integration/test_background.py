"""Background personas: the caller does not block; the result arrives as a task_notification."""

from __future__ import annotations

from harness import Cluster, final

from workers.celery_app import QUEUES

ANSWER = "Root cause: /var on db1 filled up with core dumps."
PROMPT = "Why did db1 stop accepting writes?"


def test_background_spawn_returns_at_once_and_notifies_later(cluster: Cluster):
    cluster.persona("investigator", background=True)
    cluster.fake.script([final(ANSWER, delay=2)])
    worker = cluster.start_worker("bg", queues=QUEUES["background"])

    record = cluster.client.spawn("investigator", PROMPT)

    # Back at once: the model call (delayed 2 s at the fake) has not even returned yet.
    assert record.background and record.queue == "ongrid.background"
    assert cluster.client.store.get(record.spawn_id).status in ("queued", "running")
    assert all(e.type != "task_notification" for e in cluster.history(record.session_id))

    events = list(
        cluster.client.events(
            record.session_id, timeout=60, until=lambda e: e.type == "task_notification"
        )
    )
    note = events[-1]
    assert note.type == "task_notification", [e.type for e in events]
    assert (note.spawn_id, note.status, note.message) == (record.spawn_id, "ok", ANSWER)
    assert events[0].type == "agent_tile" and events[0].background is True
    # The notification is published before the final record is written (so a crash between
    # the two re-publishes rather than loses it): the record may trail by a moment.
    done = cluster.client.wait(record.spawn_id, timeout=30)
    assert done.status == "ok" and done.queue == QUEUES["background"]
    assert len(cluster.fake.requests_for(PROMPT)) == 1
    # The only worker consumes ongrid.background alone, and its log shows it ran this spawn.
    worker.wait_log(f"'spawn_id': '{record.spawn_id}'")
