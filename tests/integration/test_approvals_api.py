"""Every approval rule end to end, through the HTTP API of a real ``ongrid api`` process, with
real worker processes, Redis and a SQLite database; the model is the fake LLM.

People (tokens in the config file): alice (admin) owns the spawns; carol and erin (operators)
approve for her; bob is her approver too but a viewer, whose role may not approve; dave is an
operator who approves for nobody. The spawns call the site tools ``restart_thing`` (write: one
approval) and ``wipe_thing`` (destructive under ``dual-sign-required``: two people).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import yaml
from harness import MODEL, Cluster, Proc, call, final, wait_for
from procs import api_client, free_port, ongrid, wait_consumers

from workers.loop import approval_hash
from workers.messages import ToolCall

#: Liveness deadline of one request, stream or start: only so that nothing hangs forever.
DEADLINE = 120.0
TOKENS = {
    "alice": ("approvals-alice-admin-token", "admin"),
    "carol": ("approvals-carol-operator-token", "operator"),
    "erin": ("approvals-erin-operator-token", "operator"),
    "bob": ("approvals-bob-viewer-token-01", "viewer"),
    "dave": ("approvals-dave-operator-token", "operator"),
}
RESTART = "Restart the stuck exporter on db1."
WIPE = "Wipe /tmp on db1."
NIGHTLY = "Nightly: restart the backup agent on db2."
PROBE = "Is db3 healthy?"

Sse = dict[str, Any]


@dataclass
class Site:
    cluster: Cluster
    env: dict[str, str]
    clients: dict[str, httpx.Client] = field(default_factory=dict)

    def worker(self, name: str, *, slots: int = 4, ttl: float | None = None) -> Proc:
        """A plain ``ongrid worker`` of the specialists' queues, ready; ``ttl``: its approval
        requests expire after that many seconds."""
        env = {**self.env, **({"ONGRID_APPROVAL_TTL_SECONDS": str(ttl)} if ttl else {})}
        queues = "ongrid.interactive,ongrid.background"
        argv = ongrid("worker", "-c", str(slots), f"--queues={queues}", f"--name={name}")
        proc = Proc(name, argv, self.cluster.root, env, forked=True)
        self.cluster.workers.append(proc)  # type: ignore[arg-type]  # killed and logged on close
        wait_consumers(self.cluster.redis, tuple(queues.split(",")), proc)
        return proc

    def api(self, user: str) -> httpx.Client:
        return self.clients[user]


@pytest.fixture
def site(cluster: Cluster) -> Iterator[Site]:
    config = cluster.root / "ongrid.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "auth": {"tokens": {t: {"user": u, "role": r} for u, (t, r) in TOKENS.items()}},
                "approvers": {"alice": ["carol", "erin", "bob"]},
            }
        )
    )
    env = {
        **cluster.env,
        "ONGRID_CONFIG": str(config),
        "ONGRID_DATABASE_URL": f"sqlite:///{cluster.root / 'ongrid.db'}",
        "ONGRID_DEFAULT_MODEL": MODEL,
    }
    cluster.persona("fixer", tools=["restart_thing"], permission_mode="mutating-with-confirm")
    cluster.persona("wiper", tools=["wipe_thing"], permission_mode="dual-sign-required")
    cluster.persona(
        "nightly",
        tools=["restart_thing"],
        permission_mode="mutating-with-confirm",
        background=True,
    )
    cluster.persona("probe")
    cluster.fake.script(
        [
            call("restart_thing", {"thing": "exporter"}, match=RESTART, turn=0),
            final("Restarted.", match=RESTART, turn=1),
            call("wipe_thing", {"thing": "/tmp"}, match=WIPE, turn=0),
            final("Wiped.", match=WIPE, turn=1),
            call("restart_thing", {"thing": "backup-agent"}, match=NIGHTLY, turn=0),
            final("Backup agent restarted.", match=NIGHTLY, turn=1),
            final("db3 is healthy.", match=PROBE),
        ]
    )
    port = free_port()
    api = Proc("api", ongrid("api", f"--port={port}"), cluster.root, env, forked=True)
    cluster.workers.append(api)  # type: ignore[arg-type]
    made = Site(cluster, env)
    for user, (token, _role) in TOKENS.items():
        made.clients[user] = api_client(api, port, token, DEADLINE)
    yield made
    for client in made.clients.values():
        client.close()


# -- helpers -----------------------------------------------------------------------------------


def _sse(response: httpx.Response) -> Iterator[Sse]:
    """The SSE messages of a streaming response: ``{"id", "event", "data"}`` each."""
    fields: dict[str, str] = {}
    for line in response.iter_lines():
        if not line:
            if "data" in fields:
                data = json.loads(fields["data"])
                yield {"id": int(fields["id"]), "event": fields["event"], "data": data}
            fields = {}
        elif not line.startswith(":"):
            key, _, value = line.partition(":")
            fields[key] = value.removeprefix(" ")


def _park(site: Site, agent: str, prompt: str) -> tuple[str, Sse]:
    """Alice's chat turn with ``agent``, until its call is put to people; the spawn's id and
    the ``confirmation_required`` event, once the spawn shows as waiting."""
    alice = site.api("alice")
    with alice.stream("POST", "/api/v1/chat", json={"prompt": prompt, "agent": agent}) as chat:
        assert chat.status_code == 200, chat.read()
        spawn_id = chat.headers["x-spawn-id"]
        asked = next(e for e in _sse(chat) if e["event"] == "confirmation_required")
    # Leaving the stream ends only the stream: the spawn parks on its own.
    wait_for(lambda: _status(site, spawn_id) == "waiting", DEADLINE, f"{spawn_id} to wait")
    return spawn_id, asked["data"]


def _status(site: Site, spawn_id: str) -> str:
    return str(site.api("alice").get(f"/api/v1/spawns/{spawn_id}").json()["status"])


def _done(site: Site, spawn_id: str) -> dict[str, Any]:
    finished = ("ok", "failed", "cancelled")
    wait_for(lambda: _status(site, spawn_id) in finished, DEADLINE, f"{spawn_id} to finish")
    return site.api("alice").get(f"/api/v1/spawns/{spawn_id}").json()  # type: ignore[no-any-return]


def _decide(
    site: Site, user: str, spawn_id: str, asked: Sse, *, approve: bool = True, **override: Any
) -> httpx.Response:
    body = {"call_id": asked["call_id"], "args_hash": asked["args_hash"], "approve": approve}
    return site.api(user).post(f"/api/v1/spawns/{spawn_id}/decisions", json={**body, **override})


def _error(response: httpx.Response) -> dict[str, Any]:
    return response.json()["error"]  # type: ignore[no-any-return]


def _audit_rows(site: Site, spawn_id: str) -> list[dict[str, Any]]:
    """The spawn's audit rows (read as alice, an admin), oldest first."""
    rows = site.api("alice").get("/api/v1/audit/approvals", params={"spawn_id": spawn_id})
    assert rows.status_code == 200, rows.text
    return list(reversed(rows.json()))


