"""What an install leaves in the marketplace root, and what a reload reads from it.

Real files throughout: a marketplace folder in ``tmp_path`` whose plugin has a Claude Code agent,
an Agent Skill with a manifest and its script, and a ``.mcp.json``; a :class:`PluginManager` on a
migrated SQLite file; a broadcast that counts. Nothing of the bundle is run here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from coordinator.plugin_manager import Conflict, PluginManager, parse_plugin_ref
from coordinator.storage.engine import make_engine, upgrade
from coordinator.storage.plugins import PluginStore
from marketplace.layer import (
    CURRENT_LINK,
    PLUGINS_DIR,
    RECORD_FILE,
    Bundles,
    capped_mode,
    read_bundles,
)
from registry.errors import NotFoundError, UserError
from registry.persona import PermissionMode, Persona, Source

READ_ONLY = PermissionMode.READ_ONLY
MUTATING = PermissionMode.MUTATING_WITH_CONFIRM
DUAL = PermissionMode.DUAL_SIGN_REQUIRED

HELLO_MANIFEST = {
    "tools": [
        {
            "name": "hello_skill",
            "description": "Say hello.",
            "class": "read",
            "parameters": {"type": "object", "properties": {}},
            "run": {"command": "scripts/hello.sh", "interpreter": "sh", "args": []},
        }
    ]
}


# -- writing a marketplace -------------------------------------------------------------------------


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def agent(plugin: Path, name: str, body: str = "", **front: Any) -> Path:
    """A Claude Code subagent file: a comma-separated ``tools`` string and a model alias."""
    data = {
        "name": name,
        "description": f"Use this agent to look at {name} things.",
        "tools": "Read, Grep, host_probe",
        "model": "sonnet",
        "color": "blue",
        **front,
    }
    text = f"---\n{yaml.safe_dump(data, sort_keys=False)}---\n\n{body or f'You are {name}.'}\n"
    return write(plugin / "agents" / f"{name}.md", text)


def skill(plugin: Path, name: str, body: str = "") -> Path:
    folder = plugin / "skills" / name
    write(
        folder / "SKILL.md",
        f"---\nname: {name}\ndescription: The {name} skill.\n---\n{body or f'# {name}'}\n",
    )
    write(folder / "references" / "notes.md", "Notes.\n")
    return folder


class Market:
    """A directory marketplace named ``team`` whose plugins live under ``plugins/``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.entries: list[dict[str, Any]] = []

    def plugin(self, name: str, *, version: str = "1.0.0") -> Path:
        folder = self.root / "plugins" / name
        write(
            folder / ".claude-plugin" / "plugin.json",
            json.dumps({"name": name, "version": version, "description": f"The {name} plugin."}),
        )
        self.entries.append({"name": name, "source": f"./plugins/{name}"})
        self.save()
        return folder

    def save(self) -> None:
        data = {"name": "team", "owner": {"name": "Ops"}, "plugins": self.entries}
        write(self.root / ".claude-plugin" / "marketplace.json", json.dumps(data))


def full_plugin(market: Market, name: str = "ops") -> Path:
    """An agent, a skill with a manifest and its script, and an MCP server."""
    folder = market.plugin(name)
    agent(folder, "x")
    s = skill(folder, "s")
    write(s / "scripts" / "hello.sh", "#!/bin/sh\necho hello\n").chmod(0o755)
    write(s / "ongrid-tools.yaml", json.dumps(HELLO_MANIFEST))
    mcp = {"mcpServers": {"echo": {"command": "python3", "args": ["${CLAUDE_PLUGIN_ROOT}/e.py"]}}}
    write(folder / ".mcp.json", json.dumps(mcp))
    return folder


