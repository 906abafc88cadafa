"""Hostile persona files: the parser's bounds hold before anything walks the data.

A "billion laughs" frontmatter (YAML anchors and aliases nested so that a few lines stand for
billions of values), recursive aliases, deep nesting, oversized files and values that nothing
downstream could write back are each a :class:`PersonaError` naming the key and the reason. The
bounds are asserted structurally (what the measure visits, where it stops), never by timing.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from registry import _bounds, parser
from registry.agent_registry import AgentRegistry, load_directory
from registry.errors import PersonaError
from registry.parser import (
    MAX_FILE_BYTES,
    MAX_FRONTMATTER_BYTES,
    MAX_FRONTMATTER_DEPTH,
    MAX_FRONTMATTER_TEXT,
    MAX_FRONTMATTER_VALUES,
    check_bounds,
    dump_persona,
    load_persona_file,
    parse_persona,
)

MINIMAL = "---\nname: laughs\ndescription: Hostile.\nwhen_to_use: Never.\n"
GOOD = "---\nname: good\ndescription: Fine.\nwhen_to_use: Always.\n---\n# Good\n"
ALIASES = "through YAML aliases (anchors and aliases used as a 'billion laughs')"


def laughs(levels: int = 9, width: int = 9, key: str = "metadata") -> str:
    """``levels`` anchors, each a list of ``width`` aliases of the one before: width**levels."""
    lines = [f"{key}:", f"  l0: &l0 [{', '.join(['lol'] * width)}]"]
    for level in range(1, levels):
        lines.append(f"  l{level}: &l{level} [{', '.join([f'*l{level - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


def _error(extra: str, *, head: str = MINIMAL, path: str = "agents/laughs.md") -> PersonaError:
    with pytest.raises(PersonaError) as info:
        parse_persona(head + extra + "---\nBody.\n", path=path)
    return info.value


@pytest.fixture
def visits(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many nodes and values the bounds looked at (the measure's only way in)."""
    counts = {"nodes": 0, "values": 0}
    node_parts, value_parts = _bounds._node_parts, _bounds._value_parts

    def count_nodes(node):
        counts["nodes"] += 1
        return node_parts(node)

    def count_values(value):
        counts["values"] += 1
        return value_parts(value)

    monkeypatch.setattr(_bounds, "_node_parts", count_nodes)
    monkeypatch.setattr(_bounds, "_value_parts", count_values)
    return counts


# -- the billion laughs ------------------------------------------------------------------------


def test_billion_laughs_is_an_error_naming_the_file_the_key_and_the_reason(tmp_path: Path):
    path = tmp_path / "laughs.md"
    path.write_text(MINIMAL + laughs() + "---\nBody.\n", encoding="utf-8")
    with pytest.raises(PersonaError) as info:
        load_persona_file(path)
    exc = info.value
    assert exc.path == str(path)
    assert [p.field for p in exc.problems] == ["metadata"]
    assert exc.reason == (
        f"metadata: frontmatter expands to more than {MAX_FRONTMATTER_VALUES} values {ALIASES}"
    )
    assert str(exc) == f"{path}: {exc.reason}"


def test_the_measure_follows_the_document_not_its_expansion(visits: dict[str, int]):
    # 9**9 (387 million) values as expanded; 9 anchors of 9 entries each as written.
    _error(laughs())
    written = 9 * 10 + 9 * 2 + 10  # lists and their entries, the l0..l8 keys, the rest
    assert 0 < visits["nodes"] <= written
    assert visits["values"] == 0  # refused before any value was built from the nodes


def test_the_count_is_exact_as_expanded():
    # One list of 100 strings (101 values), shared k times under one key: 3 + 101 * k values.
    leaf = [f"v{i}" for i in range(100)]
    fits = (MAX_FRONTMATTER_VALUES - 3) // 101
    check_bounds({"a": [leaf] * fits})
    with pytest.raises(PersonaError) as info:
        check_bounds({"a": [leaf] * (fits + 1)}, path="x.md")
    assert info.value.reason == (
        f"a: frontmatter expands to more than {MAX_FRONTMATTER_VALUES} values {ALIASES}"
    )


def test_a_smaller_laugh_within_the_bound_loads():
    # 4 levels of 4: 4**4 leaves; the persona keeps the shared structure and writes it back.
    persona = parse_persona(MINIMAL + laughs(levels=4, width=4) + "---\n").persona
    assert persona.metadata.model_extra is not None
    assert len(persona.metadata.model_extra["l3"]) == 4
    assert parse_persona(dump_persona(persona)).persona == persona


