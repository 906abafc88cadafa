"""registry.claude_import: Claude Code subagent files converted into Ongrid personas."""

from __future__ import annotations

from pathlib import Path

import pytest

from registry.claude_import import (
    MODEL_ALIASES,
    convert_claude_file,
    import_claude_files,
)
from registry.errors import PersonaError
from registry.parser import load_persona_file

CODE_REVIEWER = """\
---
name: Code Reviewer
description: Expert code review specialist. Use immediately after writing or modifying code.
tools: Read, Grep, Glob, Bash
model: sonnet
color: blue
permissionMode: acceptEdits
---

You are a senior code reviewer ensuring high standards of code quality and security.

When invoked:
1. Run `git diff` to see recent changes.\x20\x20
2. Focus on modified files.
"""

SQL_EXPERT = """\
---
name: sql-expert
description: Use this agent for slow queries. Examples: <example>user: "why is this slow?"</example>
tools: [Read, Bash, query_promql]
model: claude-sonnet-4-20250514
maxTurns: 30
disallowedTools: Write
---
Explain the query plan before proposing an index.
"""


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode("utf-8"))
    return path


def _claude(name: str, description: str = "Does a thing.", model: str = "") -> str:
    model_line = f"model: {model}\n" if model else ""
    return f"---\nname: {name}\ndescription: {description}\n{model_line}---\nBody of {name}.\n"


def test_convert_a_claude_code_subagent(tmp_path: Path) -> None:
    path = _write(tmp_path / "code-reviewer.md", CODE_REVIEWER)
    item = convert_claude_file(path, catalog_names=["Grep", "query_promql"])
    p = item.persona
    assert item.source == str(path) and item.out is None
    assert p.name == "code-reviewer"
    assert p.description == (
        "Expert code review specialist. Use immediately after writing or modifying code."
    )
    assert p.when_to_use == p.description
    assert p.model == "anthropic/claude-sonnet-4-6"
    assert p.tools == ["Read", "Grep", "Glob", "Bash"]  # Claude names are kept
    assert item.unknown_tools == ["Read", "Glob", "Bash"]  # ... and listed when not in catalog
    assert p.unknown_fields == {"color": "blue", "permissionMode": "acceptEdits"}
    assert p.permission_mode == "read-only"  # Claude's permissionMode is not ours
    assert p.body == CODE_REVIEWER.split("---\n", 2)[2]
    assert item.changes == [
        "name 'Code Reviewer' → 'code-reviewer' (spawn keys are kebab-case)",
        "when_to_use ← description",
        "model 'sonnet' → 'anthropic/claude-sonnet-4-6'",
    ]


@pytest.mark.parametrize(
    ("model", "expected", "change"),
    [
        ("sonnet", "anthropic/claude-sonnet-4-6", "model 'sonnet' → 'anthropic/claude-sonnet-4-6'"),
        ("opus", "anthropic/claude-opus-4-7", "model 'opus' → 'anthropic/claude-opus-4-7'"),
        ("haiku", "anthropic/claude-haiku-4-5", "model 'haiku' → 'anthropic/claude-haiku-4-5'"),
        ("inherit", "", "model 'inherit' → 'organisation default'"),
        (
            "claude-sonnet-4-20250514",
            "anthropic/claude-sonnet-4-20250514",
            "model 'claude-sonnet-4-20250514' → 'anthropic/claude-sonnet-4-20250514'",
        ),
        ("openai/gpt-5.4", "openai/gpt-5.4", None),
    ],
)
def test_model_aliases(tmp_path: Path, model: str, expected: str, change: str | None) -> None:
    item = convert_claude_file(_write(tmp_path / "a.md", _claude("agent", model=model)))
    assert item.persona.model == expected
    model_changes = [c for c in item.changes if c.startswith("model ")]
    assert model_changes == ([change] if change else [])
    assert set(MODEL_ALIASES) == {"sonnet", "opus", "haiku", "inherit"}


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("Code Reviewer", "code-reviewer"),
        ("API_Designer", "api_designer"),
        ("  k8s--Operator!! ", "k8s-operator"),
        ("security-auditor", "security-auditor"),
    ],
)
def test_name_normalisation(tmp_path: Path, name: str, expected: str) -> None:
    item = convert_claude_file(_write(tmp_path / "x.md", _claude(f"'{name}'")))
    assert item.persona.name == expected
    renamed = [c for c in item.changes if c.startswith("name ")]
    if name == expected:
        assert renamed == []
    else:
        assert renamed == [f"name {name!r} → {expected!r} (spawn keys are kebab-case)"]


def test_camel_case_fields_and_a_description_yaml_rejects(tmp_path: Path) -> None:
    item = convert_claude_file(_write(tmp_path / "sql.md", SQL_EXPERT), ["query_promql"])
    p = item.persona
    assert p.description.startswith("Use this agent for slow queries. Examples: <example>user:")
    assert p.max_turns == 30 and p.disallowed_tools == ["Write"]
    assert p.model == "anthropic/claude-sonnet-4-20250514"
    assert item.unknown_tools == ["Read", "Bash"]
    assert p.unknown_fields == {}
    assert "maxTurns → max_turns" in item.changes
    assert "disallowedTools → disallowed_tools" in item.changes
    assert any("(keys read as plain text: description)" in c for c in item.changes)


