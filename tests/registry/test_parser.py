"""registry.parser: splitting, YAML, the lenient fallback, validation errors and the round trip."""

from __future__ import annotations

from pathlib import Path

import pytest

from registry.errors import PersonaError
from registry.parser import dump_persona, load_persona_file, parse_persona
from registry.persona import DEFAULT_MAX_TURNS, Metadata, PermissionMode, Persona

MINIMAL = "---\nname: minimal\ndescription: Smallest valid persona.\nwhen_to_use: Never.\n"


def _parse(extra: str = "", body: str = "") -> Persona:
    return parse_persona(MINIMAL + extra + "---\n" + body).persona


def _error(text: str, path: str = "agents/x.md") -> PersonaError:
    with pytest.raises(PersonaError) as info:
        parse_persona(text, path=path)
    return info.value


# -- fields and defaults -----------------------------------------------------------------------


def test_every_field_of_the_sre_persona(valid_dir: Path) -> None:
    path = valid_dir / "incident_investigator.md"
    parsed = load_persona_file(path)
    p = parsed.persona
    assert parsed.notes == ()
    assert p.name == "incident_investigator"
    assert p.description == "Walk an incident from symptom to root cause."
    assert p.when_to_use == (
        "When the user asks why an alert is firing, or shares an incident link.\n"
        "Also when several services degrade at once and nobody knows where it started.\n"
    )
    assert p.catalog_hint == p.when_to_use.splitlines()[0]
    assert p.catalog_hint.endswith("or shares an incident link.")
    assert p.tools == ["expand_topology", "query_promql", "search_logs", "host_probe", "bash"]
    assert p.disallowed_tools == ["*_skill", "restart_*"]
    assert p.permission_mode is PermissionMode.READ_ONLY
    assert p.max_turns == 24
    assert p.model == "anthropic/claude-sonnet-4-6"
    assert p.critical_reminder == (
        "Always show your evidence. Never speculate beyond what the tools returned.\n"
    )
    assert p.initial_prompt == (
        "You are investigating incident {{.incident_id}} on device {{ .device_id }}.\n"
    )
    assert p.background is True
    assert p.omit_claude_md is False
    assert p.metadata.ongrid.scope == "manager"
    assert p.metadata.os == []
    assert p.unknown_fields == {}
    assert p.source is None
    assert p.path == str(path)


def test_body_is_kept_byte_for_byte(valid_dir: Path) -> None:
    path = valid_dir / "incident_investigator.md"
    raw = path.read_text(encoding="utf-8")
    body = load_persona_file(path).persona.body
    # Everything after the closing '---' line: blank lines, trailing spaces, the tab, the fence,
    # the Markdown rule '---' inside the body, and the final blank line.
    assert body == raw[raw.index("\n---\n", 3) + len("\n---\n") :]
    assert body.startswith("\n# Incident investigator\n")
    assert "root cause.  \nWork from evidence, never from a hunch.   \n" in body
    assert "\n---\n\n\t*Evidence first;" in body
    assert body.endswith("written.*\n\n")


def test_defaults_of_every_optional_field() -> None:
    p = _parse()
    assert p.tools == [] and p.disallowed_tools == []
    assert p.permission_mode is PermissionMode.READ_ONLY
    assert p.max_turns == DEFAULT_MAX_TURNS == 15
    assert (p.model, p.critical_reminder, p.initial_prompt, p.body) == ("", "", "", "")
    assert p.background is False and p.omit_claude_md is False
    assert p.metadata == Metadata()
    assert p.metadata.requires.bins == [] and p.metadata.requires.config == []
    assert p.metadata.ongrid.min_ongrid_version is None
    assert p.unknown_fields == {} and p.source is None and p.path is None


@pytest.mark.parametrize(("given", "expected"), [("0", 15), ("1", 1), ("40", 40)])
def test_max_turns_zero_means_the_default(given: str, expected: int) -> None:
    assert _parse(f"max_turns: {given}\n").max_turns == expected


def test_nulls_read_as_empty_values() -> None:
    p = _parse("tools:\nmodel: ~\ncritical_reminder: null\ninitial_prompt:\nmetadata:\n")
    assert (p.tools, p.model, p.critical_reminder, p.initial_prompt) == ([], "", "", "")
    assert p.metadata == Metadata()


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("tools: [query_promql, host_probe]\n", ["query_promql", "host_probe"]),
        ("tools: query_promql, host_probe\n", ["query_promql", "host_probe"]),
        ("tools: 'query_*,  search_logs ,'\n", ["query_*", "search_logs"]),
        ("tools: host_probe\n", ["host_probe"]),
    ],
)
def test_tools_as_list_or_comma_string(line: str, expected: list[str]) -> None:
    assert _parse(line).tools == expected