def test_text_expanded_through_aliases_is_bounded():
    size = 5000
    copies = MAX_FRONTMATTER_TEXT // size + 1
    text = f"s: &s {'x' * size}\nl: [{', '.join(['*s'] * copies)}]\n"
    exc = _error(text)
    assert exc.reason == (
        f"l: frontmatter text expands to more than {MAX_FRONTMATTER_TEXT} characters {ALIASES}"
    )


def test_laughs_in_an_unknown_key_and_at_the_top_level():
    assert _error(laughs(key="hooks")).problems[0].field == "hooks"
    top = laughs().replace("metadata:\n", "").replace("\n  ", "\n").removeprefix("  ")
    assert "expands to more than" in _error(top).reason


def test_laughs_are_refused_through_the_lenient_fallback_too(visits: dict[str, int]):
    # The description's ': ' makes the whole frontmatter invalid YAML: each block is then read
    # alone, and the metadata block is still measured before it is built.
    head = MINIMAL.replace("Hostile.", "Hostile: very.")
    exc = _error(laughs(), head=head)
    assert [p.field for p in exc.problems] == ["metadata"]
    assert "expands to more than" in exc.reason
    assert visits["values"] == 0


def test_laughs_split_across_fallback_blocks_are_counted_together():
    # Each block alone is under the bound; the fallback's blocks together are not.
    head = MINIMAL.replace("Hostile.", "Hostile: very.")
    leaf = "[" + ", ".join(["x"] * 99) + "]"
    per_block = "  - &l " + leaf + "\n" + "".join(["  - *l\n"] * 59)
    blocks = "".join(f"k{i}:\n{per_block}" for i in range(2))
    exc = _error(blocks, head=head)
    assert exc.reason == (
        f"k1: frontmatter expands to more than {MAX_FRONTMATTER_VALUES} values {ALIASES}"
    )


def test_a_recursive_alias_is_refused():
    exc = _error("metadata: &m {a: *m}\n")
    assert exc.reason == "metadata: refers to itself through a YAML alias (a recursive structure)"
    assert "refers to itself" in _error("x: &l [1, *l]\n").reason


# -- depth, size, values nothing could write back ---------------------------------------------


def test_depth_is_bounded_as_expanded():
    def nested(levels: int) -> str:
        return "[" * levels + "]" * levels

    parse_persona(MINIMAL + f"x: {nested(MAX_FRONTMATTER_DEPTH - 1)}\n---\n")  # root is level 1
    exc = _error(f"x: {nested(MAX_FRONTMATTER_DEPTH)}\n")
    assert exc.reason == f"x: frontmatter nests deeper than {MAX_FRONTMATTER_DEPTH} levels"
    # Shallow where written, deep once the alias is expanded: its depth is memoised too.
    half = MAX_FRONTMATTER_DEPTH // 2 + 1
    shared = f"a: &d {nested(half)}\nb: {'[' * half}*d{']' * half}\n"
    assert "nests deeper" in _error(shared).reason


@pytest.mark.parametrize(
    ("loader", "reason"),
    [
        # libyaml stops at its own nesting limit: a YAML error, in the field's block.
        ("CSafeLoader", "exceeded maximum nesting depth"),
        # The pure-Python composer recurses once per level and exhausts the recursion limit.
        ("SafeLoader", f"frontmatter nests deeper than {MAX_FRONTMATTER_DEPTH} levels"),
    ],
)
def test_nesting_past_the_yaml_reader_is_a_persona_error(
    monkeypatch: pytest.MonkeyPatch, loader: str, reason: str
):
    if not hasattr(yaml, loader):
        pytest.skip(f"this PyYAML has no {loader}")
    monkeypatch.setattr(parser, "_Loader", getattr(yaml, loader))
    for extra in ("x:\n  " + "- " * 3000 + "a\n", "x: " + "[" * 3000 + "\n"):
        exc = _error(extra)
        assert exc.problems[0].field in {"x", ""}
        assert reason in exc.reason


def test_frontmatter_bytes_are_bounded():
    exc = _error("description2: " + "x" * MAX_FRONTMATTER_BYTES + "\n")
    assert exc.reason.startswith("frontmatter is ")
    assert exc.reason.endswith(f" bytes; at most {MAX_FRONTMATTER_BYTES}")


def test_file_size_is_bounded_without_reading_it_all(tmp_path: Path):
    path = tmp_path / "huge.md"
    path.write_bytes(GOOD.encode() + b"x" * MAX_FILE_BYTES)
    with pytest.raises(PersonaError) as info:
        load_persona_file(path)
    assert str(info.value) == f"{path}: file is larger than {MAX_FILE_BYTES // 1024} KiB"


