"""registry.lint: each kind of finding, none on a clean set, and the shipped personas."""

from __future__ import annotations

import re
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from registry.agent_registry import LoadWarning, Snapshot
from registry.claude_import import convert_claude_file
from registry.defaults import build_registry
from registry.errors import NotFoundError
from registry.lint import COLLISION_THRESHOLD, Finding, FindingKind, hint_tokens, lint
from registry.persona import Persona, Source
from registry.settings import RoleConfig, Settings
from registry.tools import ToolCatalog, ToolContext, function_tool
from workers.tools import STANDARD_TOOLS, default_catalog

CORPUS = Path(__file__).resolve().parents[3] / "shared" / "corpus" / "claude-code-agents"


def _tool(name: str, tool_class: str = "read", requires: tuple[str, ...] = ()) -> Any:
    def impl() -> str:
        return name

    impl.__doc__ = f"The {name} tool."
    return function_tool(tool_class, name=name, requires=requires)(impl)


CATALOG = ToolCatalog(
    [
        _tool("query_promql", requires=("prometheus_url",)),
        _tool("query_logql", requires=("loki_url",)),
        _tool("search_logs", requires=("loki_url",)),
        _tool("query_site", requires=("site_token",)),
        _tool("host_probe"),
        _tool("host_shell"),
        _tool("restart_service", "write"),
        _tool("delete_volume", "destructive"),
    ]
)
#: Every setting the catalog's tools need, set.
CONFIGURED = Settings(
    prometheus_url="http://prometheus:9090",
    loki_url="http://loki:3100",
    extra={"site_token": "t"},
)


def _persona(name: str, hint: str | None = None, **fields: Any) -> Persona:
    return Persona(
        name=name,
        description=f"The {name} persona.",
        when_to_use=hint or f"When the {name.replace('_', ' ')} question comes up.",
        source=Source.DISK,
        path=f"/agents/{name}.md",
        **fields,
    )


def _snapshot(*personas: Persona, warnings: tuple[LoadWarning, ...] = ()) -> Snapshot:
    return Snapshot(
        version=1, personas=MappingProxyType({p.name: p for p in personas}), warnings=warnings
    )


def _lint(*personas: Persona, settings: Settings = CONFIGURED, **kwargs: Any) -> list[Finding]:
    return lint(_snapshot(*personas), CATALOG, settings, **kwargs)


def _kinds(findings: list[Finding]) -> list[tuple[str, FindingKind, str]]:
    return [(f.persona, f.kind, f.subject) for f in findings]


# -- a clean set -----------------------------------------------------------------------------------


def test_a_clean_set_has_no_finding():
    personas = [
        _persona("metrics_reader", tools=["query_*"], disallowed_tools=["query_logql"]),
        _persona("log_reader", tools=["search_logs", "query_logql"]),
        _persona("inherits_the_role", disallowed_tools=["host_*"]),
        _persona(
            "fixer",
            tools=["host_probe", "restart_service", "delete_volume"],
            permission_mode="dual-sign-required",
        ),
        _persona(
            "prober",
            "When the user asks whether a host is up.\nWhen the user asks whether a host is up.",
            tools=["host_probe"],
        ),
    ]
    assert _lint(*personas) == []
    assert _lint(*personas, role="admin") == []


def test_load_warnings_come_first_as_load_findings():
    snap = _snapshot(
        _persona("fine", tools=["host_probe"]),
        warnings=(LoadWarning("/agents/broken.md", "frontmatter: missing"),),
    )
    [finding] = lint(snap, CATALOG, CONFIGURED)
    assert finding == Finding(FindingKind.LOAD, "frontmatter: missing", path="/agents/broken.md")
    assert finding.as_dict()["persona"] == "" and finding.as_dict()["kind"] == "load"


def test_an_unknown_role_names_the_known_ones():
    with pytest.raises(NotFoundError, match="known: admin, operator, viewer"):
        _lint(_persona("p"), role="root")


# -- tool names ------------------------------------------------------------------------------------