def test_claude_style_comma_tools_fixture(valid_dir: Path) -> None:
    p = load_persona_file(valid_dir / "log_searcher.md").persona
    assert p.tools == ["Read", "Grep", "Bash"]
    assert p.name == "log-searcher" and p.model == "openai/gpt-5.4"


def test_disallowed_tools_wildcards_are_kept_verbatim() -> None:
    p = _parse("disallowed_tools: ['*_skill', 'restart_*', 'kube*ctl']\n")
    assert p.disallowed_tools == ["*_skill", "restart_*", "kube*ctl"]


def test_crlf_file(byte_files: dict[str, Path], crlf_body: str) -> None:
    p = load_persona_file(byte_files["crlf.md"]).persona
    assert p.name == "windows_host_checker"
    assert p.description == "Check a Windows host for failing services."
    assert p.when_to_use == (
        "When a Windows host stops answering health checks.\n"
        "Also when its event log fills with service errors.\n"
    )
    assert p.tools == ["host_probe", "query_promql"]
    assert p.body == crlf_body


@pytest.mark.parametrize("filename", ["bom.md", "bom_crlf.md"])
def test_byte_order_mark_is_stripped(byte_files: dict[str, Path], filename: str) -> None:
    path = byte_files[filename]
    assert path.read_bytes().startswith(b"\xef\xbb\xbf---")  # precondition
    p = load_persona_file(path).persona
    assert p.name in {"bom_persona", "windows_host_checker"}
    assert "\ufeff" not in p.name and "\ufeff" not in p.body


def test_file_without_trailing_newline(valid_dir: Path) -> None:
    path = valid_dir / "no_trailing_newline.md"
    assert not path.read_bytes().endswith(b"\n")  # precondition: nothing normalised the fixture
    p = load_persona_file(path).persona
    assert p.body == "Review the change. End with a verdict: ship, ship with conditions, or hold."
    assert p.max_turns == 15
    assert p.permission_mode is PermissionMode.MUTATING_WITH_CONFIRM


def test_frontmatter_closed_at_end_of_file_without_newline() -> None:
    assert parse_persona(MINIMAL + "---").persona.body == ""


def test_unknown_keys_are_kept_with_their_values(valid_dir: Path) -> None:
    p = load_persona_file(valid_dir / "unknown_keys.md").persona
    assert p.unknown_fields == {
        "color": "blue",
        "effort": "high",
        "hooks": {
            "PreToolUse": [
                {"matcher": "Bash", "hooks": [{"type": "command", "command": "./scripts/guard.sh"}]}
            ]
        },
        "mcp_servers": [
            {"name": "grafana", "url": "http://grafana.internal:3000/mcp"},
            {"name": "pagerduty", "command": ["npx", "pagerduty-mcp"]},
        ],
    }
    assert p.tools == ["query_promql"]


def test_metadata_gate_and_passthrough_keys(valid_dir: Path) -> None:
    meta = load_persona_file(valid_dir / "metadata_gated.md").persona.metadata
    assert meta.os == ["linux"]
    assert meta.requires.bins == ["dmesg", "journalctl"]
    assert meta.requires.config == ["prometheus_url"]
    assert meta.ongrid.scope == "edge"
    assert meta.ongrid.min_ongrid_version == "0.1"
    assert meta.ongrid.edge_runtime == "ongrid-edge"
    assert meta.ongrid.edge_capabilities == ["kmsg", "modules"]
    assert meta.model_extra == {"owner": "platform-team"}


def test_unquoted_float_version_is_refused_with_the_fix() -> None:
    # YAML has already turned 0.10 into 0.1: refusing is the only way not to lose the text.
    with pytest.raises(PersonaError) as info:
        _parse("metadata:\n  ongrid:\n    min_ongrid_version: 0.10\n")
    assert "metadata.ongrid.min_ongrid_version: write the version as a quoted string" in str(
        info.value
    )
    quoted = _parse("metadata:\n  ongrid:\n    min_ongrid_version: '0.10'\n")
    assert quoted.metadata.ongrid.min_ongrid_version == "0.10"