@pytest.mark.parametrize(
    ("extra", "field", "reason"),
    [
        ("max_turns: 1" + ":1" * 2600 + "\n", "max_turns", "an integer of more than 4000 digits"),
        ("color: 0x" + "f" * 3400 + "\n", "color", "an integer of more than 4000 digits"),
        ("color: !!binary /w==\n", "color", "binary data (!!binary) is not supported"),
        ("metadata: {blob: !!binary aGVsbG8=}\n", "metadata", "binary data (!!binary)"),
    ],
)
def test_values_nothing_could_write_back_are_refused(extra: str, field: str, reason: str):
    # A sexagesimal 1:1:1… is one YAML integer of thousands of digits: Python can neither print
    # it nor JSON-encode it, so the registry's digest and every listing would fail.
    exc = _error(extra)
    assert exc.problems[0].field == field
    assert reason in exc.reason


def test_yaml_a_constructor_refuses_is_a_yaml_error_not_a_crash():
    # PyYAML raises ValueError for an impossible date: the fallback reads the scalar as text…
    parsed = parse_persona(MINIMAL.replace("Hostile.", "2021-13-01") + "---\n")
    assert parsed.persona.description == "2021-13-01"
    assert "cannot read a value: month must be in 1..12" in parsed.notes[0]
    # …and a mapping holding one fails, naming the field.
    exc = _error("metadata: {since: 2021-13-01}\n")
    assert exc.reason == (
        "metadata: line 5: YAML error: cannot read a value: month must be in 1..12"
    )


def test_text_with_a_lone_surrogate_is_refused():
    with pytest.raises(PersonaError) as info:
        parse_persona(MINIMAL.replace("Hostile.", "\ud800") + "---\n")
    assert "not valid Unicode text" in info.value.reason


def test_a_prompt_full_of_unclosed_template_actions_is_refused():
    # From each '{{' the template pattern would rescan the rest: quadratic on 30 000 of them.
    exc = _error(f"initial_prompt: '{'{{' * 15_000}'\n")
    assert exc.problems[0].field == "initial_prompt"
    assert "unclosed '{{'" in exc.reason


# -- mappings that never were YAML -------------------------------------------------------------


def test_the_same_bounds_apply_to_a_mapping():
    deep: dict = {}
    node = deep
    for _ in range(MAX_FRONTMATTER_DEPTH):
        node["x"] = node = {}
    with pytest.raises(PersonaError) as info:
        parser.persona_from_mapping(
            {"name": "a", "description": "d", "when_to_use": "w", "metadata": deep}
        )
    assert info.value.reason == (
        f"metadata: frontmatter nests deeper than {MAX_FRONTMATTER_DEPTH} levels"
    )
    wide = {"name": "a", "description": "d", "when_to_use": "w", "x": list(range(10_001))}
    with pytest.raises(PersonaError) as info:
        parser.persona_from_mapping(wide)
    assert info.value.reason == f"x: frontmatter holds more than {MAX_FRONTMATTER_VALUES} values"


# -- the registry ------------------------------------------------------------------------------


def test_registry_loads_the_good_file_and_warns_about_the_hostile_ones(tmp_path: Path):
    agents = tmp_path / "agents"
    agents.mkdir()
    (agents / "good.md").write_text(GOOD, encoding="utf-8")
    (agents / "laughs.md").write_text(MINIMAL + laughs() + "---\n", encoding="utf-8")
    (agents / "digits.md").write_text(
        MINIMAL.replace("laughs", "digits") + "max_turns: 1" + ":1" * 2600 + "\n---\n",
        encoding="utf-8",
    )
    registry = AgentRegistry([agents])
    snap = registry.snapshot()
    assert snap.names() == ["good"]
    reasons = {w.path: w.reason for w in snap.warnings}
    assert reasons == {
        str(agents / "laughs.md"): (
            f"metadata: frontmatter expands to more than {MAX_FRONTMATTER_VALUES} values {ALIASES}"
        ),
        str(agents / "digits.md"): "max_turns: holds an integer of more than 4000 digits",
    }
    # The snapshot is usable as a whole: described (as the API does) and reloaded.
    assert snap.describe(snap.get("good"))["name"] == "good"
    assert registry.reload().names() == ["good"]
    personas, warnings = load_directory(agents)
    assert [p.name for p in personas] == ["good"] and len(warnings) == 2
