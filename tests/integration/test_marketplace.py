"""A real Claude Code plugin marketplace installed as it is (SPEC §8): listed, installed on a live
cluster of two workers, its agents spawned as ``<plugin>:<agent>``, a skill loaded in a spawn, and
removed without a trace.

Real parts: ``ongrid plugins`` subprocesses, two ``ongrid worker`` processes that were running
before the install, Redis, the SQLite database they share; the model is the fake at its HTTP
boundary.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from bundles import (
    CORPUS_MARKETPLACE,
    agent_file,
    installed_tree,
    marketplace,
    ongrid,
    ongrid_json,
    plugin_manifest,
    skill_dir,
)
from harness import MODEL, RELOAD_LINE, Cluster, call, final, system_of

from registry.errors import NotFoundError
from workers.fleet import read_fleet

MARKET = "claude-plugins-official"


def _tool_messages(request: dict) -> list[str]:
    return [str(m.get("content") or "") for m in request["messages"] if m["role"] == "tool"]


def _with_parts(path: Path) -> bool:
    return (path / "agents").is_dir() or (path / "skills").is_dir()


# About 45 CLI runs and two workers reloading after each install: 250-270 s on a quiet 2-core
# machine running the suite in parallel, past the suite's 300 s hang guard when both cores are
# busy besides.
@pytest.mark.timeout(900)
@pytest.mark.skipif(
    not CORPUS_MARKETPLACE.is_dir(), reason=f"the corpus marketplace is not at {CORPUS_MARKETPLACE}"
)
def test_the_official_marketplace_installs_spawns_and_leaves_no_trace(cluster: Cluster):
    env = {"ONGRID_DEFAULT_MODEL": MODEL}
    workers = [cluster.start_worker(name, ready=False, env=env) for name in ("a", "b")]
    for worker in workers:
        worker.wait_ready()

    added = ongrid_json(cluster, "plugins", "marketplace", "add", str(CORPUS_MARKETPLACE))
    assert (added["name"], added["plugins"], added["problems"]) == (MARKET, 286, [])

    listed = ongrid_json(cluster, "plugins", "available")
    assert len(listed) == 286
    raw = json.loads((CORPUS_MARKETPLACE / ".claude-plugin" / "marketplace.json").read_text())
    local = {p["name"]: p["source"] for p in raw["plugins"] if isinstance(p["source"], str)}
    for row in listed:
        if row["name"] in local:
            assert row["reachable"], row
        else:  # a repository elsewhere: no network here, and it says so
            assert not row["reachable"]
            assert "network sources are off" in row["unreachable_reason"], row

    wanted = sorted(n for n, src in local.items() if _with_parts(CORPUS_MARKETPLACE / src))
    assert len(wanted) >= 20
    for name in wanted:
        ongrid(cluster, "plugins", "install", f"{name}@{MARKET}", "--json")
    installed = ongrid_json(cluster, "plugins", "list")
    assert sorted(p["name"] for p in installed) == wanted
    agents = sorted(a for p in installed for a in p["agents"])
    expected = sorted(
        f"{name}:{f.stem}"
        for name in wanted
        for f in (CORPUS_MARKETPLACE / local[name] / "agents").glob("*.md")
    )
    assert agents == expected and len(agents) >= 25
    for plugin in installed:
        assert plugin["marketplace"] == MARKET and len(plugin["content_hash"]) == 64
        assert plugin["allowed_mode"] == "read-only"

    # The reload reached both workers, which were running before any install.
    version = int(cluster.redis.get("ongrid:registry:version"))
    for worker in workers:
        worker.wait_log(f"{RELOAD_LINE} {version}", timeout=60)

    cluster.client.registry.reload()
    snapshot = cluster.client.snapshot()
    for name in agents:
        persona = snapshot.get(name)
        assert (persona.source, persona.plugin) == ("plugin", name.split(":")[0])
        assert persona.permission_mode == "read-only"

    cluster.fake.script([final("Checked.")])
    spawns = [cluster.client.spawn(name, f"Spawn check of {name}.") for name in agents]
    for record in spawns:
        done = cluster.client.wait(record.spawn_id, timeout=120)
        assert done.status == "ok", (record.persona, done.error)
    ran_on = {w.name for w in workers for r in spawns if f"'spawn_id': '{r.spawn_id}'" in w.log()}
    assert ran_on and ran_on <= {"a", "b"}, ran_on
    # Which worker takes which spawn is Celery's to decide; that either could run any of them
    # is what their fleet reports say: both loaded every plugin persona, and resolved its model.
    reports = read_fleet(cluster.redis)
    assert len(reports) == len(workers)
    for report in reports:
        assert set(agents) <= set(report.models), report.member
        assert not set(agents) & set(report.model_problems), report.model_problems

    # A plugin persona loads one of its plugin's skills in a spawn.
    reviewer = "plugin-dev:skill-reviewer"
    skill = "plugin-dev:skill-development"
    prompt = "Review the skill with its guide."
    cluster.fake.script(
        [
            call("load_skill", {"name": skill}, match=prompt, turn=0),
            final("Reviewed with the guide.", match=prompt, turn=1),
        ]
    )
    record = cluster.client.spawn(reviewer, prompt)
    done = cluster.client.wait(record.spawn_id, timeout=120)
    assert done.status == "ok", done.error
    first, second = cluster.fake.requests_for(prompt)
    guide = (CORPUS_MARKETPLACE / local["plugin-dev"] / "skills" / "skill-development").resolve()
    body = (guide / "SKILL.md").read_text().split("---", 2)[2].strip()
    assert skill in system_of(first) and body[:200] not in system_of(first)
    (loaded,) = _tool_messages(second)
    assert body[:200] in loaded
    offered = {t["function"]["name"] for t in first["tools"]}
    assert {"load_skill", "read_file_skill"} <= offered

    # Remove every plugin and the marketplace: nothing is left behind.
    for name in wanted:
        ongrid(cluster, "plugins", "remove", name)
    ongrid(cluster, "plugins", "marketplace", "remove", MARKET)
    assert ongrid_json(cluster, "plugins", "list") == []
    assert ongrid_json(cluster, "plugins", "marketplace", "list") == []
    assert installed_tree(cluster) == []
    with sqlite3.connect(cluster.root / ".ongrid" / "ongrid.db") as db:
        for table in ("installed_plugins", "marketplaces"):
            assert db.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)
    version = int(cluster.redis.get("ongrid:registry:version"))
    for worker in workers:
        worker.wait_log(f"{RELOAD_LINE} {version}", timeout=60)
    cluster.client.registry.reload()
    assert not [n for n in cluster.client.snapshot().names() if ":" in n]


def test_install_update_and_remove_a_plugin_of_a_local_marketplace(cluster: Cluster, tmp_path):
    """A marketplace of this test's own: a plugin with an agent and a skill is installed from
    the CLI, the live worker spawns it, an update with changed content is a new version
    directory, and remove takes the persona away from the worker at its next spawn."""
    source = tmp_path / "acme"
    plugin = source / "plugins" / "diskkit"
    plugin_manifest(plugin, "diskkit", version="1.0.0")
    agent_file(plugin / "agents", "disk-doctor", body="# Disk doctor\n\nVersion one.")
    skill_dir(plugin, "df-guide", "Read df -h first.", "How to read disk usage.")
    remote = {"source": "url", "url": "https://example.invalid/x.git"}
    marketplace(
        source,
        "acme",
        [{"name": "diskkit", "source": "./plugins/diskkit"}, {"name": "far", "source": remote}],
    )
    worker = cluster.start_worker(env={"ONGRID_DEFAULT_MODEL": MODEL})

    ongrid(cluster, "plugins", "marketplace", "add", str(source), "--name", "acme")
    rows = {r["name"]: r for r in ongrid_json(cluster, "plugins", "available", "acme")}
    assert rows["diskkit"]["reachable"] and not rows["far"]["reachable"]
    refused = ongrid(cluster, "plugins", "install", "far@acme", check=False)
    assert refused.returncode == 1 and "network sources are off" in refused.stderr

    first = ongrid_json(cluster, "plugins", "install", "diskkit@acme")
    assert first["agents"] == ["diskkit:disk-doctor"]
    assert first["skills"] == ["diskkit:df-guide"] and first["version"] == "1.0.0"
    again = ongrid_json(cluster, "plugins", "install", "diskkit@acme")
    assert not again["changed"] and again["content_hash"] == first["content_hash"]

    cluster.fake.script([final("Disk fine.")])
    version = int(cluster.redis.get("ongrid:registry:version"))
    worker.wait_log(f"{RELOAD_LINE} {version}")
    cluster.client.registry.reload()
    done = cluster.client.wait(cluster.client.spawn("diskkit:disk-doctor", "How full?").spawn_id)
    assert done.status == "ok", done.error
    assert "Version one." in system_of(cluster.fake.requests_for("How full?")[0])

    # A persona of this site lists the plugin's skill by its bare name and loads it.
    cluster.persona("df-reader", skills=["df-guide"], tools=["query_promql"])
    cluster.client.reload()
    ask = "Read the disk usage guide."
    cluster.fake.script(
        [
            call("load_skill", {"name": "df-guide"}, match=ask, turn=0),
            final("Guide read.", match=ask, turn=1),
        ]
    )
    done = cluster.client.wait(cluster.client.spawn("df-reader", ask).spawn_id)
    assert done.status == "ok", done.error
    opening, after = cluster.fake.requests_for(ask)
    prompt_text = system_of(opening)
    assert "diskkit:df-guide" in prompt_text and "How to read disk usage." in prompt_text
    assert "Read df -h first." not in prompt_text
    loaded = [m["content"] for m in after["messages"] if m["role"] == "tool"]
    assert len(loaded) == 1 and "Read df -h first." in loaded[0]

    agent_file(plugin / "agents", "disk-doctor", body="# Disk doctor\n\nVersion two.")
    (updated,) = ongrid_json(cluster, "plugins", "update", "diskkit")
    assert updated["updated"] and updated["content_hash"] != first["content_hash"]
    home = cluster.root / "marketplace" / "plugins" / "diskkit"
    assert sorted(p.name for p in home.iterdir()) == [
        f"1.0.0-{updated['content_hash'][:12]}",
        "current",
    ]
    version = int(cluster.redis.get("ongrid:registry:version"))
    worker.wait_log(f"{RELOAD_LINE} {version}")
    cluster.client.registry.reload()
    done = cluster.client.wait(cluster.client.spawn("diskkit:disk-doctor", "Again?").spawn_id)
    assert done.status == "ok", done.error
    assert "Version two." in system_of(cluster.fake.requests_for("Again?")[0])

    record = cluster.client.spawn("diskkit:disk-doctor", "Once more?")
    ongrid(cluster, "plugins", "remove", "diskkit")
    cluster.client.wait(record.spawn_id)  # ran (or failed) with what it started with
    version = int(cluster.redis.get("ongrid:registry:version"))
    worker.wait_log(f"{RELOAD_LINE} {version}")
    cluster.client.registry.reload()
    assert "diskkit:disk-doctor" not in cluster.client.snapshot().personas
    with pytest.raises(NotFoundError):
        cluster.client.spawn("diskkit:disk-doctor", "Still there?")
    ongrid(cluster, "plugins", "marketplace", "remove", "acme")
    assert installed_tree(cluster) == []
