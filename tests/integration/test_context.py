"""The context of a routed chat reaches the specialists the coordinator spawns.

``ongrid ask --context k=v`` (the CLI as a subprocess) posts a chat turn with a context and no
agent to the HTTP API (uvicorn in a thread); a real worker runs the coordinator and its
specialists, the model faked at its HTTP boundary. The coordinator's model dispatches one
specialist without any context and one with a context of its own: both start from the turn's
context, the model's keys win, and a key nobody gave renders ``<no value>`` and is recorded.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from harness import MODEL, Cluster, first_user, wait_for

from coordinator.agent_tool import child_spawn_id
from coordinator.api import create_app
from registry.settings import Settings, TokenGrant, token_digest

TOKEN = "alice-admin-token-for-context"
QUESTION = "Is the uplink of sw1 flapping, and the one of its peer?"
INITIAL = "You are investigating incident {{.incident_id}} on device {{.device_id}} ({{.ticket}})."
FIRST_TASK = "Check the uplink of the device."
SECOND_TASK = "Check the uplink of the peer device."
ANSWER = "Both uplinks are stable."
COORDINATOR_MARK = "You are Ongrid's coordinator"


def dispatch(prompt: str, **context: Any) -> dict[str, Any]:
    arguments: dict[str, Any] = {"agent": "netdoc", "prompt": prompt, "reason": "uplink flaps"}
    if context:
        arguments["context"] = context
    return {"name": "spawn_agent", "arguments": arguments}


class Api:
    """The API app under uvicorn in a thread, on the cluster's Redis and agents directory."""

    def __init__(self, cluster: Cluster) -> None:
        settings = Settings(
            agents_dir=cluster.agents,
            marketplace_root=cluster.root / "marketplace",
            redis_url=cluster.redis_url,
            database_url=f"sqlite:///{cluster.root / 'api.db'}",
            data_dir=cluster.root / ".ongrid-api",
            token_grants={token_digest(TOKEN): TokenGrant(user="alice", role="admin")},
        )
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.base_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        config = uvicorn.Config(
            create_app(settings), log_config=None, access_log=False, timeout_graceful_shutdown=2
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="api", daemon=True
        )
        self._thread.start()
        wait_for(lambda: self._server.started, 20, "the API server to start")
        self.http = httpx.Client(
            base_url=self.base_url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
        )

    def close(self) -> None:
        self.http.close()
        self._server.should_exit = True
        self._thread.join(timeout=15)


@pytest.fixture
def api(cluster: Cluster) -> Iterator[Api]:
    server = Api(cluster)
    yield server
    server.close()


def test_the_context_of_an_ask_reaches_every_specialist_of_the_turn(cluster: Cluster, api: Api):
    cluster.persona("netdoc", body="# Net doctor", initial_prompt=INITIAL)
    second = dispatch(SECOND_TASK, device_id="sw2", ticket="T-9")
    cluster.fake.script(
        [
            {"where": "system", "match": "# Net doctor", "reply": {"content": "Stable."}},
            {
                "where": "system",
                "match": COORDINATOR_MARK,
                "turn": 0,
                "reply": {"tool_calls": [dispatch(FIRST_TASK), second]},
            },
            {"where": "system", "match": COORDINATOR_MARK, "reply": {"content": ANSWER}},
        ]
    )
    cluster.start_worker(
        "all",
        queues="ongrid.interactive,ongrid.background,ongrid.coordinator",
        env={"ONGRID_COORDINATOR_MODEL": MODEL},
    )
    env = {**os.environ, "ONGRID_URL": api.base_url, "ONGRID_TOKEN": TOKEN}
    argv = [sys.executable, "-m", "coordinator", "ask", QUESTION, "--json"]
    argv += ["--context", "incident_id=INC-7", "--context", "device_id=sw1"]

    asked = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)

    assert asked.returncode == 0, asked.stderr
    events = [json.loads(line) for line in asked.stdout.splitlines()]
    assert events[-1]["type"] == "task_notification" and events[-1]["message"] == ANSWER
    tiles = [e for e in events if e["type"] == "agent_tile"]
    assert [t["persona"] for t in tiles] == ["coordinator", "netdoc", "netdoc"]
    coordinator = tiles[0]["spawn_id"]
    first, peer = (child_spawn_id(coordinator, f"call_0_{i}") for i in (0, 1))
    # The two dispatches run at the same time (spawn_agent only reads): tiles in either order.
    assert sorted(t["spawn_id"] for t in tiles[1:]) == sorted([first, peer])
    # The first dispatch passed no context: the turn's ids arrive all the same; nobody gave
    # the ticket, so it renders as Go renders a missing key, and the spawn says it was missing.
    missing = {t["spawn_id"]: t["missing_context"] for t in tiles}
    assert missing == {coordinator: [], first: ["ticket"], peer: []}
    (opening,) = {first_user(r) for r in cluster.fake.requests_for(FIRST_TASK)}
    assert opening == (
        f"You are investigating incident INC-7 on device sw1 (<no value>).\n\n{FIRST_TASK}"
    )
    # The second passed a device and a ticket: its keys win over the turn's, the rest stays.
    (opening,) = {first_user(r) for r in cluster.fake.requests_for(SECOND_TASK)}
    assert opening == f"You are investigating incident INC-7 on device sw2 (T-9).\n\n{SECOND_TASK}"

    transcripts = [api.http.get(f"/api/v1/spawns/{s}").json() for s in (coordinator, first, peer)]
    assert [t["context"] for t in transcripts] == [
        {"incident_id": "INC-7", "device_id": "sw1"},
        {"incident_id": "INC-7", "device_id": "sw1"},
        {"incident_id": "INC-7", "device_id": "sw2", "ticket": "T-9"},
    ]
    assert [t["missing_context"] for t in transcripts] == [[], ["ticket"], []]
    assert [t["status"] for t in transcripts] == ["ok", "ok", "ok"]
