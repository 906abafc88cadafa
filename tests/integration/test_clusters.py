"""Two stacks named by ``ONGRID_CLUSTER`` share one Redis database and never meet.

Each stack has its own real worker process (same queue names, same database); every key and
pub/sub channel either writes lives under its own ``ongrid:<cluster>:``, its spawns run on its
own worker only, a reload of one is not heard by the other, and a stack with no worker of its
own is told so even while the other stack's worker consumes the "same" queue.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from harness import Cluster, FakeLLM, call, final, wait_for

from registry.errors import UserError
from registry.settings import Settings
from workers.consumers import NoConsumer
from workers.fleet import read_fleet


@pytest.fixture
def stacks(tmp_path: Path, redis_db: str, fake: FakeLLM) -> Iterator[tuple[Cluster, Cluster]]:
    made = []
    for name in ("blue", "green"):
        root = tmp_path / name
        root.mkdir()
        made.append(Cluster(root, fake, redis_db, name=name))
    blue, green = made
    yield blue, green
    for stack in made:
        stack.close(False)


def test_two_named_stacks_on_one_database_keep_apart(stacks: tuple[Cluster, Cluster]) -> None:
    blue, green = stacks
    for stack in stacks:
        stack.persona("probe", tools=["count_probe"], body="# Probe")
    blue.fake.script([call("count_probe", {"target": "db1"}, turn=0), final("db1 is healthy")])
    green_worker = green.start_worker("green")

    # Green's worker consumes ongrid.interactive in this very database; blue has none of its own.
    with pytest.raises(NoConsumer, match="no worker consumes ongrid.interactive"):
        blue.client.spawn("probe", "How is db1?")

    blue_worker = blue.start_worker("blue")
    spawned = [
        (stack, stack.client.spawn("probe", f"How is db1 for {stack.root.name}?"))
        for stack in (blue, green, blue, green)
    ]
    for stack, record in spawned:
        done = stack.client.wait(record.spawn_id, timeout=60)
        assert done.status == "ok", done.error
    # Each stack's tool calls ran in its own worker process, and only there.
    assert blue.tool_pids() == [blue_worker.pid] * 2
    assert green.tool_pids() == [green_worker.pid] * 2

    # A reload of blue reaches blue's worker and not green's.
    before = {r.member: r.registry_version for r in read_fleet(green.redis, "ongrid:green:")}
    version = blue.client.reload()
    wait_for(
        lambda: all(r.registry_version == version for r in read_fleet(blue.redis, "ongrid:blue:")),
        30,
        "blue's worker to report the reload",
    )
    after = {r.member: r.registry_version for r in read_fleet(green.redis, "ongrid:green:")}
    assert after == before and len(after) == 1

    # Every key and channel in the shared database belongs to one of the two stacks, Celery's
    # queues, results and events included.
    client = redis.Redis.from_url(blue.redis_url)
    try:
        keys = {k.decode() for k in client.scan_iter()}
        channels = {c.decode() for c in client.pubsub_channels()}
    finally:
        client.close()
    # Channels are server-wide: those of this database name it (``db3:``, Celery's ``/3.``).
    database = blue.redis_url.rsplit("/", 1)[1]
    ours = {c for c in channels if f"db{database}:" in c or f"/{database}." in c}
    assert keys and ours
    strays = {k for k in keys | ours if not k.startswith(("ongrid:blue:", "ongrid:green:"))}
    assert strays == set()
    assert any(k.startswith("ongrid:blue:ongrid.") or "blue:_kombu" in k for k in keys)
    assert any(c.startswith("ongrid:green:db") for c in channels)


def test_a_cluster_name_that_is_not_one_is_refused() -> None:
    with pytest.raises(UserError, match="'Prod!' is not a cluster name"):
        Settings.load(environ={"ONGRID_CLUSTER": "Prod!"})
    assert Settings.load(environ={"ONGRID_CLUSTER": "prod-eu_1"}).key_prefix == "ongrid:prod-eu_1:"
    assert Settings.load(environ={}).key_prefix == "ongrid:"
