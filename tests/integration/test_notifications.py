"""Notifications end to end: a real ``ongrid api`` process and a real worker, the fake LLM, and
webhook receivers on real sockets (``tests/receivers.py``): a Slack-compatible one and a signed
generic webhook, configured in the config file as the documentation shows.

A background spawn asks for an approval: the request reaches both channels with the call, who
may decide and the link to its card; carol approves in the API; the spawn's result reaches both
channels. The deliveries are listed for an admin, refused to an operator. A health check
scheduled through the API runs on a real ``ongrid beat`` and its result reaches the channel the
schedule names.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import httpx
import pytest
import yaml
from harness import MODEL, Cluster, Proc, call, final, wait_for
from procs import api_client, free_port, ongrid, wait_consumers
from receivers import Receiver, verify_signature

DEADLINE = 120.0
SECRET = "integration-secret-0123456789abcdef"
TOKENS = {
    "alice": ("notify-alice-admin-token-01", "admin"),
    "carol": ("notify-carol-operator-token", "operator"),
}
NIGHTLY = "Nightly: restart the backup agent on db2."
HEALTH = "Health check: is any filesystem close to full?"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver({"pager": SECRET, "reports": SECRET}) as made:
        yield made


def _site(cluster: Cluster, receiver: Receiver, *, beat: bool = False) -> dict[str, httpx.Client]:
    config = cluster.root / "ongrid.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "auth": {"tokens": {t: {"user": u, "role": r} for u, (t, r) in TOKENS.items()}},
                "approvers": {"alice": ["carol"]},
                "notifications": {
                    "console_url": "https://console.example.com",
                    "channels": {
                        "oncall": {"type": "slack", "url": f"{receiver.url}/slack/T1"},
                        "pager": {
                            "type": "webhook",
                            "url": f"{receiver.url}/hook/pager",
                            "secret": SECRET,
                        },
                        # No rule names it: only a schedule's own channels reach it.
                        "reports": {
                            "type": "webhook",
                            "url": f"{receiver.url}/hook/reports",
                            "secret": SECRET,
                        },
                    },
                    "rules": [
                        {
                            "events": ["approval.requested", "spawn.finished", "spawn.failed"],
                            "channels": ["oncall", "pager"],
                        }
                    ],
                },
            }
        )
    )
    env = {
        **cluster.env,
        "ONGRID_CONFIG": str(config),
        "ONGRID_DATABASE_URL": f"sqlite:///{cluster.root / 'ongrid.db'}",
        "ONGRID_DEFAULT_MODEL": MODEL,
    }
    cluster.persona(
        "nightly",
        tools=["restart_thing"],
        permission_mode="mutating-with-confirm",
        background=True,
    )
    cluster.persona("health")  # not a background persona: a scheduled run still is one
    cluster.fake.script(
        [
            call("restart_thing", {"thing": "backup-agent"}, match=NIGHTLY, turn=0),
            final("Backup agent restarted.\nNothing else needed.", match=NIGHTLY, turn=1),
            final("All filesystems below 80 %.", match=HEALTH),
        ]
    )
    queues = "ongrid.interactive,ongrid.background"
    worker = Proc(
        "w1", ongrid("worker", "-c", "4", f"--queues={queues}"), cluster.root, env, forked=True
    )
    cluster.workers.append(worker)  # type: ignore[arg-type]  # killed and logged on close
    wait_consumers(cluster.redis, tuple(queues.split(",")), worker)
    port = free_port()
    api = Proc("api", ongrid("api", f"--port={port}"), cluster.root, env, forked=True)
    cluster.workers.append(api)  # type: ignore[arg-type]
    if beat:
        beat_env = {**env, "ONGRID_SCHEDULE_POLL_SECONDS": "0.5"}
        argv = [sys.executable, "-m", "coordinator", "beat"]
        cluster.workers.append(Proc("beat", argv, cluster.root, beat_env, forked=True))  # type: ignore[arg-type]
    return {user: api_client(api, port, token, DEADLINE) for user, (token, _) in TOKENS.items()}


def test_an_approval_request_and_a_background_result_reach_slack_and_a_signed_webhook(
    cluster: Cluster, receiver: Receiver
):
    clients = _site(cluster, receiver)
    alice, carol = clients["alice"], clients["carol"]
    # The sender has taken its place in the feeds (it starts at their ends).
    wait_for(lambda: alice.get("/api/v1/notifications").status_code == 200, DEADLINE, "the API")
    accepted = alice.post(
        "/api/v1/chat",
        json={"prompt": NIGHTLY, "agent": "nightly"},
        headers={"Prefer": "respond-async"},
    )
    assert accepted.status_code == 202, accepted.text
    spawn_id = accepted.json()["spawn_id"]

    wait_for(lambda: len(receiver.received) == 2, DEADLINE, "the request on both channels")
    (hook,) = receiver.at("/hook/pager")
    assert hook.status == 200 and verify_signature(SECRET, hook.headers, hook.body)
    request = hook.json
    assert request["event"] == "approval.requested"
    approval = request["approval"]
    assert (approval["tool"], approval["tool_class"]) == ("restart_thing", "write")
    assert approval["may_decide"] == ["alice", "carol"]
    assert request["link"] == (
        f"https://console.example.com/approvals/{spawn_id}/{approval['call_id']}"
    )
    (slack,) = receiver.at("/slack/")
    assert slack.status == 200 and "Approval needed: nightly" in slack.json["text"]

    # Decided where people are: the link leads to the console, which needs a sign-in; the
    # decision itself is the API's, by someone who may approve.
    pending = carol.get("/api/v1/approvals").json()
    (waiting,) = [p for p in pending if p["spawn_id"] == spawn_id]
    decided = carol.post(
        f"/api/v1/spawns/{spawn_id}/decisions",
        json={"call_id": approval["call_id"], "args_hash": waiting["args_hash"], "approve": True},
    )
    assert decided.status_code == 200, decided.text

    wait_for(lambda: len(receiver.received) == 4, DEADLINE, "the result on both channels")
    finished = receiver.at("/hook/pager")[-1].json
    assert finished["event"] == "spawn.finished"
    assert finished["spawn"]["status"] == "ok" and finished["spawn"]["background"] is True
    assert finished["text"] == "Backup agent restarted.\nNothing else needed."
    assert finished["link"] == f"https://console.example.com/spawns/{spawn_id}"
    assert "Backup agent restarted." in str(receiver.at("/slack/")[-1].json["blocks"])

    listed = alice.get("/api/v1/notifications", params={"spawn_id": spawn_id})
    assert listed.status_code == 200, listed.text
    rows = sorted((r["kind"], r["channel"], r["status"], r["attempts"]) for r in listed.json())
    assert rows == [
        ("approval.requested", "oncall", "sent", 1),
        ("approval.requested", "pager", "sent", 1),
        ("spawn.finished", "oncall", "sent", 1),
        ("spawn.finished", "pager", "sent", 1),
    ]
    assert "body" not in listed.json()[0]
    assert carol.get("/api/v1/notifications").status_code == 403
    for client in clients.values():
        client.close()


def test_a_scheduled_health_checks_result_reaches_the_channel_its_schedule_names(
    cluster: Cluster, receiver: Receiver
):
    alice = _site(cluster, receiver, beat=True)["alice"]
    created = alice.post(
        "/api/v1/schedules",
        json={
            "name": "health",
            "persona": "health",
            "prompt": HEALTH,
            "interval_seconds": 2,
            "channels": ["reports"],
        },
    )
    assert created.status_code == 201, created.text

    wait_for(lambda: receiver.at("/hook/reports"), DEADLINE, "a run's result on its channel")
    report = receiver.at("/hook/reports")[0]
    runs = alice.get("/api/v1/schedules/health").json()["runs"]
    (run,) = [r for r in runs if r["spawn_id"] == report.json["spawn"]["id"]]
    assert (run["status"], run["spawn_status"]) == ("started", "ok")  # its result, on the list
    assert alice.delete("/api/v1/schedules/health").status_code == 204
    assert report.status == 200 and verify_signature(SECRET, report.headers, report.body)
    payload = report.json
    assert payload["event"] == "spawn.finished" and payload["text"] == "All filesystems below 80 %."
    assert payload["spawn"]["persona"] == "health" and payload["spawn"]["background"] is True
    runs = alice.get("/api/v1/schedules/health")
    assert runs.status_code == 404  # deleted; the spawn it started stays
    spawn = alice.get(f"/api/v1/spawns/{payload['spawn']['id']}").json()
    assert spawn["status"] == "ok" and spawn["background"] is True
