"""The `ongrid agents` commands, run through click and once through the installed script."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from coordinator.cli import main

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO.parent / "shared" / "corpus" / "claude-code-agents"

GOOD = """---
name: disk_checker
description: Check disks.
when_to_use: When disks fill up.
tools: host_probe, bash
color: teal
---
# Disk checker
"""
BAD = """---
name: broken
description: Missing its when_to_use.
max_turns: lots
---
body
"""


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def _run(runner: CliRunner, *args: str, env: dict[str, str] | None = None):
    return runner.invoke(main, list(args), env=env, catch_exceptions=False)


def test_validate_json_lists_agents_with_every_field_and_warnings(runner, tmp_path):
    (tmp_path / "good.md").write_text(GOOD)
    (tmp_path / "bad.md").write_text(BAD)
    result = _run(runner, "agents", "validate", str(tmp_path), "--json")
    assert result.exit_code == 1
    out = json.loads(result.output)
    [agent] = out["agents"]
    assert agent["name"] == "disk_checker"
    assert agent["source"] == "disk"
    assert agent["path"] == str(tmp_path / "good.md")
    assert agent["tools"] == ["host_probe", "bash"]
    assert agent["unknown_fields"] == {"color": "teal"}
    assert agent["max_turns"] == 15 and agent["permission_mode"] == "read-only"
    [warning] = out["warnings"]
    assert warning["path"] == str(tmp_path / "bad.md")
    assert "when_to_use: required field is missing" in warning["reason"]
    assert "max_turns" in warning["reason"]


def test_validate_exits_0_when_clean_and_recursive_descends(runner, tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "good.md").write_text(GOOD)
    flat = _run(runner, "agents", "validate", str(tmp_path), "--json")
    assert json.loads(flat.output)["agents"] == [] and flat.exit_code == 0
    deep = _run(runner, "agents", "validate", "-r", str(tmp_path), "--json")
    assert deep.exit_code == 0
    assert [a["name"] for a in json.loads(deep.output)["agents"]] == ["disk_checker"]


def test_validate_reports_duplicate_names(runner, tmp_path):
    (tmp_path / "a.md").write_text(GOOD)
    (tmp_path / "b.md").write_text(GOOD)
    out = json.loads(_run(runner, "agents", "validate", str(tmp_path), "--json").output)
    assert len(out["agents"]) == 1
    assert "duplicate persona name 'disk_checker'" in out["warnings"][0]["reason"]


def test_validate_human_output(runner, tmp_path):
    (tmp_path / "bad.md").write_text(BAD)
    result = _run(runner, "agents", "validate", str(tmp_path / "bad.md"))
    assert result.exit_code == 1
    assert "bad.md" in result.output and "0 valid, 1 warning(s)" in result.output


def test_shipped_personas_validate_clean(runner):
    result = _run(runner, "agents", "validate", str(REPO / "agents"), "--json")
    assert result.exit_code == 0, result.output
    names = {a["name"] for a in json.loads(result.output)["agents"]}
    assert names == {
        "incident_investigator",
        "disk_specialist",
        "specialist-ops",
        "change_reviewer",
        "reviewer",
        "specialist-clickhouse",
    }


def test_list_merges_builtin_disk_and_external_dirs(runner, tmp_path, monkeypatch):
    ext = tmp_path / "ext"
    ext.mkdir()
    (ext / "good.md").write_text(GOOD)
    monkeypatch.chdir(REPO)
    env = {
        "ONGRID_AGENTS_EXTERNAL_DIRS": str(ext),
        "ONGRID_MARKETPLACE_ROOT": str(tmp_path / "m"),
        "ONGRID_DATA_DIR": str(tmp_path / "data"),
    }
    out = json.loads(_run(runner, "agents", "list", "--json", env=env).output)
    by_name = {a["name"]: a for a in out["agents"]}
    assert by_name["generalist"]["source"] == "builtin"
    assert by_name["disk_specialist"]["source"] == "disk"
    assert by_name["disk_checker"]["path"] == str(ext / "good.md")
    assert all(a["available"] for a in out["agents"])
    assert {"path": str(tmp_path / "m"), "reason": "agents directory does not exist"} in out[
        "warnings"
    ]


def test_bag_shows_class_confirmation_and_dropped(runner, monkeypatch):
    monkeypatch.chdir(REPO)
    out = json.loads(
        _run(runner, "agents", "bag", "specialist-ops", "--role", "viewer", "--json").output
    )
    tools = {t["name"]: t for t in out["tools"]}
    assert set(tools) == {"host_probe", "get_edge_summary", "query_promql", "query_knowledge"}
    dropped = {d["name"]: d["reason"] for d in out["dropped"]}
    assert dropped["host_restart_service"] == "not visible to role 'viewer'"
    admin = json.loads(
        _run(runner, "agents", "bag", "specialist-ops", "--role", "admin", "--json").output
    )
    confirmations = {t["name"]: t["confirmation"] for t in admin["tools"]}
    assert confirmations["host_restart_service"] == "once"
    assert confirmations["host_reboot"] == "dual"
    assert confirmations["host_probe"] == "none"


def test_bag_errors_name_what_is_known(runner, monkeypatch):
    monkeypatch.chdir(REPO)
    unknown_agent = runner.invoke(main, ["agents", "bag", "nope"])
    assert unknown_agent.exit_code == 1 and "known: change_reviewer" in unknown_agent.output
    unknown_role = runner.invoke(main, ["agents", "bag", "reviewer", "--role", "root"])
    assert unknown_role.exit_code == 1 and "unknown role 'root'" in unknown_role.output


# -- lint ------------------------------------------------------------------------------------


#: The settings every tool of the standard catalog needs, unset: lint must not see the host's.
_BACKENDS = (
    "PROMETHEUS_URL",
    "LOKI_URL",
    "TEMPO_URL",
    "CLICKHOUSE_URL",
    "ONGRID_TOPOLOGY_FILE",
    "ONGRID_KNOWLEDGE_DIRS",
    "ONGRID_REPO_ROOT",
)


def _lint_env(tmp_path: Path, **extra: str | None) -> dict[str, str | None]:
    """A site of its own: no shipped personas, an empty marketplace, a data dir in tmp."""
    (tmp_path / "market").mkdir(exist_ok=True)
    env: dict[str, str | None] = {var: None for var in _BACKENDS}
    env |= {
        "ONGRID_CONFIG": None,
        "ONGRID_AGENTS_EXTERNAL_DIRS": None,
        "ONGRID_SHIPPED_AGENTS": "false",
        "ONGRID_MARKETPLACE_ROOT": str(tmp_path / "market"),
        "ONGRID_DATA_DIR": str(tmp_path / "data"),
        # The builtin generalist inherits every tool: with these set it lints clean.
        **{var: "http://127.0.0.1:9" for var in _BACKENDS},
        "ONGRID_KNOWLEDGE_DIRS": str(tmp_path),
        "ONGRID_TOPOLOGY_FILE": str(tmp_path / "topology.yaml"),
        "ONGRID_REPO_ROOT": str(tmp_path),
    }
    return env | extra


def _lint(runner: CliRunner, agents: Path, *args: str, env: dict[str, str | None]):
    return runner.invoke(
        main,
        ["agents", "lint", "--agents-dir", str(agents), *args],
        env=env,
        catch_exceptions=False,
    )


def _agent(directory: Path, name: str, hint: str, tools: str) -> None:
    directory.mkdir(exist_ok=True)
    (directory / f"{name}.md").write_text(
        f"---\nname: {name}\ndescription: The {name}.\nwhen_to_use: {hint}\n"
        f"tools: {tools}\n---\n# {name}\n"
    )


def test_lint_exits_0_on_a_clean_directory(runner, tmp_path):
    agents = tmp_path / "agents"
    _agent(agents, "disk_checker", "When disks fill up.", "host_probe, bash")
    _agent(agents, "metrics_reader", "When a dashboard looks wrong.", "query_promql")
    result = _lint(runner, agents, env=_lint_env(tmp_path))
    assert result.exit_code == 0, result.output
    users, summary = result.output.strip().splitlines()
    assert summary == "no findings"
    # Run away from the data directory: it says which database it did not find.
    assert users.startswith("user personas: none read, no database at sqlite")
    assert users.endswith("(set ONGRID_DATA_DIR or ONGRID_DATABASE_URL to the one the API uses)")
    as_json = _lint(runner, agents, "--json", env=_lint_env(tmp_path))
    assert as_json.exit_code == 0 and json.loads(as_json.output) == {"role": None, "findings": []}


def test_lint_json_lists_each_finding_and_exits_1(runner, tmp_path):
    agents = tmp_path / "agents"
    _agent(agents, "disk_checker", "When disks fill up.", "host_probe, host_prob")
    _agent(agents, "disk_watcher", "When DISKS fill up!", "host_probe")
    (agents / "broken.md").write_text("no frontmatter\n")
    result = _lint(runner, agents, "--json", env=_lint_env(tmp_path))
    assert result.exit_code == 1
    out = json.loads(result.output)
    assert out["role"] is None
    assert [(f["kind"], f["persona"], f["subject"]) for f in out["findings"]] == [
        ("load", "", ""),
        ("unknown_tool", "disk_checker", "host_prob"),
        ("when_to_use_collision", "disk_checker", "disk_watcher"),
        ("when_to_use_collision", "disk_watcher", "disk_checker"),
    ]
    load, unknown = out["findings"][:2]
    assert load["path"] == str(agents / "broken.md") and "frontmatter" in load["reason"]
    assert set(unknown) == {"kind", "persona", "source", "path", "subject", "reason", "hint"}
    assert unknown["source"] == "disk" and unknown["path"] == str(agents / "disk_checker.md")
    assert unknown["hint"] == "did you mean 'host_probe'?"


def test_lint_human_output_groups_by_persona_and_names_unset_settings(runner, tmp_path):
    agents = tmp_path / "agents"
    _agent(agents, "timid", "When a service must restart.", "host_probe, host_restart_service")
    env = _lint_env(tmp_path, PROMETHEUS_URL=None)
    result = _lint(runner, agents, "--role", "admin", env=env)
    assert result.exit_code == 1
    lines = result.output.splitlines()
    # timid lists a write tool it may not run; the builtin generalist inherits query_promql,
    # whose setting is unset here: said last, per setting, not per persona.
    assert lines[0] == f"timid (disk, {agents / 'timid.md'})"
    assert lines[1].startswith("  dropped_tool tools lists 'host_restart_service', of class write")
    assert lines[2] == "settings unset here (1)"
    assert lines[3].startswith("  missing_config prometheus_url: query_promql for generalist → set")
    assert lines[-1] == (
        "2 finding(s) in 2 persona(s); 1 of them come from settings unset here (PROMETHEUS_URL), "
        "not from the persona files: --skip-config leaves them out"
    )
    skipped = _lint(runner, agents, "--skip-config", "--json", env=env)
    assert [f["kind"] for f in json.loads(skipped.output)["findings"]] == ["dropped_tool"]


def test_lint_role_narrows_the_bags(runner, tmp_path):
    agents = tmp_path / "agents"
    _agent(agents, "sheller", "When a command must run.", "bash")
    assert _lint(runner, agents, env=_lint_env(tmp_path)).exit_code == 0
    viewer = _lint(runner, agents, "--role", "viewer", "--json", env=_lint_env(tmp_path))
    assert viewer.exit_code == 1
    out = json.loads(viewer.output)
    assert out["role"] == "viewer"
    assert [(f["kind"], f["persona"]) for f in out["findings"]] == [("no_tools", "sheller")]


def test_lint_usage_errors_exit_2(runner, tmp_path):
    agents = tmp_path / "agents"
    agents.mkdir()
    env = _lint_env(tmp_path)
    role = _lint(runner, agents, "--role", "root", env=env)
    assert role.exit_code == 2 and "unknown role 'root'; known: admin" in role.output
    missing = _lint(runner, tmp_path / "nowhere", env=env)
    assert missing.exit_code == 2 and "does not exist" in missing.output
    (tmp_path / "bad.yaml").write_text("roles: [\n")
    config = _lint(
        runner, agents, env=_lint_env(tmp_path, ONGRID_CONFIG=str(tmp_path / "bad.yaml"))
    )
    assert config.exit_code == 2 and "is not valid YAML" in config.output


def test_shipped_personas_lint_clean_but_for_settings_unset_here(runner, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    env = _lint_env(tmp_path, ONGRID_SHIPPED_AGENTS=None, **{var: None for var in _BACKENDS})
    full = runner.invoke(main, ["agents", "lint", "--json"], env=env, catch_exceptions=False)
    assert full.exit_code == 1
    kinds = {f["kind"] for f in json.loads(full.output)["findings"]}
    # The reviewer's `*_skill` matches the skill tools (load_skill, read_file_skill), which
    # every catalog holds: the pattern is not dead.
    assert kinds == {"missing_config"}
    rest = runner.invoke(main, ["agents", "lint", "--skip-config", "--json"], env=env)
    assert rest.exit_code == 0, rest.output
    assert json.loads(rest.output)["findings"] == []


def test_import_writes_valid_personas_and_reports(runner, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "reviewer.md").write_text(
        "---\nname: Code Reviewer\ndescription: Reviews code.\ntools: Read, Grep, host_probe\n"
        "model: sonnet\ncolor: red\n---\nYou review code.\n"
    )
    out_dir = tmp_path / "out"
    result = _run(
        runner,
        "agents",
        "import",
        "--from",
        "claude-code",
        str(src),
        "--out",
        str(out_dir),
        "--json",
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    [item] = report["imported"]
    assert item["name"] == "code-reviewer" and report["unknown_tools"] == ["Grep", "Read"]
    check = json.loads(_run(runner, "agents", "validate", str(out_dir), "--json").output)
    [agent] = check["agents"]
    assert agent["when_to_use"] == "Reviews code."
    assert agent["model"] == "anthropic/claude-sonnet-4-6"
    assert agent["unknown_fields"] == {"color": "red"}
    assert agent["body"] == "You review code.\n"


def test_installed_console_script_runs():
    exe = shutil.which("ongrid", path=str(Path(sys.executable).parent))
    assert exe, "the ongrid console script is not installed next to this interpreter"
    proc = subprocess.run(
        [exe, "agents", "validate", str(REPO / "agents")], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert "6 valid, 0 warning(s)" in proc.stdout


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:  # bound, never listening: connecting is refused at once
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize(
    "args",
    [
        ("spawn", "generalist", "--prompt", "hi"),
        ("agents", "reload"),
        ("api", "--port", "0"),
    ],
    ids=["spawn", "reload", "api"],
)
def test_an_unreachable_redis_is_one_line_naming_it(args: tuple[str, ...], tmp_path):
    exe = shutil.which("ongrid", path=str(Path(sys.executable).parent))
    assert exe
    port = _closed_port()
    env = {"PATH": "/usr/bin:/bin", "REDIS_URL": f"redis://127.0.0.1:{port}/0"}
    proc = subprocess.run(
        [exe, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr, proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("Error:")]
    assert line.startswith(f"Error: Redis at 127.0.0.1:{port} is unreachable (")
    assert line.endswith("start it or set REDIS_URL")


@pytest.mark.skipif(not CORPUS.is_dir(), reason=f"corpus not found at {CORPUS}")
def test_whole_corpus_through_validate_and_import(runner, tmp_path):
    files = sorted(f for f in CORPUS.rglob("*.md") if f.name != "SOURCES.md")
    assert len(files) == 967
    raw = _run(runner, "agents", "validate", "-r", str(CORPUS), "--json")
    raw_out = json.loads(raw.output)
    # Claude Code files have no when_to_use: validate must say so for each, without crashing.
    assert raw.exit_code == 1
    reasons = {w["path"]: w["reason"] for w in raw_out["warnings"]}
    assert set(reasons) >= {str(f) for f in files}
    assert all("when_to_use" in reasons[str(f)] for f in files)

    out_dir = tmp_path / "imported"
    imp = _run(
        runner,
        "agents",
        "import",
        "--from",
        "claude-code",
        str(CORPUS),
        "--out",
        str(out_dir),
        "--json",
    )
    report = json.loads(imp.output)
    accounted = {i["source"] for i in report["imported"]} | {s["path"] for s in report["skipped"]}
    assert accounted == {str(f) for f in files}
    assert len(report["imported"]) == 966
    [skipped] = report["skipped"]
    assert skipped["path"].endswith("vue/vue-state-manager.md")
    assert "'vue-component-architect' is already taken" in skipped["reason"]
    assert "Read" in report["unknown_tools"] and "Bash" in report["unknown_tools"]

    # Every output file is a valid persona; across collections the same name repeats, which
    # validate (like the registry) reports as a duplicate, not as an invalid file.
    again = json.loads(_run(runner, "agents", "validate", "-r", str(out_dir), "--json").output)
    problems = [w for w in again["warnings"] if "duplicate persona name" not in w["reason"]]
    assert problems == []
    assert len(again["agents"]) + len(again["warnings"]) == 966


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (("api", "--help"), "--port INTEGER [default: 8080]"),
        (("up", "--help"), "API port. [default: 8080"),
        (("ask", "--help"), "http://127.0.0.1:8080"),
    ],
)
def test_the_api_listens_where_the_documents_curl_it(runner: CliRunner, args, shown):
    """Their calls target http://localhost:8080/api/v1/chat."""
    out = runner.invoke(main, list(args), terminal_width=200).output
    assert shown in " ".join(out.split()), out