def test_unknown_tool_suggests_close_names():
    [finding] = _lint(_persona("typo", tools=["host_probe", "query_promq"]))
    assert (finding.kind, finding.subject) == (FindingKind.UNKNOWN_TOOL, "query_promq")
    assert "dropped from the bag" in finding.reason
    assert finding.hint == "did you mean 'query_promql'?"
    assert (finding.source, finding.path) == ("disk", "/agents/typo.md")


def test_unknown_tool_without_a_close_name_says_how_to_add_one():
    [finding] = _lint(_persona("claude", tools=["host_probe", "WebFetch"]))
    assert finding.kind is FindingKind.UNKNOWN_TOOL
    assert finding.hint == "remove it, or add a tool of that name through tool_modules"


def test_a_misspelt_blacklist_entry_is_reported_because_it_keeps_nothing_out():
    [finding] = _lint(_persona("loose", tools=["host_*"], disallowed_tools=["host_shel"]))
    assert (finding.kind, finding.subject) == (FindingKind.UNKNOWN_TOOL, "host_shel")
    assert "disallowed_tools" in finding.reason and "keeps nothing out" in finding.reason
    assert "'host_shell'" in finding.hint


def test_patterns_that_match_nothing_in_either_list():
    findings = _lint(
        _persona("k8s", tools=["query_*", "kube_*"], disallowed_tools=["*_skill", "query_l*"])
    )
    assert _kinds(findings) == [
        ("k8s", FindingKind.PATTERN_MATCHES_NOTHING, "kube_*"),
        ("k8s", FindingKind.PATTERN_MATCHES_NOTHING, "*_skill"),
    ]
    assert "adds no tool" in findings[0].reason and "keeps nothing out" in findings[1].reason


# -- dropped tools and empty bags ------------------------------------------------------------------


def test_a_whitelisted_tool_the_mode_forbids_is_dropped_with_the_mode_to_use():
    findings = _lint(_persona("timid", tools=["host_probe", "restart_service", "delete_volume"]))
    assert _kinds(findings) == [
        ("timid", FindingKind.DROPPED_TOOL, "restart_service"),
        ("timid", FindingKind.DROPPED_TOOL, "delete_volume"),
    ]
    assert "class write" in findings[0].reason and "read-only" in findings[0].reason
    assert findings[0].hint.startswith("use permission_mode mutating-with-confirm")
    assert findings[1].hint.startswith("use permission_mode dual-sign-required")


def test_a_tool_in_both_lists_and_the_agent_tool_are_dropped():
    findings = _lint(
        _persona(
            "torn", tools=["host_probe", "host_shell", "spawn_agent"], disallowed_tools=["host_s*"]
        )
    )
    assert _kinds(findings) == [
        ("torn", FindingKind.DROPPED_TOOL, "host_shell"),
        ("torn", FindingKind.DROPPED_TOOL, "spawn_agent"),
    ]
    assert "'host_s*'" in findings[0].reason and "black wins" in findings[0].reason
    assert "never in a worker's bag" in findings[1].reason


def test_no_tools_says_when_the_mode_alone_empties_the_bag():
    findings = _lint(_persona("writer", tools=["restart_service"]))
    assert _kinds(findings) == [
        ("writer", FindingKind.DROPPED_TOOL, "restart_service"),
        ("writer", FindingKind.NO_TOOLS, ""),
    ]
    assert "permission_mode read-only leaves no tool" in findings[1].reason
    assert "restart_service" in findings[1].reason
    assert findings[1].hint.startswith("use permission_mode mutating-with-confirm")


def test_no_tools_when_the_blacklist_takes_everything():
    [finding] = _lint(_persona("nothing", disallowed_tools=["*"]))
    assert finding.kind is FindingKind.NO_TOOLS
    assert "empty for every role linted (admin, operator, viewer)" in finding.reason


def test_an_empty_bag_for_one_role_is_a_finding_only_when_that_role_is_linted():
    shell = _persona("shell_only", tools=["host_shell"])
    assert _lint(shell) == []  # admin and operator get host_shell
    [finding] = _lint(shell, role="viewer")
    assert finding.kind is FindingKind.NO_TOOLS and "(viewer)" in finding.reason
    assert "mode" not in finding.reason