def _audit(site: Site, spawn_id: str) -> list[tuple[str, str, str, str]]:
    """The spawn's audit rows, oldest first: (action, actor, role, args_hash)."""
    rows = _audit_rows(site, spawn_id)
    return [(r["action"], r["actor"], r["role"], r["args_hash"]) for r in rows]


def _redis_now(cluster: Cluster) -> float:
    seconds, micros = cluster.redis.time()
    return seconds + micros / 1_000_000


# -- the rules ---------------------------------------------------------------------------------


def test_an_approval_is_bound_to_its_hash_by_a_role_that_may_approve_and_taken_once(site: Site):
    site.worker("w1")
    spawn_id, asked = _park(site, "fixer", RESTART)

    call_seen = ToolCall(id=asked["call_id"], name=asked["name"], arguments=asked["arguments"])
    assert asked["args_hash"] == approval_hash(spawn_id, call_seen)
    assert asked["requested_by"] == {"user": "alice", "role": "admin", "persona": "fixer"}
    assert asked["expires_at"] == pytest.approx(asked["ts"] + 3600, abs=5)
    (pending,) = site.api("carol").get("/api/v1/approvals").json()
    assert (pending["spawn_id"], pending["args_hash"], pending["needed"]) == (
        spawn_id,
        asked["args_hash"],
        1,
    )
    assert pending["expires_at"] == asked["expires_at"] and pending["approved_by"] == []
    assert site.api("dave").get("/api/v1/approvals").json() == []

    viewer = _decide(site, "bob", spawn_id, asked)
    assert viewer.status_code == 403
    assert _error(viewer)["message"] == (
        "role 'viewer' may not approve (needs a role with approve: true)"
    )
    stranger = _decide(site, "dave", spawn_id, asked)
    assert stranger.status_code == 404 and "exporter" not in stranger.text
    other_args = call_seen.model_copy(update={"arguments": json.dumps({"thing": "database"})})
    for wrong in (approval_hash(spawn_id, other_args), "f" * 64):
        mismatch = _decide(site, "carol", spawn_id, asked, args_hash=wrong)
        assert mismatch.status_code == 409
        assert _error(mismatch)["code"] == "hash_mismatch"
        assert "binds it to exactly that call's tool and arguments" in _error(mismatch)["message"]
    assert site.cluster.tool_runs() == [] and _status(site, spawn_id) == "waiting"

    approved = _decide(site, "carol", spawn_id, asked)
    assert approved.status_code == 200, approved.text
    assert (approved.json()["settled"], approved.json()["status"]) == (True, "queued")
    assert approved.json()["message"] == "approved by carol: the spawn resumes"
    replayed = _decide(site, "carol", spawn_id, asked)
    assert replayed.status_code == 409 and _error(replayed)["code"] == "replayed"
    late = _decide(site, "erin", spawn_id, asked, approve=False)
    assert late.status_code == 409 and _error(late)["code"] == "already_decided"
    assert _error(late)["details"] == {"decision": "approved", "decided_by": ["carol"]}

    done = _done(site, spawn_id)
    assert (done["status"], done["result"]) == ("ok", "Restarted.")
    assert site.cluster.tool_runs() == ["restart_thing"]
    right = asked["args_hash"]
    assert _audit(site, spawn_id) == [
        ("requested", "alice", "admin", right),
        ("refused", "bob", "viewer", right),
        ("refused", "dave", "operator", right),
        ("refused", "carol", "operator", approval_hash(spawn_id, other_args)),
        ("refused", "carol", "operator", "f" * 64),
        ("approved", "carol", "operator", right),
        ("refused", "carol", "operator", right),
        ("refused", "erin", "operator", right),
    ]
    outcomes = [r["outcome"] for r in _audit_rows(site, spawn_id) if r["action"] == "refused"]
    assert [o.split(":", 1)[0] for o in outcomes] == [
        "forbidden",
        "not_found",
        "hash_mismatch",
        "hash_mismatch",
        "replayed",
        "already_decided",
    ]
    assert all(r["tool"] == "restart_thing" for r in _audit_rows(site, spawn_id))
    audit_by_operator = site.api("carol").get("/api/v1/audit/approvals")
    assert audit_by_operator.status_code == 403
    assert "may not audit" in _error(audit_by_operator)["message"]


