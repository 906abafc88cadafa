"""The multi-host harness itself: services answer only at ctl's address, workers on two hosts
consume, a persona made over the API runs on one of them, and a cut link silences a host."""

from __future__ import annotations

from typing import Any

import pytest
from services import COORDINATOR_QUEUE, POSTGRES_PORT, REDIS_PORT, Hosts, wait_for

from workers.consumers import live_consumers

pytestmark = pytest.mark.multihost(coordinator=True)

#: Every wait of these tests is bounded by this many seconds.
DEADLINE = 90.0
GENERAL_QUEUES = ("ongrid.interactive", "ongrid.background")


def _persona(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "description": f"Test persona {name}.",
        "when_to_use": f"When a test needs {name}.",
        "model": "openai/gpt-4o-mini",
        "body": f"# {name}\n\nAnswer briefly.\n",
    }


def test_redis_and_postgres_answer_at_ctl_only(hosts: Hosts):
    probe = (
        "import psycopg, redis\n"
        f"print(redis.Redis(host={hosts.ctl_addr!r}, port={REDIS_PORT}).ping())\n"
        f"with psycopg.connect(host={hosts.ctl_addr!r}, port={POSTGRES_PORT}, user='postgres',"
        " dbname='ongrid', connect_timeout=5) as conn:\n"
        "    print(conn.execute('SELECT 41 + 1').fetchone()[0])\n"
    )
    assert hosts.python("w1", probe).split() == ["True", "42"]

    for port in (REDIS_PORT, POSTGRES_PORT):
        assert hosts.connect("w1", "127.0.0.1", port) == "ECONNREFUSED"
        # Not on every interface of ctl either: only its address on the bridge.
        assert hosts.connect("ctl", "127.0.0.1", port) == "ECONNREFUSED"
        assert hosts.reachable("w2", hosts.ctl_addr, port)


def test_workers_on_both_hosts_consume_and_the_api_is_ready(hosts: Hosts):
    def both_hosts_consume() -> dict[str, list[str]] | None:
        found = live_consumers(hosts.redis, GENERAL_QUEUES)
        named = {q: {m.split("@")[0] for m in members} for q, members in found.items()}
        return found if all(names >= {"w1", "w2"} for names in named.values()) else None

    wait_for(both_hosts_consume, DEADLINE, "workers w1 and w2 to consume the general queues")

    assert hosts.api.get("/healthz").status_code == 200
    ready = hosts.api.get("/readyz")
    assert ready.status_code == 200, ready.text
    assert ready.json()["queues"][COORDINATOR_QUEUE]["consumers"] == 1


def test_a_persona_made_over_the_api_runs_on_a_worker_host(hosts: Hosts):
    prompt = "multihost smoke: say pong"
    hosts.fake.script([{"match": "multihost smoke", "reply": {"content": "pong over the wire"}}])
    created = hosts.api.post("/v1/agents/custom", json=_persona("mh-smoke"))
    assert created.status_code == 201, created.text

    with hosts.api.stream(
        "POST", "/api/v1/chat", json={"prompt": prompt, "agent": "mh-smoke"}
    ) as chat:
        assert chat.status_code == 200, chat.read()
        spawn_id = chat.headers["x-spawn-id"]
    # Leaving the stream ends only the stream: the spawn runs on.

    def finished() -> dict[str, Any] | None:
        spawn: dict[str, Any] = hosts.api.get(f"/api/v1/spawns/{spawn_id}").json()
        return spawn if spawn["status"] in ("ok", "failed", "cancelled") else None

    spawn = wait_for(finished, DEADLINE, f"spawn {spawn_id} to finish")
    assert spawn["status"] == "ok", spawn
    assert "pong over the wire" in str(spawn["result"])

    requests, peers = hosts.fake.requests(), hosts.fake.peers()
    assert len(requests) == len(peers)
    asked = [p for r, p in zip(requests, peers, strict=True) if prompt in str(r["messages"])]
    assert asked and set(asked) <= {hosts.addr("w1"), hosts.addr("w2")}, asked


def test_a_cut_host_cannot_reach_ctl_until_restored(hosts: Hosts):
    assert hosts.connect("w1", hosts.ctl_addr, REDIS_PORT) == "connected"
    hosts.cut("w1")
    try:
        # Dropped, not refused: the connect times out.
        assert hosts.connect("w1", hosts.ctl_addr, REDIS_PORT, timeout=3) == "timeout"
        assert hosts.reachable("w2", hosts.ctl_addr, REDIS_PORT)
    finally:
        hosts.restore("w1")
    wait_for(
        lambda: hosts.reachable("w1", hosts.ctl_addr, REDIS_PORT),
        DEADLINE,
        "w1 to reach ctl's Redis again",
        every=0.5,
    )