def test_missing_name_and_description_come_from_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path / "Log Triage.md", "---\ntools: Read\n---\n\n# Log triage helper\n\nx\n")
    item = convert_claude_file(path)
    assert (item.persona.name, item.persona.description) == ("log-triage", "Log triage helper")
    assert item.changes[:2] == [
        "name missing: taken from the file name as 'log-triage'",
        "description missing: taken from the body's first line",
    ]


def test_unusable_files_raise_with_the_reason(tmp_path: Path) -> None:
    empty = _write(tmp_path / "empty.md", "---\nname: empty\n---\n\n")
    with pytest.raises(PersonaError) as info:
        convert_claude_file(empty)
    assert str(info.value) == (
        f"{empty}: description: missing, and the body has no text to take it from"
    )
    bad = _write(tmp_path / "bad.md", "---\nname: bad\ndescription: d\nmax_turns: many\n---\n")
    with pytest.raises(PersonaError, match="max_turns"):
        convert_claude_file(bad)


def test_import_writes_files_that_load(tmp_path: Path) -> None:
    src = tmp_path / "claude" / "agents"
    _write(src / "code-reviewer.md", CODE_REVIEWER)
    _write(src / "sql.md", SQL_EXPERT)
    _write(src / "README.md", "# Not an agent\n")
    out = tmp_path / "out"
    report = import_claude_files([src], out, catalog_names=["Grep"])
    assert report.skipped == []
    assert [Path(i.out or "").relative_to(out) for i in report.imported] == [
        Path("code-reviewer.md"),
        Path("sql-expert.md"),
    ]
    for item in report.imported:
        loaded = load_persona_file(item.out or "")
        assert loaded.notes == ()
        assert loaded.persona == item.persona.model_copy(update={"path": item.out})
        assert loaded.persona.unknown_fields == item.persona.unknown_fields
    reviewer = load_persona_file(out / "code-reviewer.md").persona
    assert reviewer.unknown_fields == {"color": "blue", "permissionMode": "acceptEdits"}
    assert reviewer.body.endswith("recent changes.  \n2. Focus on modified files.\n")
    assert report.unknown_tools() == ["Bash", "Glob", "Read", "query_promql"]
    as_dict = report.as_dict()
    assert as_dict["imported"][0]["name"] == "code-reviewer"
    assert as_dict["imported"][0]["out"] == str(out / "code-reviewer.md")


def test_crlf_body_survives_the_import(tmp_path: Path) -> None:
    src = _write(tmp_path / "src" / "win.md", _claude("win").replace("\n", "\r\n"))
    report = import_claude_files([src], tmp_path / "out")
    raw = (tmp_path / "out" / "win.md").read_bytes()
    assert raw.endswith(b"---\r\nBody of win.\r\n")
    assert b"\n" not in raw.replace(b"\r\n", b"")
    assert load_persona_file(report.imported[0].out or "").persona.body == "Body of win.\r\n"


def test_duplicate_name_in_one_folder_is_skipped_with_the_reason(tmp_path: Path) -> None:
    src = tmp_path / "src"
    first = _write(src / "a-reviewer.md", _claude("reviewer", "First."))
    second = _write(src / "b-reviewer.md", _claude("reviewer", "Second."))
    broken = _write(src / "c-broken.md", "---\n- not a mapping\n---\n")
    out = tmp_path / "out"
    report = import_claude_files([src], out)
    assert [i.source for i in report.imported] == [str(first)]
    assert load_persona_file(out / "reviewer.md").persona.description == "First."
    assert report.skipped == [
        {
            "path": str(second),
            "reason": f"persona name 'reviewer' is already taken in that folder by {first}; "
            "rename one of them and import it again",
        },
        {"path": str(broken), "reason": "frontmatter must be a mapping, got list"},
    ]


def test_same_name_in_different_folders_of_one_source_both_land(tmp_path: Path) -> None:
    root = tmp_path / "corpus"
    _write(root / "team-a" / "agents" / "reviewer.md", _claude("code-reviewer", "Team A."))
    _write(root / "team-b" / "agents" / "reviewer.md", _claude("code-reviewer", "Team B."))
    out = tmp_path / "out"
    report = import_claude_files([root], out)
    assert report.skipped == []
    a = load_persona_file(out / "team-a" / "agents" / "code-reviewer.md").persona
    b = load_persona_file(out / "team-b" / "agents" / "code-reviewer.md").persona
    assert (a.description, b.description) == ("Team A.", "Team B.")


def test_same_name_in_two_source_folders_both_land(tmp_path: Path) -> None:
    coll_a = tmp_path / "wshobson-agents"
    coll_b = tmp_path / "voltagent-subagents"
    _write(coll_a / "code-reviewer.md", _claude("code-reviewer", "Collection A."))
    _write(coll_b / "code-reviewer.md", _claude("code-reviewer", "Collection B."))
    out = tmp_path / "out"
    report = import_claude_files([coll_a, coll_b], out)
    assert report.skipped == []
    assert len(report.imported) == 2
    descriptions = {load_persona_file(i.out or "").persona.description for i in report.imported}
    assert descriptions == {"Collection A.", "Collection B."}