def test_a_destructive_call_needs_two_different_signers_in_two_steps(site: Site):
    site.worker("w1")
    spawn_id, asked = _park(site, "wiper", WIPE)
    assert (asked["confirmation"], asked["needed"]) == ("dual", 2)

    first = _decide(site, "carol", spawn_id, asked)
    assert first.status_code == 200, first.text
    assert (first.json()["settled"], first.json()["status"]) == (False, "waiting")
    assert first.json()["message"] == (
        "approved by carol; 1 more approval from someone else is needed"
    )
    (pending,) = site.api("erin").get("/api/v1/approvals").json()
    assert (pending["approved_by"], pending["needed"]) == (["carol"], 2)
    twice = _decide(site, "carol", spawn_id, asked)
    assert twice.status_code == 409 and _error(twice)["code"] == "replayed"
    assert "1 more approval must come from someone else" in _error(twice)["message"]
    assert _status(site, spawn_id) == "waiting" and site.cluster.tool_runs() == []

    second = _decide(site, "erin", spawn_id, asked)
    assert second.status_code == 200, second.text
    assert (second.json()["settled"], second.json()["approved_by"]) == (True, ["carol", "erin"])
    done = _done(site, spawn_id)

    assert done["status"] == "ok" and site.cluster.tool_runs() == ["wipe_thing"]
    assert done["approvals"][asked["call_id"]]["approved_by"] == ["carol", "erin"]
    assert [(a, who) for a, who, _role, _hash in _audit(site, spawn_id)] == [
        ("requested", "alice"),
        ("approved", "carol"),
        ("refused", "carol"),
        ("approved", "erin"),
    ]


def test_an_undecided_request_expires_without_anyone_and_the_model_is_told(site: Site):
    worker = site.worker("w1", ttl=6)
    spawn_id, asked = _park(site, "fixer", RESTART)
    assert asked["expires_at"] == pytest.approx(asked["ts"] + 6, abs=2)
    worker.kill()  # no reaper runs now: nothing settles the request

    wait_for(
        lambda: _redis_now(site.cluster) > asked["expires_at"], DEADLINE, "the request's deadline"
    )
    too_late = _decide(site, "carol", spawn_id, asked)

    assert too_late.status_code == 409 and _error(too_late)["code"] == "expired"
    assert "expired at" in _error(too_late)["message"]
    assert _status(site, spawn_id) == "waiting"  # refused before any sweep

    site.worker("w2", ttl=6)  # its reaper, once elected, sweeps the deadline
    done = _done(site, spawn_id)

    assert done["status"] == "ok" and site.cluster.tool_runs() == []
    result = next(c for c in done["tool_calls"] if c["call_id"] == asked["call_id"])["result"]
    assert "the approval request expired undecided" in result and "was not run" in result
    events = site.api("carol").get("/api/v1/approvals/events", params={"until_idle": 1})
    decided = [e["data"] for e in _sse(events) if e["event"] == "approval_decided"]
    assert [(d["spawn_id"], d["decision"], d["by"]) for d in decided] == [(spawn_id, "expired", "")]
    assert [a for a, *_ in _audit(site, spawn_id)] == ["requested", "refused", "expired"]