def test_roles_come_from_the_settings():
    settings = CONFIGURED.model_copy(update={"roles": {"ops": RoleConfig(tools=["query_*"])}})
    [finding] = _lint(_persona("prober", tools=["host_probe"]), settings=settings)
    assert finding.kind is FindingKind.NO_TOOLS and "(ops)" in finding.reason


# -- catalog lines ---------------------------------------------------------------------------------


def test_identical_catalog_lines_collide_whatever_the_case_and_punctuation():
    a = _persona("disks", "When disks fill up.\nAlso for inodes.", tools=["host_probe"])
    b = _persona("storage", "when DISKS fill up!!\nAlso for mounts.", tools=["host_probe"])
    findings = _lint(a, b)
    assert _kinds(findings) == [
        ("disks", FindingKind.WHEN_TO_USE_COLLISION, "storage"),
        ("storage", FindingKind.WHEN_TO_USE_COLLISION, "disks"),
    ]
    assert "the same as that of 'storage' (/agents/storage.md)" in findings[0].reason


def test_near_identical_lines_collide_and_distinct_ones_with_a_common_opening_do_not():
    base = "When the user asks about slow ClickHouse queries, merges or replica lag on a cluster"
    near = _persona("near", base + " node.", tools=["host_probe"])
    same = _persona("same", base + ".", tools=["host_probe"])
    other = _persona(
        "other", "When the user asks about slow Postgres queries or vacuum.", tools=["host_probe"]
    )
    findings = _lint(near, same, other)
    assert _kinds(findings) == [
        ("near", FindingKind.WHEN_TO_USE_COLLISION, "same"),
        ("same", FindingKind.WHEN_TO_USE_COLLISION, "near"),
    ]
    assert "nearly the same (94% of words shared)" in findings[0].reason


def test_hint_tokens_fold_case_width_and_punctuation():
    assert hint_tokens("When ＤＩＳＫＳ fill-up, (really)!") == {
        "when",
        "disks",
        "fill",
        "up",
        "really",
    }
    assert hint_tokens("ClickHouse 查询性能 / 分区健康") == {"clickhouse", "查询性能", "分区健康"}
    assert hint_tokens("— … —") == frozenset()


def test_lines_without_words_collide_only_when_the_same():
    a = _persona("dash", "—", tools=["host_probe"])
    b = _persona("dots", "…", tools=["host_probe"])
    c = _persona("dash_too", "—", tools=["host_probe"])
    assert _kinds(_lint(a, b, c)) == [
        ("dash", FindingKind.WHEN_TO_USE_COLLISION, "dash_too"),
        ("dash_too", FindingKind.WHEN_TO_USE_COLLISION, "dash"),
    ]


@pytest.mark.skipif(not CORPUS.is_dir(), reason=f"corpus not found at {CORPUS}")
def test_collisions_on_the_corpus_are_copies_but_for_two_pairs():
    personas = {}
    for path in sorted(CORPUS.rglob("*.md")):
        if path.name == "SOURCES.md":
            continue
        key = re.sub(r"[^a-z0-9]+", "-", str(path.relative_to(CORPUS)).lower()).strip("-")
        persona = convert_claude_file(path).persona
        personas[key] = persona.model_copy(update={"name": key, "path": str(path)})
    assert len(personas) == 967
    findings = lint(
        Snapshot(1, MappingProxyType(personas)), ToolCatalog(), Settings(), role="admin"
    )
    pairs = {
        tuple(sorted((f.persona, f.subject))): f.reason
        for f in findings
        if f.kind is FindingKind.WHEN_TO_USE_COLLISION
    }
    stem = {key: Path(str(p.path)).stem for key, p in personas.items()}
    near = sorted((stem[a], stem[b]) for (a, b), reason in pairs.items() if "nearly" in reason)
    assert len(pairs) == 122 and len(near) == 3
    # Of the near ones, ios-developer is one persona in two collections; the other two a reader
    # tells apart (the false positives of the measure).
    assert near == [
        ("agent-sdk-verifier-py", "agent-sdk-verifier-ts"),
        ("ios-developer", "ios-developer"),
        ("react-nextjs-expert", "vue-nuxt-expert"),
    ]
    assert COLLISION_THRESHOLD == 0.8


# -- settings --------------------------------------------------------------------------------------


