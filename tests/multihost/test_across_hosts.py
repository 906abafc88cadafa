"""Across hosts: what the API makes on ctl reaches the workers of w1 and w2, which share no file
with it, and a worker cut off mid-spawn gives its spawns up to the other, fenced.

Real Redis, PostgreSQL and API on ctl, ``ongrid worker`` processes on w1 and w2 (network
namespaces, :mod:`netns`); the model is the fake OpenAI server on ctl, which records which host
sent each request and when it arrived. The tool the spawns call (:mod:`mh_tools`) writes into the
directory of the host that ran it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from services import LEASE_SECONDS, Hosts, wait_for

from workers.events import EventBus
from workers.messages import Event

pytestmark = pytest.mark.multihost(workers=False)

HERE = Path(__file__).resolve().parent
#: Every wait of these tests is bounded by this many seconds.
DEADLINE = 120.0
MODEL = "openai/gpt-4o-mini"


def _marks_file(hosts: Hosts, host: str) -> Path:
    return hosts.dir(host) / "marks.txt"


def _start(hosts: Hosts, host: str, concurrency: int) -> None:
    hosts.start_worker(
        host,
        host,
        env={
            "PYTHONPATH": str(HERE),
            "ONGRID_TOOL_MODULES": "mh_tools",
            "ONGRID_TEST_MARKS": str(_marks_file(hosts, host)),
        },
        concurrency=concurrency,
        ready=False,
    )


@pytest.fixture(scope="module")
def cluster(hosts: Hosts) -> Hosts:
    # w2 has room for every spawn w1 may lose, so a takeover never waits for a free slot.
    _start(hosts, "w1", 4)
    _start(hosts, "w2", 8)
    for worker in hosts.workers.values():
        worker.wait_ready()
    return hosts


def _persona(name: str, **fields: Any) -> dict[str, Any]:
    return {
        "name": name,
        "description": f"Test persona {name}.",
        "when_to_use": f"When a test needs {name}.",
        "model": MODEL,
        "tools": ["mark_step"],
        "max_turns": 30,
        "body": f"# {name}\n\nInvestigate step by step.\n",
        **fields,
    }


def _chat(hosts: Hosts, prompt: str, agent: str) -> tuple[str, str]:
    """Start a turn with ``agent``; returns (session id, spawn id). The spawn runs on."""
    with hosts.api.stream("POST", "/api/v1/chat", json={"prompt": prompt, "agent": agent}) as r:
        assert r.status_code == 200, r.read()
        return r.headers["x-session-id"], r.headers["x-spawn-id"]


def _finished(hosts: Hosts, spawn_id: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        spawn: dict[str, Any] = hosts.api.get(f"/api/v1/spawns/{spawn_id}").json()
        return spawn if spawn["status"] in ("ok", "failed", "cancelled") else None

    return wait_for(done, DEADLINE, f"spawn {spawn_id} to finish", every=0.2)


def _asked_from(hosts: Hosts, tag: str) -> list[tuple[str, float]]:
    """(host address, arrival) of every model request of the spawn prompted with ``tag``."""
    return [
        (peer, at)
        for request, peer, at in hosts.fake.arrivals()
        if tag in json.dumps(request.get("messages", [])[:2])
    ]


def _marks(hosts: Hosts, host: str) -> list[tuple[float, str]]:
    path = _marks_file(hosts, host)
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [(float(at), mark) for at, _pid, mark in (line.split(" ", 2) for line in lines)]


def _stepwise(tag: str, steps: int, delay: float) -> list[dict[str, Any]]:
    """Rules for the spawn prompted with ``tag``: ``steps`` tool calls, one per turn, then an
    answer; each reply takes ``delay`` seconds."""
    rules: list[dict[str, Any]] = [
        {
            "match": tag,
            "where": "any",
            "turn": turn,
            "delay": delay,
            "reply": {
                "tool_calls": [{"name": "mark_step", "arguments": {"mark": f"{tag}#{turn}"}}]
            },
        }
        for turn in range(steps)
    ]
    rules.append(
        {"match": tag, "where": "any", "delay": delay, "reply": {"content": f"{tag} done"}}
    )
    return rules


def _fleet(hosts: Hosts) -> dict[str, Any]:
    response = hosts.api.get("/api/v1/workers")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _by_host(fleet: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {w["member"].split("@")[0]: w for w in fleet["workers"]}


# -- the same view everywhere ------------------------------------------------------------------


def test_a_user_persona_made_on_ctl_runs_on_both_worker_hosts(cluster: Hosts) -> None:
    hosts = cluster
    created = hosts.api.post("/v1/agents/custom", json=_persona("mh-everywhere"))
    assert created.status_code == 201, created.text
    tags = [f"everywhere-{n}" for n in range(8)]
    rules = [r for tag in tags for r in _stepwise(tag, 1, delay=1.5)]
    hosts.fake.script(rules)
    spawns = [_chat(hosts, f"{tag}: look around", "mh-everywhere")[1] for tag in tags]
    for spawn_id in spawns:
        assert _finished(hosts, spawn_id)["status"] == "ok"
    # Eight at once, four slots on w1: both hosts ran some of them.
    first_asked = {tag: _asked_from(hosts, tag)[0][0] for tag in tags}
    assert set(first_asked.values()) == {hosts.addr("w1"), hosts.addr("w2")}, first_asked


def test_a_plugin_installed_through_the_api_reaches_both_hosts_without_shared_files(
    cluster: Hosts,
) -> None:
    hosts = cluster
    market = hosts.dir("ctl") / "market"
    plugin = market / "plugins" / "netops"
    (plugin / ".claude-plugin").mkdir(parents=True)
    (plugin / "agents").mkdir()
    (plugin / ".claude-plugin" / "plugin.json").write_text(
        json.dumps({"name": "netops", "version": "1.0.0", "description": "Network checks."})
    )
    (plugin / "agents" / "pinger.md").write_text(
        "---\nname: pinger\ndescription: Use this agent to check a link.\ntools: mark_step\n"
        f"model: {MODEL}\n"
        "---\n\nYou check links.\n"
    )
    (market / ".claude-plugin").mkdir()
    (market / ".claude-plugin" / "marketplace.json").write_text(
        json.dumps(
            {
                "name": "lab",
                "owner": {"name": "Ops"},
                "plugins": [{"name": "netops", "source": "./plugins/netops"}],
            }
        )
    )
    added = hosts.api.post("/api/v1/marketplaces", json={"source": str(market)})
    assert added.status_code == 201, added.text
    installed = hosts.api.post("/api/v1/plugins", json={"plugin": "netops@lab"})
    assert installed.status_code == 201, installed.text

    for host in ("w1", "w2"):
        copy = hosts.dir(host) / "marketplace" / "plugins" / "netops" / "current"
        wait_for(copy.is_dir, DEADLINE, f"netops unpacked on {host}", every=0.2)
        assert (copy / "agents" / "pinger.md").read_text() == (
            plugin / "agents" / "pinger.md"
        ).read_text()
    assert not (hosts.dir("ctl") / "marketplace").samefile(hosts.dir("w1") / "marketplace")

    tags = [f"plugin-run-{n}" for n in range(8)]
    hosts.fake.script([r for tag in tags for r in _stepwise(tag, 1, delay=1.5)])
    spawns = [_chat(hosts, f"{tag}: check the uplink", "netops:pinger")[1] for tag in tags]
    for spawn_id in spawns:
        spawn = _finished(hosts, spawn_id)
        assert spawn["status"] == "ok", spawn
        assert spawn["persona"] == "netops:pinger"
    assert {_asked_from(hosts, tag)[0][0] for tag in tags} == {
        hosts.addr("w1"),
        hosts.addr("w2"),
    }

    removed = hosts.api.delete("/api/v1/plugins/netops")
    assert removed.status_code == 204, removed.text
    for host in ("w1", "w2"):
        home = hosts.dir(host) / "marketplace" / "plugins" / "netops"
        wait_for(lambda home=home: not home.exists(), DEADLINE, f"netops removed on {host}")


def test_a_reload_reaches_both_hosts_and_a_host_whose_disk_differs_is_flagged(
    cluster: Hosts,
) -> None:
    hosts = cluster
    version = hosts.api.post("/api/v1/agents/reload").json()["registry_version"]

    def both_at(wanted: int) -> dict[str, Any] | None:
        fleet = _fleet(hosts)
        found = _by_host(fleet)
        ok = {"w1", "w2"} <= set(found) and all(
            found[h]["registry_version"] >= wanted for h in ("w1", "w2")
        )
        return fleet if ok else None

    fleet = wait_for(lambda: both_at(version), DEADLINE, "both hosts at the new version")
    assert fleet["consistent"], fleet

    # A persona on w1's own disk only, then a reload: w1's set differs from the others'.
    (hosts.dir("w1") / "agents" / "w1-only.md").write_text(
        "---\nname: w1-only\ndescription: Only on w1.\nwhen_to_use: Never.\n"
        f"model: {MODEL}\n---\n\n# w1 only\n"
    )
    version = hosts.api.post("/api/v1/agents/reload").json()["registry_version"]
    fleet = wait_for(lambda: both_at(version), DEADLINE, "both hosts at the next version")
    found = _by_host(fleet)
    assert not fleet["consistent"]
    assert found["w1"]["status"] == "differs", found["w1"]
    assert any("w1-only" in flag for flag in found["w1"]["flags"]), found["w1"]
    assert found["w2"]["status"] == "ok", found["w2"]
    ready = hosts.api.get("/readyz").json()
    assert any("w1-only" in json.dumps(v) for v in ready["fleet"]["flagged"].values()), ready

    (hosts.dir("w1") / "agents" / "w1-only.md").unlink()
    version = hosts.api.post("/api/v1/agents/reload").json()["registry_version"]
    fleet = wait_for(lambda: both_at(version), DEADLINE, "both hosts at the last version")
    assert fleet["consistent"], fleet


# -- a cut link --------------------------------------------------------------------------------


def _history(hosts: Hosts, session_id: str) -> list[Event]:
    return EventBus(hosts.redis).history(session_id)


def test_a_cut_host_gives_its_spawns_to_the_other_and_lands_nothing_after_the_takeover(
    cluster: Hosts,
) -> None:
    hosts = cluster
    created = hosts.api.post("/v1/agents/custom", json=_persona("mh-long"))
    assert created.status_code == 201, created.text
    steps, delay = 10, 0.6
    tags = [f"cut-{n}" for n in range(8)]
    hosts.fake.script([r for tag in tags for r in _stepwise(tag, steps, delay)])
    started = {tag: _chat(hosts, f"{tag}: investigate the outage", "mh-long") for tag in tags}
    w1, w2 = hosts.addr("w1"), hosts.addr("w2")

    def w1_busy() -> list[str] | None:
        on_w1 = [tag for tag in tags if any(p == w1 for p, _ in _asked_from(hosts, tag)[:2])]
        # Mid-run: each of them has made a call, none is near its end.
        return on_w1 if len(on_w1) >= 2 and len(_marks(hosts, "w1")) >= 2 else None

    lost = wait_for(w1_busy, DEADLINE, "w1 to run spawns", every=0.1)
    hosts.cut("w1")
    cut_at = time.time()
    try:
        lost = [tag for tag in tags if any(p == w1 for p, _ in _asked_from(hosts, tag))]

        def taken_over() -> dict[str, float] | None:
            firsts = {}
            for tag in lost:
                after = [at for peer, at in _asked_from(hosts, tag) if peer == w2]
                if not after:
                    return None
                firsts[tag] = min(after)
            return firsts

        takeover = wait_for(taken_over, DEADLINE, "w2 to resume w1's spawns", every=0.2)
        # Still cut off, w1 has stopped each of them itself: its lease was not confirmed for
        # most of its time, so it gave the spawn up before Redis could hand it to w2.
        for tag in lost:
            hosts.workers["w1"].wait_log(f"lease of spawn {started[tag][1]} not confirmed")
        time.sleep(LEASE_SECONDS)  # and w1 stays away a while longer
    finally:
        hosts.restore("w1")
    restored_at = time.time()
    results = {tag: _finished(hosts, spawn) for tag, (_, spawn) in started.items()}
    assert all(r["status"] == "ok" for r in results.values()), results
    # Back on the network for a while: anything of the old attempts would have landed by now.
    hosts.workers["w1"].wait_log("lease", timeout=DEADLINE)
    time.sleep(2 * LEASE_SECONDS)

    latency = {tag: round(at - cut_at, 2) for tag, at in takeover.items()}
    print(f"resumed on w2, seconds after the cut: {latency} (lease {LEASE_SECONDS} s)")
    assert max(latency.values()) < 3 * LEASE_SECONDS + 15, latency
    w1_marks = _marks(hosts, "w1")
    for tag in lost:
        # No model call and no tool call of the old attempt landed after the new one took over.
        late_calls = [
            at for peer, at in _asked_from(hosts, tag) if peer == w1 and at >= takeover[tag]
        ]
        assert late_calls == [], (tag, late_calls, takeover[tag])
        late_tools = [
            at for at, mark in w1_marks if mark.startswith(f"{tag}#") and at >= takeover[tag]
        ]
        assert late_tools == [], (tag, late_tools)
    assert restored_at > max(takeover.values())

    for tag, (session_id, spawn_id) in started.items():
        events = [e for e in _history(hosts, session_id) if e.spawn_id == spawn_id]
        calls = [e.call_id for e in events if e.type == "tool_call"]
        results_seen = [e.call_id for e in events if e.type == "tool_result"]
        notes = [e for e in events if e.type == "task_notification"]
        assert len(calls) == len(set(calls)) == steps, (tag, calls)
        assert len(results_seen) == len(set(results_seen)) == steps, (tag, results_seen)
        assert len(notes) == 1, (tag, notes)
        seqs = [e.seq for e in events]
        assert seqs == sorted(set(seqs)), (tag, seqs)
        text = "".join(getattr(e, "text", "") for e in events if e.type == "text")
        assert text.count(f"{tag} done") == 1, (tag, text)


# -- configuration that cannot work across hosts -----------------------------------------------


@pytest.mark.parametrize(
    ("setting", "value", "reason"),
    [
        ("ONGRID_DATABASE_URL", "sqlite:///{dir}/data/ongrid.db", "SQLite"),
        ("REDIS_URL", "redis://127.0.0.1:6379/0", "on this host only"),
    ],
    ids=["sqlite-database", "loopback-redis"],
)
def test_a_worker_configured_for_one_host_is_refused_at_start_with_the_reason(
    cluster: Hosts, setting: str, value: str, reason: str
) -> None:
    hosts = cluster
    worker = hosts.start_worker(
        "w1",
        f"misconfigured-{setting.lower()}",
        env={setting: value.format(dir=hosts.dir("w1"))},
        ready=False,
    )
    wait_for(lambda: not worker.alive(), DEADLINE, "the misconfigured worker to exit", every=0.2)
    assert worker.proc.returncode != 0
    log = worker.log()
    assert "ongrid worker: cannot start:" in log, log
    assert reason in log and setting in log, log
    assert "Traceback" not in log, log