# -- the lenient fallback ----------------------------------------------------------------------


def test_unquoted_colon_in_description_loads_with_a_note(valid_dir: Path) -> None:
    parsed = load_persona_file(valid_dir / "colon_description.md")
    p = parsed.persona
    assert p.description == "Disk triage: full volumes, inode exhaustion and read-only remounts"
    assert p.when_to_use.rstrip("\n") == 'When an alert says "no space left on device".'
    assert p.tools == ["host_probe", "query_promql"]  # the other keys are still read as YAML
    assert p.max_turns == 8
    assert p.body == (
        "\n# Disk triage\n\nStart with `df -h` and `df -i` on the host named in the alert.\n"
    )
    (note,) = parsed.notes
    assert note.startswith("frontmatter is not valid YAML (line 3, column 25: ")
    assert note.endswith("lenient key: value fallback (keys read as plain text: description)")


def test_lenient_fallback_reads_block_scalars_like_yaml_does() -> None:
    block = "initial_prompt: |\n  Incident {{.incident_id}}.\n"
    strict = _parse(block)
    lenient = parse_persona(MINIMAL.replace("Never.", "Never: ever.") + block + "---\n")
    assert lenient.notes  # precondition: this one went through the fallback
    assert strict.initial_prompt == "Incident {{.incident_id}}.\n"
    assert lenient.persona.initial_prompt == strict.initial_prompt


def test_description_starting_with_double_star(valid_dir: Path) -> None:
    parsed = load_persona_file(valid_dir / "bold_description.md")
    assert parsed.persona.description == "**Read-only** gatekeeper for production change windows"
    assert parsed.persona.tools == ["query_*", "search_logs"]
    (note,) = parsed.notes
    assert note.startswith("frontmatter is not valid YAML (line 3, column 15: ")
    assert note.endswith("(keys read as plain text: description)")


def test_lenient_text_spans_continuation_lines_and_loses_outer_quotes() -> None:
    parsed = parse_persona(
        "---\nname: x\n"
        "description: Use when: disks fill\n  or: inodes run out\n"
        'when_to_use: "When: it is "urgent" now"\n---\n'
    )
    assert parsed.persona.description == "Use when: disks fill\nor: inodes run out"
    assert parsed.persona.when_to_use == 'When: it is "urgent" now'
    assert parsed.notes[0].endswith("(keys read as plain text: description, when_to_use)")


def test_lenient_fallback_skips_a_leading_comment() -> None:
    text = "---\n# owner: sre-team\n" + MINIMAL[4:].replace("Never.", "Never: ever.") + "---\n"
    assert parse_persona(text).persona.when_to_use == "Never: ever."


COLON = MINIMAL.replace("Never.", "Never: ever.")  # invalid YAML: the fallback reads it


@pytest.mark.parametrize("head", [MINIMAL, COLON], ids=["strict", "fallback"])
def test_an_unclosed_tool_list_is_an_error_not_a_tool(head: str) -> None:
    # Read as text it would be the tool '[host_probe' and a persona with an empty bag.
    exc = _error(head + "tools: [host_probe\n---\n")
    assert [p.field for p in exc.problems] == ["tools"]
    assert exc.reason.startswith("tools: line 5, column 8: YAML error: while parsing a flow ")
    assert str(exc) == f"agents/x.md: {exc.reason}"


@pytest.mark.parametrize(
    ("extra", "field", "where"),
    [
        ("metadata:\n  os: [linux\n", "metadata", "line 6, column 7"),
        ("metadata:\n  requires:\n    bins: [a, b]: c\n", "metadata", "line 7, column 17"),
        ("disallowed_tools: {a: b\n", "disallowed_tools", "line 5, column 19"),
        # Keys the format does not define: structure by their shape.
        ("hooks:\n  PreToolUse: Bash: x\n", "hooks", "line 6, column 19"),
        ("mcp_servers:\n  - name: a\n  - name: b: c\n", "mcp_servers", "line 7, column 12"),
        ("color: {shade: [blue}\n", "color", "line 5, column 21"),
        ("description2: [WIP] Disk: triage\n", "description2", "line 5, column 21"),
    ],
)
def test_broken_lists_and_mappings_name_field_line_and_column(
    extra: str, field: str, where: str
) -> None:
    exc = _error(COLON + extra + "---\n")
    assert [p.field for p in exc.problems] == [field]
    assert exc.problems[0].message.startswith(f"{where}: YAML error: ")