def test_missing_config_names_the_setting_its_tools_and_the_variable():
    persona = _persona("observer", tools=["query_*", "search_logs", "host_probe"])
    findings = _lint(persona, settings=Settings(extra={"site_token": "t"}))
    assert _kinds(findings) == [
        ("observer", FindingKind.MISSING_CONFIG, "loki_url"),
        ("observer", FindingKind.MISSING_CONFIG, "prometheus_url"),
    ]
    assert findings[0].reason.startswith("query_logql, search_logs need setting loki_url")
    assert findings[0].hint.startswith("set LOKI_URL (or loki_url in ONGRID_CONFIG)")
    assert findings[1].reason.startswith("query_promql needs setting prometheus_url")


def test_a_required_extra_key_is_set_in_the_config_file():
    [finding] = _lint(_persona("site", tools=["query_site"]), settings=Settings())
    assert finding.subject == "site_token"
    assert finding.hint.startswith("set site_token in ONGRID_CONFIG")


def test_only_tools_in_the_bag_need_their_settings():
    kept_out = _persona("no_logs", tools=["query_*"], disallowed_tools=["query_logql"])
    settings = Settings(prometheus_url="http://p:9090", extra={"site_token": "t"})
    assert _lint(kept_out, settings=settings) == []
    # For a role that does not see the tool, its setting is not needed either.
    viewer_only = Settings(
        roles={"viewer": RoleConfig(tools=["host_*"])}, prometheus_url="", loki_url=""
    )
    assert _lint(_persona("all_of_them"), settings=viewer_only) == []


# -- the real catalog and the shipped personas -----------------------------------------------------


def test_the_shipped_personas_lint_clean_but_for_settings_unset_here(tmp_path: Path):
    (tmp_path / "m").mkdir()
    settings = Settings(agents_dir=tmp_path / "none", marketplace_root=tmp_path / "m")
    snap = build_registry(settings).snapshot()
    assert len(snap.personas) == 7
    findings = lint(snap, default_catalog(), settings)
    assert findings and {f.kind for f in findings} == {FindingKind.MISSING_CONFIG, *_SKILL_KINDS}
    configured = settings.model_copy(
        update={
            key: "set"
            for key in (
                "prometheus_url",
                "loki_url",
                "tempo_url",
                "clickhouse_url",
                "topology_file",
                "repo_root",
            )
        }
        | {"knowledge_dirs": [tmp_path]}
    )
    assert [(f.persona, f.kind, f.subject) for f in lint(snap, default_catalog(), configured)] == [
        ("reviewer", FindingKind.PATTERN_MATCHES_NOTHING, "*_skill")
    ]


#: The reviewer keeps every skill tool out (``disallowed_tools: ["*_skill"]``, as the source
#: documents write it) before any skill tool is installed: until one is, the lint says the
#: pattern keeps nothing out, which is true.
_SKILL_KINDS = {FindingKind.PATTERN_MATCHES_NOTHING}


#: Valid arguments for each standard tool that declares a required setting.
_ARGUMENTS: dict[str, dict[str, Any]] = {
    "query_promql": {"query": "up"},
    "query_logql": {"query": '{app="api"}'},
    "search_logs": {"selector": '{app="api"}'},
    "query_traceql": {"query": "{}"},
    "query_clickhouse_system": {"sql": "SELECT 1 FROM system.one"},
    "find_topology_node": {"query": "db1"},
    "expand_topology": {"node_id": "db1"},
    "query_devices": {},
    "query_knowledge": {"query": "disk full"},
    "search_knowledge": {"query": "disk full"},
    "read_repo": {"path": "README.md"},
}


def test_each_declared_requirement_is_what_the_tool_answers_not_configured_without():
    from registry.settings import env_var_of

    declaring = [t for t in STANDARD_TOOLS if t.requires]
    assert sorted(t.name for t in declaring) == sorted(_ARGUMENTS)
    for tool in declaring:
        result = tool.run(
            tool.validate_arguments(_ARGUMENTS[tool.name]), ToolContext(settings=Settings())
        )
        assert result.is_error and "is not configured" in result.content, tool.name
        for key in tool.requires:
            assert f"set {env_var_of(key)} " in result.content, (tool.name, key)
