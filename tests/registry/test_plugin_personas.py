"""Plugin personas in the registry and the tool policy.

A persona installed with a plugin is named ``<plugin>:<agent>``; only the plugin layer may use
that form (files, user personas and the API refuse it). The registry merges what its ``bundles``
callable returns after the disk layer, keeps those personas read-only with the plugin's reason,
and folds the bundle's digest into its own. Skill tools reach a bag only for a persona with
``skills`` and are blocked by ``disallowed_tools: ["*_skill"]``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from marketplace.catalog import spawn_catalog
from registry.agent_registry import AgentRegistry, InMemoryUserStore, LoadWarning
from registry.errors import PersonaError, ReadOnlyError
from registry.parser import dump_persona, parse_persona, persona_from_mapping, read_document
from registry.persona import PLUGIN_NAME_RESERVED, PermissionMode, Persona, Source
from registry.policy import resolve_bag
from registry.tools import SKILL_TOOL_NAMES, BaseTool, ToolCatalog, function_tool
from workers.tools import default_catalog

PersonaWriter = Callable[..., Path]
ALL = ["*"]


def _p(name: str, **fields: Any) -> Persona:
    fields.setdefault("description", f"{name} persona")
    return Persona(name=name, when_to_use="w", **fields)


def _plugin_persona(plugin: str, agent: str, **fields: Any) -> Persona:
    """A persona as the plugin layer hands it over: qualified name, source and plugin set."""
    return _p(
        f"{plugin}:{agent}",
        source=Source.PLUGIN,
        plugin=plugin,
        path=f"/srv/marketplace/plugins/{plugin}/current/agents/{agent}.md",
        **fields,
    )


@dataclass
class FakeLayer:
    """The smallest object the registry's ``BundleLayer`` protocol asks for."""

    personas: Sequence[Persona] = ()
    warnings: Sequence[LoadWarning] = ()
    digest: str = ""
    tools: Sequence[BaseTool] = field(default_factory=tuple)


class Bundles:
    """A ``bundles=`` callable whose answer the test changes between reloads."""

    def __init__(self, layer: FakeLayer) -> None:
        self.layer = layer
        self.calls = 0

    def __call__(self) -> FakeLayer:
        self.calls += 1
        return self.layer


# -- the reserved name form ----------------------------------------------------------------------


def test_a_disk_file_with_a_plugin_name_is_a_load_warning_and_is_skipped(
    tmp_path: Path, write_persona: PersonaWriter
) -> None:
    bad = write_persona(tmp_path, "ops:x", filename="x.md")
    write_persona(tmp_path, "fine")
    registry = AgentRegistry([tmp_path])
    assert registry.snapshot().names() == ["fine"]
    (warning,) = registry.warnings()
    assert warning.path == str(bad)
    assert PLUGIN_NAME_RESERVED in warning.reason
    assert warning.reason.startswith("name: ")


def test_replace_refuses_a_plugin_name_and_stores_nothing() -> None:
    store = InMemoryUserStore()
    registry = AgentRegistry(user_store=store)
    with pytest.raises(PersonaError) as caught:
        registry.replace(_p("ops:x"))
    assert [(p.field, p.message) for p in caught.value.problems] == [("name", PLUGIN_NAME_RESERVED)]
    assert store.list() == [] and registry.snapshot().names() == []


def test_the_parser_refuses_a_plugin_name_unless_asked_to_accept_one() -> None:
    text = "---\nname: ops:x\ndescription: D.\nwhen_to_use: W.\n---\nBody.\n"
    with pytest.raises(PersonaError) as caught:
        parse_persona(text, path="x.md")
    assert caught.value.problems[0].field == "name"
    assert "reserved for personas installed from a plugin" in str(caught.value)
    with pytest.raises(PersonaError):
        Persona.from_text(text)  # the public constructors never take the plugin form
    with pytest.raises(PersonaError):
        persona_from_mapping({"name": "ops:x", "description": "D.", "when_to_use": "W."})
    assert parse_persona(text, plugin_name=True).persona.name == "ops:x"


@pytest.mark.parametrize("name", ["Ops:x", "ops:", ":x", "ops:x:y", "ops:X", "-ops:x", "ops :x"])
def test_a_malformed_plugin_name_is_refused_even_with_the_flag(name: str) -> None:
    data = {"name": name, "description": "D.", "when_to_use": "W."}
    with pytest.raises(PersonaError) as caught:
        persona_from_mapping(data, plugin_name=True)
    assert caught.value.problems[0].field == "name"