def test_a_text_field_that_looks_like_a_list_is_still_text() -> None:
    text = "---\nname: wip\ndescription: [WIP] Disk: triage\nwhen_to_use: Never.\n---\n"
    parsed = parse_persona(text)
    assert parsed.persona.description == "[WIP] Disk: triage"
    assert "description" in parsed.notes[0]


def test_every_broken_structure_is_reported_at_once() -> None:
    exc = _error(COLON + "tools: [a\nmetadata: {os: linux\ncolor: blue\n---\n")
    assert [p.field for p in exc.problems] == ["tools", "metadata"]


def test_scalar_text_keeps_the_fallback_next_to_good_structure() -> None:
    parsed = parse_persona(
        COLON
        + "tools: [host_probe, bash]\nmetadata:\n  os: [linux]\ncolor: **blue**: bold\n"
        + "effort: - high\n---\n"
    )
    p = parsed.persona
    assert p.when_to_use == "Never: ever."
    assert p.tools == ["host_probe", "bash"] and p.metadata.os == ["linux"]
    assert p.unknown_fields == {"color": "**blue**: bold", "effort": "- high"}
    assert parsed.notes[0].endswith("(keys read as plain text: when_to_use, color, effort)")


def test_a_key_yaml_reads_as_another_type_keeps_its_block() -> None:
    # 'on' is a YAML 1.1 boolean: the block {True: {...}} is still the value of 'on'.
    parsed = parse_persona(COLON + "on:\n  push: [main]\n---\n")
    assert parsed.persona.unknown_fields == {"on": {"push": ["main"]}}


def test_longer_closing_rule_is_accepted_with_a_note() -> None:
    parsed = parse_persona(MINIMAL + "-----\nBody.\n")
    assert parsed.persona.body == "Body.\n"
    assert parsed.notes == ("frontmatter closed by line 5 (-----…) instead of '---'",)


def test_unreadable_frontmatter_names_the_file_and_the_line(broken_dir: Path) -> None:
    path = broken_dir / "tab_garbage.md"
    with pytest.raises(PersonaError) as info:
        load_persona_file(path)
    exc = info.value
    assert exc.path == str(path)
    assert str(exc).startswith(f"{path}: frontmatter is not valid YAML (line 2, column 1: ")
    assert "line 2, column 1 is not a 'key: value' line either: 'name: tabbed'" in str(exc)


def test_line_the_fallback_cannot_place_is_reported_with_its_number() -> None:
    exc = _error(MINIMAL.replace("Never.", "Never: ever.") + "just some words\n---\n")
    assert "and line 5, column 1 is not a 'key: value' line either: 'just some words'" in str(exc)
    assert str(exc).startswith("agents/x.md: frontmatter is not valid YAML (line 4, column 19: ")


# -- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("filename", "field", "fragment"),
    [
        ("missing_name.md", "name", "required field is missing"),
        ("bad_permission_mode.md", "permission_mode", "(got 'read_only')"),
        ("max_turns_lots.md", "max_turns", "unable to parse string as an integer (got 'lots')"),
        ("name_with_spaces.md", "name", "snake_case or kebab-case"),
        ("range_initial_prompt.md", "initial_prompt", "unsupported template action {{ range"),
    ],
)
def test_broken_field_is_named(broken_dir: Path, filename: str, field: str, fragment: str) -> None:
    path = broken_dir / filename
    with pytest.raises(PersonaError) as info:
        load_persona_file(path)
    exc = info.value
    assert [p.field for p in exc.problems] == [field]
    assert fragment in exc.problems[0].message
    assert str(exc) == f"{path}: {field}: {exc.problems[0].message}"
    assert exc.reason == f"{field}: {exc.problems[0].message}"


@pytest.mark.parametrize(
    ("filename", "message"),
    [
        ("frontmatter_list.md", "frontmatter must be a mapping, got list"),
        ("no_frontmatter.md", "no frontmatter: the file must start with a '---' line"),
        ("unclosed_frontmatter.md", "frontmatter is not closed: no '---' line after line 1"),
    ],
)
def test_broken_structure_is_named(broken_dir: Path, filename: str, message: str) -> None:
    path = broken_dir / filename
    with pytest.raises(PersonaError) as info:
        load_persona_file(path)
    assert str(info.value) == f"{path}: {message}"