class Counter:
    """The broadcast: counts, and answers with the cluster's new registry version."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> int:
        self.calls += 1
        return 100 + self.calls


@pytest.fixture
def store(tmp_path: Path) -> Iterator[PluginStore]:
    engine = make_engine(f"sqlite:///{tmp_path / 'ongrid.db'}")
    upgrade(engine)
    yield PluginStore(engine)
    engine.dispose()


@pytest.fixture
def market(tmp_path: Path) -> Market:
    return Market(tmp_path / "market")


@pytest.fixture
def broadcast() -> Counter:
    return Counter()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "marketplace-root"


@pytest.fixture
def manager(root: Path, store: PluginStore, broadcast: Counter) -> PluginManager:
    return PluginManager(root, store, broadcast=broadcast)


def added(manager: PluginManager, market: Market) -> PluginManager:
    manager.add_marketplace(str(market.root))
    return manager


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def home_of(root: Path, plugin: str = "ops") -> Path:
    return root / PLUGINS_DIR / plugin


def current(root: Path, plugin: str = "ops") -> Path:
    return (home_of(root, plugin) / CURRENT_LINK).resolve()


# -- what a reload reads ---------------------------------------------------------------------------


def test_read_bundles_gives_the_plugin_persona_its_skills_tools_and_servers(
    manager: PluginManager, market: Market, root: Path, broadcast: Counter
) -> None:
    full_plugin(market)
    outcome = added(manager, market).install("ops@team", user="alice")
    assert outcome.changed and outcome.version == 101 and broadcast.calls == 1
    installed = current(root)
    assert outcome.record.path == str(installed) and installed.parent == home_of(root)
    assert os.readlink(home_of(root) / CURRENT_LINK) == installed.name  # relative link

    bundles = read_bundles(root)
    assert bundles.warnings == ()
    (persona,) = bundles.personas
    assert persona.name == "ops:x" and persona.source is Source.PLUGIN
    assert persona.plugin == "ops" and persona.path == str(installed / "agents" / "x.md")
    assert persona.skills == ["ops:s"]  # none listed: every skill of its plugin
    assert persona.permission_mode is READ_ONLY  # nothing allowed at install beyond read-only
    assert persona.model == "anthropic/claude-sonnet-4-6"  # the importer's alias mapping
    assert persona.tools == ["Read", "Grep", "host_probe"]
    assert list(bundles.skills) == ["ops:s"]
    s = bundles.skills["ops:s"]
    assert (s.name, s.plugin, s.root) == ("s", "ops", installed / "skills" / "s")
    assert "references/notes.md" in s.files
    assert [t.name for t in bundles.tools] == ["ops__hello_skill"]
    assert [t.bundle for t in bundles.tools] == ["ops"]
    server = bundles.mcp_servers["ops__echo"]
    assert server.plugin == "ops" and server.plugin_root == str(installed)
    # Installed read-only with no grant: sandboxed, no network, no writable folder, read tools.
    assert (server.sandboxed, server.network, server.writable) == (True, False, False)
    assert server.max_tool_class == "read"
    plugin = bundles.plugin("ops")
    assert plugin is not None and plugin.record.content_hash == outcome.record.content_hash
    assert plugin.record.installed_by == "alice" and plugin.agents == ("ops:x",)
    assert bundles.digest and bundles.digest != read_bundles(root.parent / "elsewhere").digest
    assert bundles.skills_for(persona) == {"ops:s": s}


def test_the_database_records_what_was_installed_from_where(
    manager: PluginManager, market: Market, store: PluginStore, root: Path
) -> None:
    full_plugin(market)
    outcome = added(manager, market).install("ops@team", allow_mode=MUTATING.value, user="alice")
    row = store.plugin("ops")
    assert row is not None and row == outcome.record
    assert (row.marketplace, row.version, row.source) == ("team", "1.0.0", "./plugins/ops")
    assert row.allowed_mode == MUTATING.value and row.mcp is True and row.installed_by == "alice"
    assert len(row.content_hash) == 64 and row.path == str(current(root))
    assert row.ref.startswith("sha256:")  # a directory marketplace: the hash of its listing
    record = json.loads((current(root) / RECORD_FILE).read_text())
    assert record["content_hash"] == row.content_hash and record["allowed_mode"] == MUTATING.value


@pytest.mark.parametrize(
    ("declared", "allowed", "expected"),
    [
        (None, READ_ONLY, READ_ONLY),
        (None, MUTATING, MUTATING),
        (None, DUAL, DUAL),
        (DUAL, READ_ONLY, READ_ONLY),
        (DUAL, MUTATING, MUTATING),
        (MUTATING, READ_ONLY, READ_ONLY),
        (READ_ONLY, DUAL, READ_ONLY),
        (MUTATING, DUAL, MUTATING),
        (MUTATING, MUTATING, MUTATING),
    ],
)
def test_capped_mode_never_exceeds_what_was_allowed(
    declared: PermissionMode | None, allowed: PermissionMode, expected: PermissionMode
) -> None:
    fields: dict[str, Any] = {} if declared is None else {"permission_mode": declared}
    persona = Persona(name="x", description="d", when_to_use="w", **fields)
    assert capped_mode(persona, allowed) is expected


def test_installed_personas_run_with_their_mode_capped_by_the_install(
    manager: PluginManager, market: Market, root: Path
) -> None:
    folder = market.plugin("ops")
    agent(folder, "plain")  # declares nothing: gets what was allowed
    agent(folder, "greedy", permission_mode=DUAL.value)  # more than allowed: allowed
    agent(folder, "modest", permission_mode=READ_ONLY.value)  # less: its own
    added(manager, market).install("ops@team", allow_mode=MUTATING.value)
    modes = {p.name: p.permission_mode for p in read_bundles(root).personas}
    assert modes == {"ops:plain": MUTATING, "ops:greedy": MUTATING, "ops:modest": READ_ONLY}


def test_a_bare_skill_name_resolves_to_the_plugins_own_skill(
    manager: PluginManager, market: Market, root: Path
) -> None:
    ops = market.plugin("ops")
    skill(ops, "s")
    skill(ops, "t")
    agent(ops, "x", skills=["s", "elsewhere:u"])
    dev = market.plugin("dev")
    skill(dev, "s")
    skill(dev, "u")
    added(manager, market)
    manager.install("ops@team")
    manager.install("dev@team")
    bundles = read_bundles(root)
    persona = next(p for p in bundles.personas if p.name == "ops:x")
    assert persona.skills == ["ops:s", "elsewhere:u"]  # only the listed ones, qualified
    assert list(bundles.skills_for(persona)) == ["ops:s"]  # a skill nobody ships is no skill
    # Outside a plugin a bare name stands for the one installed skill of that name, if one.
    user = Persona(name="mine", description="d", when_to_use="w", skills=["u", "s", "dev:s"])
    assert list(bundles.skills_for(user)) == ["dev:u", "dev:s"]  # "s" is ambiguous: left out


def test_an_unreadable_install_record_is_a_warning_and_the_others_still_load(
    manager: PluginManager, market: Market, root: Path
) -> None:
    full_plugin(market, "ops")
    agent(market.plugin("dev"), "y")
    added(manager, market)
    manager.install("ops@team")
    manager.install("dev@team")
    broken = current(root, "ops")
    (broken / RECORD_FILE).write_text("{not json", encoding="utf-8")
    bundles = read_bundles(root)
    assert [p.name for p in bundles.personas] == ["dev:y"]
    (warning,) = bundles.warnings
    assert warning.path == str(broken)
    assert warning.reason.startswith("plugin 'ops' not loaded: ")
    assert "install record unreadable" in warning.reason and RECORD_FILE in warning.reason
    (broken / RECORD_FILE).unlink()
    (missing,) = read_bundles(root).warnings
    assert "install record unreadable" in missing.reason


def test_a_part_that_cannot_be_used_is_a_warning_and_the_rest_loads(
    manager: PluginManager, market: Market, root: Path
) -> None:
    folder = full_plugin(market)
    write(folder / "agents" / "broken.md", "---\nname: broken\nmax_turns: -1\n---\nBody.\n")
    added(manager, market).install("ops@team")
    bundles = read_bundles(root)
    assert [p.name for p in bundles.personas] == ["ops:x"]
    reasons = [w.reason for w in bundles.warnings]
    assert len(reasons) == 1 and str(current(root) / "agents" / "broken.md") in reasons[0]
    assert "max_turns" in reasons[0]


def test_the_config_files_mcp_servers_join_and_never_replace_a_plugins(
    manager: PluginManager, market: Market, root: Path
) -> None:
    """Plugin ``ops`` server ``echo`` is ``ops__echo``; the config's ``ops_echo`` is another
    server, and a config server named ``ops`` (whose tools would read ``mcp__ops__…`` like the
    plugin's) is left out, saying so, never silently replaced or replacing."""
    full_plugin(market)
    added(manager, market).install("ops@team")
    config = {c: {"command": "python3"} for c in ("clock", "ops_echo", "ops", "a__b")}
    bundles = read_bundles(root, config_mcp=config)
    assert set(bundles.mcp_servers) == {"ops__echo", "ops_echo", "clock"}
    assert bundles.mcp_servers["ops__echo"].plugin == "ops"
    assert bundles.mcp_servers["ops_echo"].plugin == ""
    assert not bundles.mcp_servers["clock"].sandboxed  # the administrator's own
    said = [w.reason for w in bundles.warnings if w.path == "config:mcp_servers"]
    assert any("server 'ops' not started" in w and "plugin 'ops'" in w for w in said), said
    assert any("a__b" in w and "may not hold '__'" in w for w in said), said
    assert bundles.digest != read_bundles(root).digest


def test_an_empty_root_reads_as_no_bundles(tmp_path: Path) -> None:
    assert read_bundles(tmp_path / "absent") == Bundles()
    assert read_bundles(tmp_path) == Bundles()


# -- installing, updating, removing ----------------------------------------------------------------


def test_installing_the_same_content_again_changes_nothing_and_broadcasts_nothing(
    manager: PluginManager, market: Market, root: Path, broadcast: Counter
) -> None:
    full_plugin(market)
    first = added(manager, market).install("ops@team")
    before = tree(root)
    again = manager.install("ops@team")
    assert not again.changed and again.version == 0 and broadcast.calls == 1
    assert again.record == first.record and tree(root) == before
    # Other options are a change, even over the same content.
    other = manager.install("ops@team", mcp=False)
    assert other.changed and broadcast.calls == 2 and other.record.mcp is False
    assert current(root) == Path(first.record.path)
    assert read_bundles(root).mcp_servers == {}


def test_an_update_after_a_content_change_installs_a_new_directory_and_removes_the_old(
    manager: PluginManager, market: Market, root: Path, broadcast: Counter
) -> None:
    folder = full_plugin(market)
    first = added(manager, market).install("ops@team", allow_mode=MUTATING.value)
    old = Path(first.record.path)
    assert manager.update("ops") == [
        {
            "name": "ops",
            "updated": False,
            "version": "1.0.0",
            "content_hash": first.record.content_hash,
        }
    ]
    assert broadcast.calls == 1
    agent(folder, "x", body="You are the new x.")
    (result,) = manager.update("ops")
    assert result["updated"] is True and result["content_hash"] != first.record.content_hash
    new = current(root)
    assert new != old and not old.exists() and new.is_dir()
    assert sorted(p.name for p in home_of(root).iterdir()) == sorted([CURRENT_LINK, new.name])
    assert broadcast.calls == 2
    (persona,) = read_bundles(root).personas
    assert persona.body.strip() == "You are the new x."
    assert persona.permission_mode is MUTATING  # the options it was installed with are kept


def test_a_database_failure_during_install_leaves_the_previous_version_in_place(
    manager: PluginManager,
    market: Market,
    root: Path,
    store: PluginStore,
    broadcast: Counter,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    folder = full_plugin(market)
    first = added(manager, market).install("ops@team")
    before = tree(root)
    agent(folder, "x", body="A change the database never hears of.")

    def refuse(self: PluginStore, record: Any, archive: Any = None) -> Any:
        raise RuntimeError("database is locked")

    monkeypatch.setattr(PluginStore, "put_plugin", refuse)
    with pytest.raises(RuntimeError, match="database is locked"):
        manager.install("ops@team")
    assert current(root) == Path(first.record.path)
    assert tree(root) == before  # no new directory, nothing staged
    assert store.plugin("ops") == first.record and broadcast.calls == 1
    (persona,) = read_bundles(root).personas
    assert persona.body.strip() == "You are x."


def test_a_database_failure_on_a_first_install_leaves_nothing_installed(
    manager: PluginManager,
    market: Market,
    root: Path,
    store: PluginStore,
    broadcast: Counter,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    full_plugin(market)
    added(manager, market)

    def refuse(self: PluginStore, record: Any, archive: Any = None) -> Any:
        raise RuntimeError("database is locked")

    monkeypatch.setattr(PluginStore, "put_plugin", refuse)
    with pytest.raises(RuntimeError):
        manager.install("ops@team")
    assert read_bundles(root) == Bundles() and store.plugins() == []
    assert tree(root) == [".lock"] and broadcast.calls == 0


def test_what_a_crashed_install_left_staged_is_removed_by_the_next_operation(
    manager: PluginManager, market: Market, root: Path
) -> None:
    full_plugin(market)
    added(manager, market)
    crashed = write(root / ".staging" / "xyz" / "agents" / "half.md", "half a file")
    assert crashed.exists()
    manager.install("ops@team")
    assert not (root / ".staging").exists()
    assert [p for p in tree(root) if p.startswith(".staging")] == []


def test_remove_leaves_only_the_lock_file(
    manager: PluginManager, market: Market, root: Path, store: PluginStore, broadcast: Counter
) -> None:
    full_plugin(market)
    added(manager, market).install("ops@team")
    assert manager.remove("ops") == 102 and broadcast.calls == 2
    assert tree(root) == [".lock"]
    assert store.plugins() == [] and read_bundles(root) == Bundles()
    with pytest.raises(NotFoundError) as unknown:
        manager.remove("ops")
    assert unknown.value.kind == "installed plugin" and broadcast.calls == 2


def test_a_marketplace_in_use_cannot_be_removed(
    manager: PluginManager, market: Market, store: PluginStore
) -> None:
    full_plugin(market)
    added(manager, market).install("ops@team")
    with pytest.raises(Conflict) as in_use:
        manager.remove_marketplace("team")
    assert "'team'" in str(in_use.value) and "ops" in str(in_use.value)
    assert store.marketplace("team") is not None
    manager.remove("ops")
    manager.remove_marketplace("team")
    assert store.marketplaces() == []
    with pytest.raises(NotFoundError):
        manager.remove_marketplace("team")


def test_a_marketplace_name_taken_by_another_source_is_refused(
    manager: PluginManager, market: Market, tmp_path: Path, store: PluginStore
) -> None:
    full_plugin(market)
    added(manager, market)
    other = Market(tmp_path / "other")
    full_plugin(other)
    with pytest.raises(Conflict, match="already added from"):
        manager.add_marketplace(str(other.root), name="team")
    assert store.marketplace("team").location == str(market.root.resolve())
    again = manager.add_marketplace(str(market.root))  # the same source: read again
    assert again["name"] == "team" and again["plugins"] == 1


def test_installing_an_unknown_plugin_names_the_plugins_it_may_have_meant(
    manager: PluginManager, market: Market, root: Path
) -> None:
    full_plugin(market, "ops")
    full_plugin(market, "dev")
    added(manager, market)
    with pytest.raises(NotFoundError) as unknown:
        manager.install("opz@team")
    assert "opz" in unknown.value.name and "ops" in unknown.value.choices
    assert "known: " in str(unknown.value) and "team" in str(unknown.value)
    with pytest.raises(NotFoundError) as no_market:
        manager.install("ops@nowhere")
    assert no_market.value.kind == "marketplace" and no_market.value.choices == ("team",)
    assert tree(root) == [".lock"]


@pytest.mark.parametrize("ref", ["ops", "ops@", "@team", "", "  ", "@"])
def test_a_malformed_plugin_ref_is_a_user_error(manager: PluginManager, ref: str) -> None:
    with pytest.raises(UserError, match="expected PLUGIN@MARKETPLACE"):
        manager.install(ref)
    with pytest.raises(UserError, match="expected PLUGIN@MARKETPLACE"):
        parse_plugin_ref(ref)


def test_a_plugin_ref_splits_at_the_last_at_sign() -> None:
    assert parse_plugin_ref(" ops@team ") == ("ops", "team")
    assert parse_plugin_ref("a@b@team") == ("a@b", "team")


def test_an_unknown_allow_mode_is_refused_before_anything_is_done(
    manager: PluginManager, market: Market, root: Path
) -> None:
    full_plugin(market)
    added(manager, market)
    with pytest.raises(UserError, match="allow_mode: expected one of read-only"):
        manager.install("ops@team", allow_mode="root")
    assert read_bundles(root) == Bundles()


# -- what an install lets a plugin bring -----------------------------------------------------------


def _tools_plugin(market: Market, name: str, tools: list[dict[str, Any]]) -> Path:
    folder = market.plugin(name)
    agent(folder, "x", tools="host_probe, restart_skill, probe_skill")
    write(folder / "scripts" / "probe.sh", "#!/bin/sh\necho probe\n").chmod(0o755)
    write(folder / "ongrid-tools.yaml", json.dumps({"tools": tools}))
    return folder


def _script_tool(name: str, tool_class: str, **run: Any) -> dict[str, Any]:
    return {
        "name": name,
        "description": f"The {name} tool.",
        "class": tool_class,
        "parameters": {"type": "object", "properties": {}},
        "run": {"command": "scripts/probe.sh", "interpreter": "sh", **run},
    }


def _http_tool(name: str, tool_class: str, method: str) -> dict[str, Any]:
    return {
        "name": name,
        "description": f"The {name} tool.",
        "class": tool_class,
        "parameters": {"type": "object", "properties": {}},
        "http": {"method": method, "url": "http://127.0.0.1:9/x"},
    }


def test_a_tools_class_is_bounded_by_what_it_does_and_capped_by_the_install(
    manager: PluginManager, market: Market, root: Path
) -> None:
    """The review's ``class: read`` DELETE, from a plugin installed read-only, is not loaded;
    allowed to confirm writes, it loads as a write tool (so every call asks a person)."""
    _tools_plugin(
        market,
        "ops",
        [
            _http_tool("restart_skill", "read", "DELETE"),
            _http_tool("peek_skill", "read", "HEAD"),
            _script_tool("probe_skill", "read"),
            _script_tool("fetch_skill", "read", network=True),
        ],
    )
    added(manager, market).install("ops@team")
    bundles = read_bundles(root)
    assert {t.name: t.tool_class.value for t in bundles.tools} == {
        "ops__peek_skill": "read",
        "ops__probe_skill": "read",
    }
    said = "\n".join(w.reason for w in bundles.warnings)
    assert "'ops__restart_skill': declared class read, runs as write: an HTTP DELETE" in said
    assert "'ops__restart_skill' not loaded: its class write is more than the install" in said
    assert "'ops__fetch_skill' not loaded: its class write is more than the install" in said

    manager.install("ops@team", allow_mode=MUTATING.value)
    bundles = read_bundles(root)
    classes = {t.name: t.tool_class.value for t in bundles.tools}
    assert classes["ops__restart_skill"] == "write" and "ops__fetch_skill" not in classes
    said = "\n".join(w.reason for w in bundles.warnings)
    assert "'ops__fetch_skill' not loaded: it declares network: true, which the install" in said

    manager.install("ops@team", allow_mode=MUTATING.value, network=True)
    bundles = read_bundles(root)
    fetch = next(t for t in bundles.tools if t.name == "ops__fetch_skill")
    assert fetch.tool_class.value == "write" and fetch.executor.network is True
    probe = next(t for t in bundles.tools if t.name == "ops__probe_skill")
    assert probe.executor.network is False  # granted to the plugin, declared by one tool only
    (persona,) = bundles.personas  # its bare names are its plugin's tools
    assert persona.tools == ["host_probe", "ops__restart_skill", "ops__probe_skill"]


def test_two_plugins_tools_never_shadow_each_other(
    manager: PluginManager, market: Market, root: Path
) -> None:
    _tools_plugin(market, "alpha", [_script_tool("restart_skill", "write")])
    _tools_plugin(market, "beta", [_script_tool("restart_skill", "read")])
    added(manager, market)
    manager.install("alpha@team", allow_mode=MUTATING.value)
    manager.install("beta@team", allow_mode=MUTATING.value)
    bundles = read_bundles(root)
    assert {t.name: t.tool_class.value for t in bundles.tools} == {
        "alpha__restart_skill": "write",
        "beta__restart_skill": "read",
    }


def test_an_install_whose_names_meet_others_is_refused_and_changes_nothing(
    store: PluginStore, market: Market, root: Path, broadcast: Counter
) -> None:
    manager = PluginManager(
        root,
        store,
        broadcast=broadcast,
        reserved_tools=["z__probe_skill"],
        config_servers=["corp"],
    )
    for name in ("a.b", "a_b", "corp", "x__y", "z"):
        _tools_plugin(market, name, [_script_tool("probe_skill", "read")])
    added(manager, market).install("a.b@team")
    before = tree(root)
    with pytest.raises(UserError) as clash:
        manager.install("a_b@team")
    assert "plugin 'a.b' (its tools and servers are named a_b__…)" in str(clash.value)
    with pytest.raises(UserError) as clash:
        manager.install("corp@team")
    assert "the config file's MCP server 'corp'" in str(clash.value)
    with pytest.raises(UserError) as clash:
        manager.install("x__y@team")
    assert "its name holds '__'" in str(clash.value)
    with pytest.raises(UserError) as clash:
        manager.install("z@team")
    assert "the runtime's tool 'z__probe_skill'" in str(clash.value)
    assert tree(root) == before and [p.name for p in store.plugins()] == ["a.b"]
    assert broadcast.calls == 1