def test_a_plugin_persona_round_trips_through_dump_and_parse() -> None:
    persona = parse_persona(
        "---\nname: my.plugin-2:docker-expert\ndescription: Docker.\nwhen_to_use: Containers.\n"
        "skills: [my.plugin-2:compose, lint]\npermission_mode: mutating-with-confirm\n---\n"
        "You know Docker.\n",
        plugin_name=True,
    ).persona
    assert persona.skills == ["my.plugin-2:compose", "lint"]
    text = dump_persona(persona)
    again = parse_persona(text, plugin_name=True).persona
    assert again == persona and again.body == "You know Docker.\n"
    # What the registry sets is not frontmatter: a dumped plugin persona carries none of it.
    installed = persona.model_copy(
        update={"source": Source.PLUGIN, "plugin": "my.plugin-2", "path": "/x.md"}
    )
    dumped = dump_persona(installed)
    front, _body, _notes = read_document(dumped)
    assert not {"plugin", "source", "path"} & set(front)
    assert parse_persona(dumped, plugin_name=True).persona == persona


# -- the bundle layer in the registry --------------------------------------------------------------


def test_bundle_personas_merge_after_disk_with_source_plugin_and_a_read_only_reason(
    tmp_path: Path, write_persona: PersonaWriter
) -> None:
    write_persona(tmp_path, "x", description="The disk x.")
    layer = FakeLayer(
        personas=[_plugin_persona("ops", "x"), _plugin_persona("tools", "x")],
        warnings=[LoadWarning("/srv/marketplace/plugins/ops/v1", "skills/bad: no SKILL.md")],
        digest="abc",
    )
    bundles = Bundles(layer)
    registry = AgentRegistry([tmp_path], bundles=bundles)
    snap = registry.snapshot()
    assert bundles.calls == 1  # read at the first load
    # Two plugins may ship the same agent name, and neither collides with a disk persona.
    assert snap.names() == ["ops:x", "tools:x", "x"]
    assert snap.get("x").source is Source.DISK and dict(snap.shadowed) == {}
    plugin_x = snap.get("ops:x")
    assert plugin_x.source is Source.PLUGIN and plugin_x.plugin == "ops"
    assert snap.bundle is layer
    reason = snap.read_only["ops:x"]
    assert "'ops:x'" in reason and "plugin 'ops'" in reason and str(plugin_x.path) in reason
    assert "ongrid plugins update|remove" in reason
    described = snap.describe(plugin_x)
    assert described["source"] == "plugin" and described["plugin"] == "ops"
    assert described["editable"] is False and described["read_only_reason"] == reason
    assert snap.describe(snap.get("x"))["plugin"] is None
    assert LoadWarning("/srv/marketplace/plugins/ops/v1", "skills/bad: no SKILL.md") in (
        registry.warnings()
    )


def test_a_plugin_persona_cannot_be_patched_deleted_or_shadowed() -> None:
    registry = AgentRegistry(bundles=Bundles(FakeLayer(personas=[_plugin_persona("ops", "x")])))
    with pytest.raises(ReadOnlyError) as patched:
        registry.patch("ops:x", {"description": "changed"})
    assert "installed with the plugin 'ops'" in str(patched.value)
    with pytest.raises(ReadOnlyError):
        registry.delete("ops:x")
    with pytest.raises(PersonaError):
        registry.replace(_p("ops:x", description="a user copy"))
    assert registry.get("ops:x").description == "ops:x persona"


def test_every_reload_reads_the_bundles_again_and_the_digest_follows_theirs() -> None:
    layer = FakeLayer(personas=[_plugin_persona("ops", "x")], digest="one")
    bundles = Bundles(layer)
    registry = AgentRegistry(builtins=[_p("builtin_one")], bundles=bundles)
    first = registry.snapshot().digest
    assert registry.reload().digest == first  # same layer, same digest
    assert bundles.calls == 2
    # Same personas, another bundle digest (a changed skill or tool, say): a new digest.
    bundles.layer = FakeLayer(personas=[_plugin_persona("ops", "x")], digest="two")
    second = registry.reload()
    assert second.digest != first and second.names() == ["builtin_one", "ops:x"]
    # The plugin removed: its persona is gone and the digest is that of no bundle at all.
    bundles.layer = FakeLayer()
    gone = registry.reload()
    assert gone.names() == ["builtin_one"]
    assert gone.digest == AgentRegistry(builtins=[_p("builtin_one")]).snapshot().digest
    assert gone.digest not in {first, second.digest}


