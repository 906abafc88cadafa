"""registry.policy: the four steps of the tool bag (SPEC §4), in order, and what is dropped."""

from __future__ import annotations

from typing import Any

import pytest

from registry.persona import PermissionMode, Persona
from registry.policy import (
    Confirmation,
    DroppedTool,
    confirmation_for,
    matches_any,
    resolve_bag,
)
from registry.settings import Settings
from registry.tools import ToolCatalog, ToolClass, function_tool


def _tool(name: str, tool_class: str) -> Any:
    def impl(target: str = "") -> str:
        return f"{name}({target})"

    impl.__doc__ = f"The {name} tool."
    return function_tool(tool_class, name=name)(impl)


CATALOG = ToolCatalog(
    [
        _tool("query_promql", "read"),
        _tool("query_logs", "read"),
        _tool("search_logs", "safe"),
        _tool("host_probe", "read"),
        _tool("install_skill", "read"),
        _tool("restart_service", "write"),
        _tool("write_file", "write"),
        _tool("delete_volume", "destructive"),
        _tool("spawn_agent", "read"),
    ]
)
READS = ["query_promql", "query_logs", "search_logs", "host_probe", "install_skill"]
ALL = ["*"]


def _persona(**fields: Any) -> Persona:
    return Persona(name="p", description="d", when_to_use="w", **fields)


def _bag(role: list[str] = ALL, **fields: Any) -> Any:
    return resolve_bag(_persona(**fields), CATALOG, role, role="ops")


def _dropped(bag: Any) -> dict[str, str]:
    return {d.name: d.reason for d in bag.dropped}


# -- step 1 and 2: role, whitelist -------------------------------------------------------------


def test_empty_tools_inherits_the_role_set() -> None:
    bag = _bag()
    assert bag.names() == READS
    assert all(e.confirmation is Confirmation.NONE for e in bag)


def test_a_bundles_tools_are_never_inherited_only_asked_for() -> None:
    """A generalist (empty ``tools``, role ``*``) gets the runtime's own tools and none a plugin
    or an MCP server brought; naming one, or a pattern that matches it, brings it in."""
    restart = _tool("ops__restart_skill", "read")
    restart.bundle = "ops"
    clock = _tool("mcp__timekit__time__now", "read")
    clock.bundle = "timekit"
    catalog = ToolCatalog([*CATALOG, restart, clock])
    generalist = resolve_bag(_persona(), catalog, ALL)
    assert generalist.names() == READS
    assert not {d.name for d in generalist.dropped} & {restart.name, clock.name}
    named = resolve_bag(_persona(tools=["host_probe", "ops__restart_skill"]), catalog, ALL)
    assert named.names() == ["host_probe", "ops__restart_skill"]
    assert resolve_bag(_persona(tools=["mcp__timekit__*"]), catalog, ALL).names() == [
        "mcp__timekit__time__now"
    ]
    assert "ops__restart_skill" in resolve_bag(_persona(tools=["*"]), catalog, ALL).names()


def test_role_patterns_limit_the_bag() -> None:
    assert _bag(["query_*", "host_probe"]).names() == ["query_promql", "query_logs", "host_probe"]
    assert _bag([]).names() == []


def test_whitelist_intersects_with_the_role() -> None:
    bag = _bag(["query_*"], tools=["query_promql", "host_probe", "restart_service"])
    assert bag.names() == ["query_promql"]
    assert _dropped(bag) == {
        "host_probe": "not visible to role 'ops'",
        "restart_service": "not visible to role 'ops'",
    }


def test_role_label_defaults_to_the_callers_role() -> None:
    bag = resolve_bag(_persona(tools=["host_probe"]), CATALOG, ["query_*"])
    assert bag.dropped == (DroppedTool("host_probe", "not visible to the caller's role"),)


def test_wildcard_whitelist() -> None:
    assert _bag(tools=["query_*"]).names() == ["query_promql", "query_logs"]
    assert _bag(tools=["*_logs"]).names() == ["query_logs", "search_logs"]
    assert _bag(tools=["*"]).names() == READS