def test_non_utf8_file(byte_files: dict[str, Path]) -> None:
    path = byte_files["latin1.md"]
    with pytest.raises(PersonaError) as info:
        load_persona_file(path)
    assert str(info.value) == f"{path}: not UTF-8 text (byte 39: invalid continuation byte)"


def test_missing_file_is_a_persona_error(tmp_path: Path) -> None:
    path = tmp_path / "gone.md"
    with pytest.raises(PersonaError) as info:
        load_persona_file(path)
    assert str(info.value) == f"{path}: cannot read file: No such file or directory"


def test_every_problem_is_reported_at_once() -> None:
    exc = _error(
        "---\nname: Bad Name\ndescription: '  '\npermission_mode: yolo\nmax_turns: -3\n---\n"
    )
    assert [p.field for p in exc.problems] == [
        "name", "description", "when_to_use", "permission_mode", "max_turns",
    ]  # fmt: skip
    assert exc.problems[1].message == "must not be empty"
    assert exc.problems[2].message == "required field is missing"
    assert "greater than or equal to 0" in exc.problems[4].message


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ("metadata:\n  os: 5\n", "metadata.os"),
        ("metadata:\n  requires: {bins: {a: 1}}\n", "metadata.requires.bins"),
        ("tools: ['query_promql', '']\n", "tools"),
        ("tools: [[a, b]]\n", "tools.0"),
        ("background: maybe\n", "background"),
    ],
)
def test_nested_field_paths(extra: str, field: str) -> None:
    exc = _error(MINIMAL + extra + "---\n")
    assert [p.field for p in exc.problems] == [field]


def test_empty_frontmatter_lists_the_three_required_fields() -> None:
    exc = _error("---\n---\nBody.\n")
    assert [p.field for p in exc.problems] == ["name", "description", "when_to_use"]


# -- round trip --------------------------------------------------------------------------------

VALID_DIR = Path(__file__).resolve().parent.parent / "fixtures" / "personas" / "valid"
VALID = sorted(p.name for p in VALID_DIR.glob("*.md"))


@pytest.mark.parametrize("filename", VALID)
def test_round_trip_of_every_valid_fixture(valid_dir: Path, filename: str) -> None:
    path = valid_dir / filename
    p = load_persona_file(path).persona
    text = dump_persona(p)
    again = parse_persona(text, path=str(path))
    assert again.notes == ()  # what we write is plain YAML, no fallback needed
    assert again.persona == p
    assert again.persona.body == p.body
    assert again.persona.unknown_fields == p.unknown_fields
    assert dump_persona(again.persona) == text  # a fixed point


@pytest.mark.parametrize("filename", ["crlf.md", "bom.md", "bom_crlf.md"])
def test_round_trip_of_byte_files(
    byte_files: dict[str, Path], crlf_body: str, filename: str
) -> None:
    p = load_persona_file(byte_files[filename]).persona
    text = dump_persona(p)
    again = parse_persona(text, path=p.path).persona
    assert again == p
    assert again.body.encode() == p.body.encode()
    if "crlf" in filename:
        assert text.startswith("---\r\nname: windows_host_checker\r\n")
        assert "\n" not in text.replace("\r\n", "")  # no bare LF sneaks into a CRLF file
        assert again.body == crlf_body


def test_dump_writes_known_fields_in_order_then_unknown_ones(valid_dir: Path) -> None:
    text = dump_persona(load_persona_file(valid_dir / "unknown_keys.md").persona)
    front = text.split("---\n")[1]
    keys = [ln.split(":")[0] for ln in front.splitlines() if ln[:1].isalpha()]
    assert keys == [
        "name", "description", "when_to_use", "tools", "color", "effort", "hooks", "mcp_servers",
    ]  # fmt: skip


def test_persona_constructors_agree(valid_dir: Path) -> None:
    path = valid_dir / "incident_investigator.md"
    text = path.read_text(encoding="utf-8")
    assert Persona.from_file(str(path)) == Persona.from_text(text, path=str(path))
    assert Persona.from_text(text).to_markdown() == dump_persona(Persona.from_text(text))
    built = Persona.from_dict({"name": "a", "description": "d", "when_to_use": "w", "x": 1})
    assert built.unknown_fields == {"x": 1}
