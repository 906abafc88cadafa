"""A person is never left waiting on a queue nobody consumes.

Real worker processes advertise the queues they consume; the API (a real ``ongrid api``
process, over HTTP) and the CLI (``ongrid spawn`` as a subprocess) refuse a turn no worker would
pick up, with the queue and the command to run; ``/readyz`` lists each queue with its live
consumers; a spawn whose worker disappears after it was accepted ends failed, naming the queue,
on the session stream, and a worker that comes later does not run it.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import yaml
from harness import MODEL, Cluster, Proc, call, final, wait_for
from procs import ALL_QUEUES, api_client, free_port, ongrid, wait_consumers

from workers.client import StrandedWatch

TOKEN = "consumer-tests-admin-token-01"
#: Liveness deadline of one HTTP request or CLI run: only so that nothing hangs forever.
DEADLINE = 120.0
PROMPT = "Why is db1 slow?"


@dataclass
class Site:
    cluster: Cluster
    env: dict[str, str]

    def start(self, name: str, *args: str) -> Proc:
        proc = Proc(name, ongrid(*args), self.cluster.root, self.env, forked=True)
        self.cluster.workers.append(proc)  # type: ignore[arg-type]  # killed and logged on close
        return proc

    def worker(self, name: str, queues: str) -> Proc:
        proc = self.start(name, "worker", "-c", "4", f"--queues={queues}", f"--name={name}")
        wait_consumers(self.cluster.redis, tuple(queues.split(",")), proc)
        return proc

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ongrid(*args), cwd=self.cluster.root, env=self.env,
            capture_output=True, text=True, timeout=DEADLINE,
        )  # fmt: skip


@pytest.fixture
def site(cluster: Cluster) -> Site:
    config = cluster.root / "ongrid.yaml"
    config.write_text(
        yaml.safe_dump({"auth": {"tokens": {TOKEN: {"user": "alice", "role": "admin"}}}})
    )
    env = {
        **cluster.env,
        "ONGRID_CONFIG": str(config),
        "ONGRID_DATABASE_URL": f"sqlite:///{cluster.root / 'ongrid.db'}",
        "ONGRID_DEFAULT_MODEL": MODEL,
        # A dead worker stops counting as a consumer, and a spawn left on its queue is announced
        # and then failed, within seconds rather than the production 10 + 15 and 600.
        "ONGRID_PRESENCE_TTL_SECONDS": "4",
        "ONGRID_STRANDED_GRACE_SECONDS": "3",
        "ONGRID_QUEUE_WAIT_LIMIT": "4",
        "ONGRID_STRANDED_CHECK_SECONDS": "0.5",
    }
    cluster.persona("probe", body="# Probe")
    return Site(cluster, env)


@pytest.fixture
def api(site: Site) -> Iterator[httpx.Client]:
    port = free_port()
    proc = site.start("api", "api", f"--port={port}")
    client = api_client(proc, port, TOKEN, DEADLINE)
    yield client
    client.close()


def _ready(api: httpx.Client) -> httpx.Response:
    return api.get("/readyz")


def _chat(api: httpx.Client, **body: Any) -> tuple[httpx.Response, list[dict[str, Any]]]:
    """POST /api/v1/chat; the response and its SSE events (data of each)."""
    with api.stream("POST", "/api/v1/chat", json=body) as response:
        if response.status_code != 200:
            response.read()
            return response, []
        events = [
            json.loads(line[5:]) for line in response.iter_lines() if line.startswith("data:")
        ]
    return response, events


def test_a_turn_nobody_would_pick_up_is_refused_and_readyz_names_the_queue(
    site: Site, api: httpx.Client
):
    site.cluster.fake.script(
        [
            call("spawn_agent", {"agent": "probe", "prompt": "Probe db1."}, where="system",
                 match="spawn_agent", turn=0),
            final("Relayed.", where="system", match="spawn_agent"),
            final("db1 is fine."),
        ]
    )  # fmt: skip
    specialists = site.worker("specialists", "ongrid.interactive,ongrid.background")

    ready = _ready(api)
    assert ready.status_code == 503
    body = ready.json()
    assert body["status"] == "unavailable"
    assert {q: v["consumers"] for q, v in body["queues"].items()} == {
        "ongrid.interactive": 1,
        "ongrid.background": 1,
        "ongrid.coordinator": 0,
    }
    assert body["checks"]["ongrid.interactive"] == "ok"
    assert "no worker consumes ongrid.coordinator" in body["checks"]["ongrid.coordinator"]
    # An orchestrator whose workers scale to zero asks for Redis and the database only, or
    # for the queues it keeps served; the queues are listed either way.
    alive = api.get("/readyz", params={"queues": ""})
    assert (
        alive.status_code == 200 and alive.json()["queues"]["ongrid.coordinator"]["consumers"] == 0
    )
    assert api.get("/readyz", params={"queues": "ongrid.interactive"}).status_code == 200
    assert api.get("/readyz", params={"queues": "ongrid.coordinator"}).status_code == 503
    unknown = api.get("/readyz", params={"queues": "ongrid.nope"})
    assert unknown.status_code == 400 and "unknown queue(s) 'ongrid.nope'" in unknown.text

    refused, _ = _chat(api, prompt=PROMPT)  # no agent: a coordinator turn

    assert refused.status_code == 503
    error = refused.json()["error"]
    assert error["code"] == "no_consumer" and error["details"] == {"queue": "ongrid.coordinator"}
    assert "no worker consumes ongrid.coordinator" in error["message"]
    assert "`ongrid worker --queues ongrid.coordinator --name coordinator`" in error["message"]
    assert api.get("/api/v1/chat/sessions").json() == []  # a refused turn leaves nothing behind
    assert site.cluster.client.store.active() == []

    site.worker("coordinator", "ongrid.coordinator")
    ready = _ready(api)
    assert ready.status_code == 200, ready.text
    assert {q: v["consumers"] for q, v in ready.json()["queues"].items()} == dict.fromkeys(
        ALL_QUEUES, 1
    )
    response, events = _chat(api, prompt=PROMPT)
    assert response.status_code == 200
    assert events[-1]["type"] == "task_notification" and events[-1]["status"] == "ok"

    specialists.stop()  # a warm shutdown withdraws its queues at once
    response, events = _chat(api, prompt=PROMPT)

    # The coordinator is told, as the result of its dispatch, and reports it.
    (result,) = [e for e in events if e["type"] == "tool_result"]
    assert result["is_error"] and "no worker consumes ongrid.interactive" in result["content"]
    assert events[-1]["type"] == "task_notification" and events[-1]["message"] == "Relayed."
    assert _ready(api).status_code == 503


def test_ongrid_spawn_refuses_a_persona_whose_queue_nobody_consumes(site: Site):
    site.cluster.persona("investigator", background=True)
    site.worker("interactive", "ongrid.interactive")

    done = site.cli("spawn", "investigator", "--prompt", PROMPT, "--wait")

    assert done.returncode == 1
    assert "no worker consumes ongrid.background" in done.stderr
    assert "`ongrid worker --queues ongrid.background`" in done.stderr
    assert list(site.cluster.redis.scan_iter("ongrid:spawn:*")) == []  # nothing was enqueued


def test_a_queue_scaled_from_zero_takes_the_spawn_and_runs_it_when_a_worker_comes(site: Site):
    site.cluster.persona("investigator", background=True)
    site.cluster.fake.script([final("Investigated.")])
    site.worker("interactive", "ongrid.interactive")
    site.env["ONGRID_AUTOSCALED_QUEUES"] = "ongrid.background"

    # Accepted with nobody on the queue: an autoscaler starts the worker on the queue's length.
    done = site.cli("spawn", "investigator", "--prompt", PROMPT)
    assert done.returncode == 0, done.stderr
    (spawn_id,) = [
        k.decode().rsplit(":", 1)[1] for k in site.cluster.redis.scan_iter("ongrid:spawn:*")
    ]
    assert site.cluster.client.store.get(spawn_id).status == "queued"

    site.worker("scaled-up", "ongrid.background")
    assert site.cluster.wait_status(spawn_id, "ok", "failed").result == "Investigated."

    site.env["ONGRID_AUTOSCALED_QUEUES"] = "ongrid.nope"
    refused = site.cli("spawn", "investigator", "--prompt", PROMPT)
    assert refused.returncode == 1
    assert refused.stderr.startswith("Error: autoscaled_queues: unknown queue(s) ongrid.nope")
    assert "Traceback" not in refused.stderr


def test_ongrid_spawn_wait_ends_naming_the_queue_when_its_worker_dies(site: Site):
    site.cluster.fake.script([final("Too late.", delay=DEADLINE * 3)])  # the worker parks here
    worker = site.worker("doomed", "ongrid.interactive")
    waiting = subprocess.Popen(
        ongrid("spawn", "probe", "--prompt", PROMPT, "--wait"), cwd=site.cluster.root,
        env=site.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        site.cluster.fake.wait_requests(PROMPT, 1)
        worker.kill()  # no shutdown: its lease and its advertisement are left to expire
        out, err = waiting.communicate(timeout=DEADLINE)
    finally:
        waiting.kill()

    assert waiting.returncode == 1, out + err
    assert "■ probe: failed" in out
    assert "no worker consumes ongrid.interactive" in out
    (spawn_id,) = [
        k.decode().rsplit(":", 1)[1] for k in site.cluster.redis.scan_iter("ongrid:spawn:*")
    ]
    record = site.cluster.client.store.get(spawn_id)
    assert record is not None and record.status == "failed"
    assert record.error.startswith("no worker consumes ongrid.interactive: start one with")


def test_a_chat_whose_worker_dies_ends_with_the_queue_named(site: Site, api: httpx.Client):
    site.cluster.fake.script([final("Too late.", delay=DEADLINE * 3)])
    worker = site.worker("doomed", "ongrid.interactive")
    deadline = time.monotonic() + DEADLINE  # keepalives come every 15 s: checked at least then
    events: list[dict[str, Any]] = []
    with api.stream("POST", "/api/v1/chat", json={"prompt": PROMPT, "agent": "probe"}) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            assert time.monotonic() < deadline, f"stream still open: {[e['type'] for e in events]}"
            if not line.startswith("data:"):
                continue
            events.append(json.loads(line[5:]))
            if events[-1]["type"] == "agent_tile":  # running: now its worker goes
                site.cluster.fake.wait_requests(PROMPT, 1)
                worker.kill()

    note = events[-1]
    assert note["type"] == "task_notification" and note["status"] == "failed"
    assert note["message"].startswith("no worker consumes ongrid.interactive: start one with")
    session = response.headers["x-session-id"]
    messages = api.get(f"/api/v1/chat/sessions/{session}").json()["messages"]
    assert [m["role"] for m in messages] == ["user", "system"]
    assert "no worker consumes ongrid.interactive" in messages[1]["content"]


def test_a_spawn_stranded_in_a_queue_is_failed_and_a_later_worker_does_not_run_it(site: Site):
    client = site.cluster.client
    record = client.spawn("probe", PROMPT, require_consumer=False)  # scaled from zero, say
    watch = StrandedWatch(client, [record.spawn_id], grace=3.0, limit=3.0)

    (failed,) = wait_for(watch.check, DEADLINE, "the stranded spawn to be failed", every=0.2)

    assert failed.spawn_id == record.spawn_id and failed.status == "failed"
    assert failed.error.startswith("no worker consumes ongrid.interactive")
    (note,) = client.bus.history(record.session_id)
    assert note.type == "task_notification" and note.status == "failed"
    assert note.message == failed.error
    site.worker("late", "ongrid.interactive")
    redis = site.cluster.redis
    wait_for(
        lambda: redis.llen("ongrid.interactive") == 0 and redis.hlen("unacked") == 0,
        DEADLINE,
        "the late worker to take and acknowledge the message",
    )
    assert site.cluster.fake.requests_for(PROMPT) == []  # it found the spawn ended: no model call
    after = client.store.get(record.spawn_id)
    assert after is not None and (after.status, after.attempts) == ("failed", 0)


def test_a_coordinator_nobody_watches_is_told_when_its_specialists_worker_dies(site: Site):
    """No chat stream follows this turn: the AgentTool's own wait notices the stranded child."""
    from coordinator.turns import start_turn

    site.cluster.fake.script(
        [
            call("spawn_agent", {"agent": "probe", "prompt": "Probe db1."}, where="system",
                 match="spawn_agent", turn=0),
            final("Relayed.", where="system", match="spawn_agent"),
            final("Too late.", delay=DEADLINE * 3),  # the specialist's worker parks here
        ]
    )  # fmt: skip
    site.worker("coordinator", "ongrid.coordinator")
    doomed = site.worker("doomed", "ongrid.interactive")
    client = site.cluster.client
    turn = start_turn(client, session_id="stranded", prompt=PROMPT, user="alice", role="admin")
    site.cluster.fake.wait_requests("Probe db1.", 1)
    doomed.kill()  # no shutdown: its lease and its advertisement are left to expire

    done = client.wait(turn.spawn_id, timeout=DEADLINE)

    assert (done.status, done.result) == ("ok", "Relayed.")
    results = [e for e in client.bus.history(turn.session_id) if e.type == "tool_result"]
    (result,) = [e for e in results if e.spawn_id == turn.spawn_id]
    assert result.is_error and "no worker consumes ongrid.interactive" in result.content