def test_a_parked_spawn_holds_no_slot_and_resumes_after_every_worker_restarted(site: Site):
    first = site.worker("solo-1", slots=1)
    spawn_id, asked = _park(site, "fixer", RESTART)

    # The worker's one slot is free while the spawn waits: another turn runs to its end on it.
    body = {"prompt": PROBE, "agent": "probe"}
    with site.api("alice").stream("POST", "/api/v1/chat", json=body) as chat:
        events = list(_sse(chat))
    assert events[-1]["data"]["status"] == "ok", events[-1]
    assert not site.cluster.client.store.leased(spawn_id)
    first.kill()
    second = site.worker("solo-2", slots=1)  # every worker was replaced while it waited

    approved = _decide(site, "carol", spawn_id, asked)
    assert approved.status_code == 200, approved.text
    done = _done(site, spawn_id)

    assert (done["status"], done["result"]) == ("ok", "Restarted.")
    assert site.cluster.tool_runs() == ["restart_thing"]
    assert site.cluster.tool_pids() == [second.pid]


def test_a_background_spawns_request_reaches_its_session_and_the_approvers_streams(site: Site):
    site.worker("w1")
    feed: list[Sse] = []
    seen = threading.Event()

    def follow() -> None:  # carol's approvals stream, open before the spawn starts
        with site.api("carol").stream("GET", "/api/v1/approvals/events") as response:
            for event in _sse(response):
                feed.append(event)
                if event["event"] == "confirmation_required":
                    seen.set()
                    return

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    body = {"prompt": NIGHTLY, "agent": "nightly"}
    with site.api("alice").stream("POST", "/api/v1/chat", json=body) as chat:
        turn = list(_sse(chat))  # a background turn's stream ends with its tile
        session_id, spawn_id = chat.headers["x-session-id"], chat.headers["x-spawn-id"]
    assert [e["event"] for e in turn] == ["agent_tile"] and turn[0]["data"]["background"]

    assert seen.wait(DEADLINE), f"carol's stream got {feed}"
    reader.join(DEADLINE)
    (request,) = [e for e in feed if e["event"] == "confirmation_required"]
    assert (request["data"]["spawn_id"], request["data"]["session_id"]) == (spawn_id, session_id)
    events = site.api("alice").get(
        f"/api/v1/chat/sessions/{session_id}/events", params={"until_idle": 1}
    )
    asked = [e["data"] for e in _sse(events) if e["event"] == "confirmation_required"]
    assert [(a["spawn_id"], a["args_hash"]) for a in asked] == [
        (spawn_id, request["data"]["args_hash"])
    ]
    stranger = site.api("dave").get("/api/v1/approvals/events", params={"until_idle": 1})
    assert stranger.status_code == 200 and list(_sse(stranger)) == []
    viewer = site.api("bob").get("/api/v1/approvals/events", params={"until_idle": 1})
    assert viewer.status_code == 403

    wait_for(lambda: _status(site, spawn_id) == "waiting", DEADLINE, "the spawn to wait")
    assert _decide(site, "carol", spawn_id, request["data"]).status_code == 200
    resumed = site.api("erin").get(
        "/api/v1/approvals/events",
        params={"until_idle": 1},
        headers={"Last-Event-ID": str(request["id"])},
    )
    after = [(e["event"], e["data"]["decision"], e["data"]["by"]) for e in _sse(resumed)]
    assert after == [("approval_decided", "approved", "carol")]
    done = _done(site, spawn_id)
    assert (done["status"], done["result"]) == ("ok", "Backup agent restarted.")
    assert [a for a, *_ in _audit(site, spawn_id)] == ["requested", "approved"]
    # Its result reaches the session that started it, as its task_notification.
    events = site.api("alice").get(
        f"/api/v1/chat/sessions/{session_id}/events", params={"until_idle": 1}
    )
    (note,) = [e["data"] for e in _sse(events) if e["event"] == "task_notification"]
    assert (note["spawn_id"], note["message"]) == (spawn_id, "Backup agent restarted.")