def test_whitelist_given_as_comma_string() -> None:
    assert _bag(tools="host_probe, query_logs").names() == ["query_logs", "host_probe"]


# -- step 3: blacklist -------------------------------------------------------------------------


def test_blacklist_removes_matches() -> None:
    bag = _bag(disallowed_tools=["*_skill"])
    assert "install_skill" not in bag
    assert _dropped(bag)["install_skill"] == "matches disallowed_tools pattern '*_skill'"


def test_black_wins_over_white() -> None:
    bag = _bag(tools=["query_*", "install_skill"], disallowed_tools=["query_logs", "*_skill"])
    assert bag.names() == ["query_promql"]
    assert _dropped(bag) == {
        "query_logs": "matches disallowed_tools pattern 'query_logs'",
        "install_skill": "matches disallowed_tools pattern '*_skill'",
    }


# -- step 4: permission mode -------------------------------------------------------------------


def test_read_only_keeps_only_read_tools() -> None:
    bag = _bag(permission_mode="read-only")
    assert bag.names() == READS
    assert _dropped(bag) == {
        "restart_service": "class write is not allowed under permission_mode read-only",
        "write_file": "class write is not allowed under permission_mode read-only",
        "delete_volume": "class destructive is not allowed under permission_mode read-only",
    }


def test_mutating_with_confirm_adds_write_tools_confirmed_once() -> None:
    bag = _bag(permission_mode="mutating-with-confirm")
    assert bag.names() == [*READS, "restart_service", "write_file"]
    assert bag.entry("restart_service").confirmation is Confirmation.ONCE
    assert bag.entry("write_file").confirmation is Confirmation.ONCE
    assert bag.entry("query_logs").confirmation is Confirmation.NONE
    assert _dropped(bag) == {
        "delete_volume": "class destructive is not allowed under permission_mode "
        "mutating-with-confirm"
    }


def test_dual_sign_required_adds_destructive_tools_with_dual_sign_off() -> None:
    bag = _bag(permission_mode=PermissionMode.DUAL_SIGN_REQUIRED)
    assert bag.names() == [*READS, "restart_service", "write_file", "delete_volume"]
    assert bag.entry("delete_volume").confirmation is Confirmation.DUAL
    assert bag.entry("write_file").confirmation is Confirmation.ONCE
    assert bag.dropped == ()


@pytest.mark.parametrize(
    ("mode", "tool_class", "expected"),
    [
        ("read-only", "read", Confirmation.NONE),
        ("read-only", "write", None),
        ("read-only", "destructive", None),
        ("mutating-with-confirm", "read", Confirmation.NONE),
        ("mutating-with-confirm", "write", Confirmation.ONCE),
        ("mutating-with-confirm", "destructive", None),
        ("dual-sign-required", "read", Confirmation.NONE),
        ("dual-sign-required", "write", Confirmation.ONCE),
        ("dual-sign-required", "destructive", Confirmation.DUAL),
        ("read-only", "safe", Confirmation.NONE),
    ],
)
def test_confirmation_table(mode: str, tool_class: str, expected: Confirmation | None) -> None:
    assert confirmation_for(PermissionMode(mode), ToolClass(tool_class)) is expected


def test_safe_tools_are_read_tools() -> None:
    assert CATALOG.get("search_logs").tool_class is ToolClass.READ
    assert "search_logs" in _bag(tools=["search_logs"], permission_mode="read-only")


# -- the order of the steps --------------------------------------------------------------------


def test_role_is_checked_before_blacklist_and_blacklist_before_mode() -> None:
    bag = _bag(
        ["query_*", "restart_service"],
        tools=["host_probe", "restart_service", "query_logs"],
        disallowed_tools=["host_probe", "restart_*"],
        permission_mode="read-only",
    )
    assert bag.names() == ["query_logs"]
    assert _dropped(bag) == {
        "host_probe": "not visible to role 'ops'",  # step 1 decides before step 3
        "restart_service": "matches disallowed_tools pattern 'restart_*'",  # step 3 before 4
    }