def test_without_a_bundles_callable_the_snapshot_has_no_bundle() -> None:
    snap = AgentRegistry(builtins=[_p("builtin_one")]).snapshot()
    assert snap.bundle is None and "ops:x" not in snap.personas


# -- skills in the tool bag ------------------------------------------------------------------------


def _probe_skill(path: str = "") -> str:
    """Probe one directory (a manifest tool stands in here)."""
    return path


PROBE = function_tool("read", name="probe_skill")(_probe_skill)


@pytest.fixture(scope="module")
def catalog() -> ToolCatalog:
    """The standard tools, the skill tools and one bundle tool, as a spawn's catalog has them."""
    return spawn_catalog(default_catalog(), FakeLayer(tools=[PROBE]))


def _names(persona: Persona, catalog: ToolCatalog, role: list[str] = ALL) -> list[str]:
    return resolve_bag(persona, catalog, role, role="ops").names()


def test_the_spawn_catalog_holds_the_skill_tools_once(catalog: ToolCatalog) -> None:
    names = catalog.names()
    assert all(names.count(n) == 1 for n in SKILL_TOOL_NAMES)
    assert "probe_skill" in names and "host_probe" in names
    # A second spawn catalog over the first adds nothing twice.
    assert spawn_catalog(catalog).names() == names


def test_skill_tools_are_only_in_the_bag_of_a_persona_with_skills(catalog: ToolCatalog) -> None:
    without = _names(_p("plain"), catalog)
    assert not set(SKILL_TOOL_NAMES) & set(without)
    assert "host_probe" in without
    # Even listing them by name gives nothing to a persona with no skill to load.
    asked = resolve_bag(_p("plain", tools=["load_skill", "host_probe"]), catalog, ALL)
    assert asked.names() == ["host_probe"] and asked.dropped == ()
    with_skills = _names(_p("skilled", skills=["ops:s"]), catalog)
    assert set(SKILL_TOOL_NAMES) <= set(with_skills)


def test_a_whitelist_gets_the_skill_tools_of_a_persona_with_skills(catalog: ToolCatalog) -> None:
    persona = _p("skilled", tools=["host_probe"], skills=["ops:s"])
    assert sorted(_names(persona, catalog)) == sorted(["host_probe", *SKILL_TOOL_NAMES])
    # A manifest tool is not a skill tool: a whitelist still has to name it.
    assert "probe_skill" not in _names(persona, catalog)
    named = _p("skilled", tools=["host_probe", "probe_skill"], skills=["ops:s"])
    assert "probe_skill" in _names(named, catalog)


def test_disallowing_star_skill_blocks_every_tool_that_comes_from_skills(
    catalog: ToolCatalog,
) -> None:
    persona = _p(
        "reviewer",
        tools=["host_probe", "probe_skill"],
        skills=["ops:s"],
        disallowed_tools=["*_skill"],
    )
    bag = resolve_bag(persona, catalog, ALL, role="ops")
    assert bag.names() == ["host_probe"]
    dropped = {d.name: d.reason for d in bag.dropped}
    assert set(dropped) == {*SKILL_TOOL_NAMES, "probe_skill"}
    assert all(r == "matches disallowed_tools pattern '*_skill'" for r in dropped.values())
    # With no whitelist (everything the role sees) the blacklist wins all the same.
    open_bag = _names(_p("reviewer", skills=["ops:s"], disallowed_tools=["*_skill"]), catalog)
    assert not [n for n in open_bag if n.endswith("_skill")]


def test_skill_tools_are_read_tools_a_read_only_persona_keeps(catalog: ToolCatalog) -> None:
    persona = _p("skilled", skills=["ops:s"], permission_mode=PermissionMode.READ_ONLY)
    bag = resolve_bag(persona, catalog, ALL)
    kept = set(bag.names())
    assert set(SKILL_TOOL_NAMES) <= kept
    assert not [d for d in bag.dropped if d.name in SKILL_TOOL_NAMES]
