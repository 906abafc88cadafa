"""``SpawnClient.wait`` on a real Redis (DB 5): it follows the session's events instead of polling,
and still returns, stops, times out and fails a stranded spawn as it always did.

The worker's side is played by the test with the same calls a worker makes: the notification
published under the spawn's dedup key, then the final record written.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import pytest
import redis
import redis_server

from registry.errors import NotFoundError, WorkerDraining
from registry.settings import Settings
from workers.client import SpawnClient, StrandedWatch
from workers.messages import ConfirmationRequired, TaskNotification, TextDelta
from workers.spawns import SpawnRecord

URL = redis_server.url(5)
#: How long a wait that should return may take before the test calls it stuck.
LIVENESS = 60.0


@pytest.fixture
def client(tmp_path: Path) -> Iterator[SpawnClient]:
    with redis.Redis.from_url(URL) as r:
        r.flushdb()
        spawns = SpawnClient(Settings(redis_url=URL, agents_dir=tmp_path))
        yield spawns
        spawns.redis.close()
        r.flushdb()


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4) as executor:
        yield executor


def running(
    client: SpawnClient, status: str = "running", queue: str = "", background: bool = False
) -> SpawnRecord:
    record = SpawnRecord(
        session_id="s1", persona="probe", prompt="p", status=status, queue=queue,  # type: ignore[arg-type]
        background=background,
    )  # fmt: skip
    return client.store.create(record)


def finish(
    client: SpawnClient,
    record: SpawnRecord,
    status: Literal["ok", "failed"] = "ok",
    pause: float = 0.0,
) -> None:
    """What a worker's last step does: announce the end, then write the final record."""
    note = TaskNotification(
        session_id=record.session_id, spawn_id=record.spawn_id, status=status, message="done"
    )
    client.bus.publish(note, dedup_key=f"spawn:{record.spawn_id}", dedup_index=1)
    time.sleep(pause)
    write(client, record, status)


def write(client: SpawnClient, record: SpawnRecord, status: str) -> None:
    saved = client.store.get(record.spawn_id)
    assert saved is not None
    saved.status = status  # type: ignore[assignment]
    saved.result = "done"
    client.store.save_unfenced(saved)


def waiting_on(pool: ThreadPoolExecutor, client: SpawnClient, spawn_id: str, **kw: Any) -> Future:
    """Start ``wait`` in a thread and return once it blocks reading the session's stream."""
    before = blocked_readers(client)
    started = pool.submit(client.wait, spawn_id, **kw)
    eventually(lambda: blocked_readers(client) > before or started.done(), "wait to listen")
    return started


def blocked_readers(client: SpawnClient) -> int:
    """Connections of this database blocked in XREAD (a wait following the event stream)."""
    db = client.redis.connection_pool.connection_kwargs.get("db", 0)
    clients: Any = client.redis.client_list()
    return sum(1 for c in clients if c.get("cmd") == "xread" and int(c.get("db", -1)) == db)


def eventually(condition: Callable[[], Any], what: str) -> None:
    deadline = time.monotonic() + LIVENESS
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


@pytest.mark.parametrize("status", ["ok", "failed", "cancelled", "waiting"])
def test_a_spawn_already_settled_is_returned_at_once(client: SpawnClient, status: str):
    record = running(client, status)

    assert client.wait(record.spawn_id, timeout=0).status == status


def test_an_unknown_spawn_is_not_found(client: SpawnClient):
    with pytest.raises(NotFoundError):
        client.wait("nope", timeout=1)


@pytest.mark.parametrize("status", ["ok", "failed"])
def test_the_notification_ends_the_wait(
    client: SpawnClient, pool: ThreadPoolExecutor, status: Literal["ok", "failed"]
):
    record = running(client)
    started = waiting_on(pool, client, record.spawn_id, timeout=LIVENESS)

    finish(client, record, status, pause=0.05)  # the record follows the event by a moment

    done = started.result(LIVENESS)
    assert (done.status, done.result) == (status, "done")


def test_a_confirmation_ends_the_wait_once_the_spawn_waits(
    client: SpawnClient, pool: ThreadPoolExecutor
):
    record = running(client)
    started = waiting_on(pool, client, record.spawn_id, timeout=LIVENESS)

    asks = ConfirmationRequired(
        session_id="s1",
        spawn_id=record.spawn_id,
        call_id="c1",
        name="restart",
        arguments="{}",
        confirmation="once",
    )
    client.bus.publish(asks, dedup_key=f"spawn:{record.spawn_id}", dedup_index=0)
    write(client, record, "waiting")

    assert started.result(LIVENESS).status == "waiting"