def test_tools_not_asked_for_are_not_reported() -> None:
    bag = _bag([], tools=["query_promql"])
    assert _dropped(bag) == {"query_promql": "not visible to role 'ops'"}


# -- the AgentTool -----------------------------------------------------------------------------


def test_spawn_agent_is_never_in_a_worker_bag() -> None:
    assert "spawn_agent" not in _bag()
    assert "spawn_agent" not in _dropped(_bag())  # not asked for: nothing to report
    bag = _bag(tools=["spawn_agent", "query_logs"])
    assert bag.names() == ["query_logs"]
    assert _dropped(bag) == {"spawn_agent": "the AgentTool is never in a worker's bag"}
    assert "spawn_agent" not in _bag(tools=["spawn_*"], permission_mode="dual-sign-required")


def test_spawn_agent_is_kept_outside_workers() -> None:
    persona = _persona(tools=["spawn_agent"])
    bag = resolve_bag(persona, CATALOG, ALL, for_worker=False)
    assert bag.names() == ["spawn_agent"] and bag.dropped == ()
    assert "spawn_agent" in resolve_bag(_persona(), CATALOG, ALL, for_worker=False)


# -- dropped names and patterns ----------------------------------------------------------------


def test_whitelisted_names_missing_from_the_catalog_are_reported() -> None:
    bag = _bag(tools=["query_promql", "ssh_exec", "kube_*", "Read"])
    assert bag.names() == ["query_promql"]
    assert bag.dropped == (
        DroppedTool("ssh_exec", "not in the tool catalog"),
        DroppedTool("kube_*", "pattern matches no tool"),
        DroppedTool("Read", "not in the tool catalog"),
    )


def test_star_is_the_only_wildcard() -> None:
    bag = _bag(tools=["query_?", "[q]uery_logs", "query_.*", "host_probe"])
    assert bag.names() == ["host_probe"]
    assert _dropped(bag) == {
        "query_?": "not in the tool catalog",
        "[q]uery_logs": "not in the tool catalog",
        "query_.*": "pattern matches no tool",
    }


@pytest.mark.parametrize(
    ("name", "patterns", "expected"),
    [
        ("query_promql", ["host_*", "query_*", "*"], "query_*"),
        ("query_promql", ["query_?"], None),
        ("query_promql", ["query"], None),  # whole-name match, not a prefix
        ("query_promql", ["promql"], None),
        ("query_promql", ["*promql"], "*promql"),
        ("query.promql", ["query_promql"], None),  # '.' is literal
        ("a+b", ["a+b"], "a+b"),
        ("anything", [], None),
    ],
)
def test_matches_any(name: str, patterns: list[str], expected: str | None) -> None:
    assert matches_any(name, patterns) == expected


# -- the bag object and real roles -------------------------------------------------------------


def test_bag_api() -> None:
    bag = _bag(tools=["write_file", "query_logs"], permission_mode="mutating-with-confirm")
    assert len(bag) == 2 and [e.tool.name for e in bag] == ["query_logs", "write_file"]
    assert bag.entry("delete_volume") is None
    described = bag.entry("write_file").describe()
    assert described["confirmation"] == "once" and described["class"] == "write"
    assert described["name"] == "write_file"


def test_default_viewer_role() -> None:
    roles = Settings.load(environ={}).roles
    bag = resolve_bag(_persona(), CATALOG, roles["viewer"].tools, role="viewer")
    assert bag.names() == ["query_promql", "query_logs", "search_logs", "host_probe"]
    dual = _persona(permission_mode="dual-sign-required")
    admin = resolve_bag(dual, CATALOG, roles["admin"].tools)
    assert admin.names() == [n for n in CATALOG.names() if n != "spawn_agent"]