def test_a_turn_started_without_its_stream_is_watched_by_the_sessions_events(
    site: Site, api: httpx.Client
):
    """Automation posts with `Prefer: respond-async` and follows the session's events: the
    worker lost after the 202 is reported there, naming the queue, as on a turn's own stream."""
    site.cluster.fake.script([final("Too late.", delay=DEADLINE * 3)])
    worker = site.worker("doomed", "ongrid.interactive")
    started = api.post(
        "/api/v1/chat",
        json={"prompt": PROMPT, "agent": "probe"},
        headers={"Prefer": "respond-async"},
    )
    assert started.status_code == 202, started.text
    site.cluster.fake.wait_requests(PROMPT, 1)
    worker.kill()  # no shutdown: its lease and its advertisement are left to expire

    deadline = time.monotonic() + DEADLINE  # keepalives come every 15 s: checked at least then
    events: list[dict[str, Any]] = []
    with api.stream("GET", started.json()["events"]) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            assert time.monotonic() < deadline, f"stream still open: {[e['type'] for e in events]}"
            if line.startswith("data:"):
                events.append(json.loads(line[5:]))
                if events[-1]["type"] == "task_notification":
                    break

    note = events[-1]
    assert note["spawn_id"] == started.json()["spawn_id"]
    assert note["status"] == "failed"
    assert note["message"].startswith("no worker consumes ongrid.interactive: start one with")