def test_a_notification_published_before_the_wait_began_is_not_missed(
    client: SpawnClient, pool: ThreadPoolExecutor
):
    record = running(client)
    note = TaskNotification(session_id="s1", spawn_id=record.spawn_id, status="ok")
    client.bus.publish(note, dedup_key=f"spawn:{record.spawn_id}", dedup_index=1)

    started = pool.submit(client.wait, record.spawn_id, timeout=LIVENESS)
    time.sleep(0.05)  # wait has read the record still running, after its notification
    write(client, record, "ok")

    assert started.result(LIVENESS).status == "ok"


def test_other_spawns_events_do_not_end_the_wait(client: SpawnClient, pool: ThreadPoolExecutor):
    record, other = running(client), running(client)
    started = waiting_on(pool, client, record.spawn_id, timeout=LIVENESS)

    finish(client, other)
    client.bus.publish(TextDelta(session_id="s1", spawn_id=record.spawn_id, text="still going"))
    assert not started.done()
    finish(client, record)

    assert started.result(LIVENESS).spawn_id == record.spawn_id


def test_a_final_record_without_its_event_is_seen_in_a_busy_session(
    client: SpawnClient, pool: ThreadPoolExecutor
):
    """The event may be lost (a dropped connection, a crash before it): the record is read again
    every few seconds even while the session's other spawns keep its stream busy."""
    record = running(client)
    chatter_stop = threading.Event()

    def chatter() -> None:
        while not chatter_stop.wait(0.02):
            client.bus.publish(TextDelta(session_id="s1", spawn_id="other", text="."))

    noise = pool.submit(chatter)
    try:
        started = waiting_on(pool, client, record.spawn_id, timeout=LIVENESS)
        write(client, record, "ok")  # no notification at all
        assert started.result(LIVENESS).status == "ok"
    finally:
        chatter_stop.set()
        noise.result(LIVENESS)


def test_stop_gives_up_with_worker_draining(client: SpawnClient, pool: ThreadPoolExecutor):
    record = running(client)
    stop = threading.Event()
    started = waiting_on(pool, client, record.spawn_id, stop=stop)

    stop.set()

    with pytest.raises(WorkerDraining, match=record.spawn_id):
        started.result(LIVENESS)


def test_a_spawn_still_running_at_the_timeout_raises(client: SpawnClient):
    record = running(client)

    with pytest.raises(TimeoutError, match="still running after 0.3s"):
        client.wait(record.spawn_id, timeout=0.3)


def test_a_stranded_spawn_is_announced_then_failed_after_the_limit(client: SpawnClient):
    client.settings = client.settings.model_copy(
        update={"stranded_grace_seconds": 0.5, "stranded_check_seconds": 0.2, "queue_wait_limit": 2}
    )
    record = running(client, "queued", queue="ongrid.nobody")  # no worker consumes it

    done = client.wait(record.spawn_id, timeout=LIVENESS, stranded=True)

    assert done.status == "failed"
    assert done.error.startswith("no worker consumes ongrid.nobody: start one with")
    assert "gave up after waiting 2 s (queue_wait_limit)" in done.error
    events = client.bus.history("s1")
    waiting = [e for e in events if e.type == "queue_waiting"]
    assert waiting and waiting[0].queue == "ongrid.nobody"  # told before it was failed
    assert "The spawn keeps its place and runs when a worker arrives" in waiting[0].message
    assert waiting[0].fails_in_seconds is not None and waiting[0].fails_in_seconds <= 1.5
    assert len(waiting) <= 2  # one notice a minute, whoever watches
    (note,) = [e for e in events if e.type == "task_notification"]
    assert note.spawn_id == record.spawn_id and note.status == "failed"
    assert events.index(waiting[0]) < events.index(note)


def test_a_background_spawn_is_announced_but_never_failed_for_waiting(client: SpawnClient):
    client.settings = client.settings.model_copy(
        update={"stranded_grace_seconds": 0.1, "queue_wait_limit": 0.2}
    )
    record = running(client, "queued", queue="ongrid.nobody", background=True)
    watch = StrandedWatch(client, [record.spawn_id])
    watch.check()
    time.sleep(0.3)
    assert watch.check() == []
    assert client.store.get(record.spawn_id).status == "queued"
    (notice,) = [e for e in client.bus.history("s1") if e.type == "queue_waiting"]
    assert notice.fails_in_seconds is None


def test_a_wait_does_not_count_as_someone_watching(client: SpawnClient, pool: ThreadPoolExecutor):
    """Workers stream replies only to sessions someone follows live; a coordinator waiting on
    its specialist only needs to know when it ends, and must not make it stream."""
    record = running(client)
    started = waiting_on(pool, client, record.spawn_id, timeout=LIVENESS)

    counts: Any = client.redis.pubsub_numsub(client.bus.keys("s1").channel)
    assert int(counts[0][1]) == 0
    finish(client, record)
    assert started.result(LIVENESS).status == "ok"
