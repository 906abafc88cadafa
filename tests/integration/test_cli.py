"""``ongrid spawn`` as a subprocess against a running worker: JSON lines, exit status."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from harness import Cluster, call, final

ONGRID = str(Path(sys.executable).with_name("ongrid"))


def _ongrid(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ONGRID, *args],
        cwd=cluster.root,
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_spawn_command_prints_json_events_and_exits_by_status(cluster: Cluster):
    cluster.persona("incident", initial_prompt="Incident {{.incident_id}}.")
    cluster.persona("looper", tools=["count_probe"], max_turns=1)
    cluster.fake.script(
        [
            final("Incident 4217 is a full disk.", match="Incident 4217"),
            call("count_probe", match="Loop"),
        ]
    )
    cluster.start_worker()

    ok = _ongrid(
        cluster, "spawn", "incident", "--prompt", "What happened?", "--context",
        "incident_id=4217", "--json",
    )  # fmt: skip

    assert ok.returncode == 0, ok.stderr
    events = [json.loads(line) for line in ok.stdout.splitlines()]
    assert events[0]["type"] == "agent_tile" and events[0]["persona"] == "incident"
    assert events[-1]["type"] == "task_notification"
    assert events[-1]["status"] == "ok"
    assert events[-1]["message"] == "Incident 4217 is a full disk."
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))

    failed = _ongrid(cluster, "spawn", "looper", "--prompt", "Loop.", "--json")

    assert failed.returncode == 1, failed.stderr
    last = json.loads(failed.stdout.splitlines()[-1])
    assert last["type"] == "task_notification" and last["status"] == "failed"
    assert "max_turns=1" in last["message"]


def test_spawn_command_refuses_an_unknown_persona(cluster: Cluster):
    cluster.persona("incident")

    out = _ongrid(cluster, "spawn", "nope", "--prompt", "hi", "--json")

    assert out.returncode == 1
    assert "unknown agent 'nope'; known: generalist, incident" in out.stderr
    assert cluster.redis.keys("*") == []


def test_agents_reload_says_which_files_did_not_load(cluster: Cluster):
    cluster.persona("fine")
    (cluster.agents / "broken.md").write_text("no frontmatter here\n")

    done = _ongrid(cluster, "agents", "reload")

    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("registry reload broadcast (cluster registry version ")
    assert lines[1].endswith(" persona(s) loaded here, 1 warning(s)")
    assert lines[2].startswith("warning agents/broken.md: no frontmatter")


def test_each_spawn_task_carries_its_persona_as_display_name(cluster: Cluster):
    """Flower and the worker's log name a task by its ``shadow`` (Celery's display name): each
    spawn says which persona it runs, not ``ongrid.spawn`` for every one."""
    cluster.persona("namer")
    record = cluster.client.spawn("namer", "Say your name.", require_consumer=False)

    (raw,) = cluster.redis.lrange(record.queue, 0, -1)  # no worker: the message waits there
    headers = json.loads(raw)["headers"]
    assert (headers["task"], headers["shadow"]) == ("ongrid.spawn", "spawn namer")
    assert headers["argsrepr"] == repr([record.spawn_id, "namer"])
