"""Skills in a spawn: the prompt section, ``load_skill`` and ``read_file_skill`` on real files."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from marketplace.skills import (
    MAX_SKILL_FILE_BYTES,
    SKILL_TOOLS,
    LoadSkillTool,
    ReadFileSkillTool,
    Skill,
    skills_prompt,
)
from registry.errors import ToolArgumentError
from registry.tools import BaseTool, ToolClass, ToolContext, ToolResult

BODY = "# Disk triage\n\nRun `df -h` first, then read references/checklist.md.\n"


def make_skill(root: Path, name: str = "disk-triage", plugin: str = "ops") -> Skill:
    (root / "references").mkdir(parents=True, exist_ok=True)
    (root / "SKILL.md").write_text(f"---\nname: {name}\n---\n{BODY}")
    (root / "references" / "checklist.md").write_text("1. df -h\n2. du -sh /var/*\n")
    return Skill.create(
        name=name,
        plugin=plugin,
        description="Triage a full disk.\nUse when a filesystem is above 90%.",
        body=BODY,
        root=root,
        files=("SKILL.md", "references/checklist.md"),
        allowed_tools=("Bash",),
    )


@pytest.fixture
def skill(tmp_path: Path) -> Skill:
    return make_skill(tmp_path / "ops" / "skills" / "disk-triage")


def context(*skills: Skill) -> ToolContext:
    return ToolContext(extras={"skills": {s.qualified: s for s in skills}})


def call(tool: BaseTool, ctx: ToolContext, **arguments: Any) -> ToolResult:
    return tool.run(tool.validate_arguments(arguments), ctx)


def read(ctx: ToolContext, path: str, skill: str = "ops:disk-triage") -> ToolResult:
    return call(ReadFileSkillTool(), ctx, skill=skill, path=path)


# -- the skill and the prompt --------------------------------------------------------------------


def test_qualified_name_carries_the_plugin(tmp_path: Path) -> None:
    assert Skill.create(name="a", plugin="p", description="", body="", root=tmp_path).qualified == (
        "p:a"
    )
    assert Skill.create(name="a", description="", body="", root=tmp_path).qualified == "a"


def test_prompt_lists_names_and_descriptions_never_bodies(skill: Skill, tmp_path: Path) -> None:
    other = make_skill(tmp_path / "x", name="log-search", plugin="")
    prompt = skills_prompt([skill, other])
    assert "- ops:disk-triage: Triage a full disk. Use when a filesystem is above 90%." in prompt
    assert "- log-search: " in prompt
    assert "df -h" not in prompt  # the body stays out
    assert "`load_skill`" in prompt
    assert skills_prompt([]) == ""


def test_skill_tools_are_read_class_and_end_in_skill() -> None:
    assert [t.name for t in SKILL_TOOLS] == ["load_skill", "read_file_skill"]
    for tool in SKILL_TOOLS:
        assert tool.tool_class is ToolClass.READ
        assert tool.name.endswith("_skill")
        assert tool.parameters["additionalProperties"] is False


# -- load_skill ----------------------------------------------------------------------------------


def test_load_skill_returns_the_body_and_the_files(skill: Skill) -> None:
    result = call(LoadSkillTool(), context(skill), name="ops:disk-triage")
    assert not result.is_error
    assert result.content.startswith("# Disk triage")
    assert "- references/checklist.md" in result.content
    assert "read_file_skill" in result.content
    assert result.data == {
        "skill": "ops:disk-triage",
        "files": ["SKILL.md", "references/checklist.md"],
    }


def test_a_bare_name_is_enough_when_unambiguous(skill: Skill) -> None:
    result = call(LoadSkillTool(), context(skill), name="disk-triage")
    assert not result.is_error and "# Disk triage" in result.content


def test_an_ambiguous_bare_name_asks_which(skill: Skill, tmp_path: Path) -> None:
    twin = make_skill(tmp_path / "other", plugin="infra")
    result = call(LoadSkillTool(), context(skill, twin), name="disk-triage")
    assert result.is_error
    assert "ambiguous" in result.content
    assert "infra:disk-triage" in result.content and "ops:disk-triage" in result.content


def test_an_unknown_skill_lists_the_available_ones(skill: Skill) -> None:
    result = call(LoadSkillTool(), context(skill), name="nope")
    assert result.is_error
    assert "unknown skill 'nope'" in result.content and "ops:disk-triage" in result.content


def test_no_skills_at_all_says_so() -> None:
    for ctx in (ToolContext(), ToolContext(extras={"skills": {}})):
        result = call(LoadSkillTool(), ctx, name="x")
        assert result.is_error and result.content == "no skills are available to this persona"


def test_load_skill_arguments_are_strict() -> None:
    with pytest.raises(ToolArgumentError, match="other: Extra inputs"):
        LoadSkillTool().validate_arguments({"name": "x", "other": 1})
    with pytest.raises(ToolArgumentError, match="name"):
        LoadSkillTool().validate_arguments({})


# -- read_file_skill -----------------------------------------------------------------------------


def test_reads_a_file_of_the_skill(skill: Skill) -> None:
    result = read(context(skill), "references/checklist.md")
    assert not result.is_error
    assert result.content == "1. df -h\n2. du -sh /var/*\n"
    assert read(context(skill), "./references/../SKILL.md").is_error  # '..' even when harmless


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("/etc/passwd", "is absolute"),
        ("~/x", "is absolute"),
        ("../../../etc/passwd", "goes up with '..'"),
        ("references/../../x", "goes up with '..'"),
        ("..\\..\\etc\\passwd", "goes up with '..'"),
        ("", "the path is empty"),
        (".", "the skill's folder itself"),
        ("references", "is a directory"),
        ("missing.md", "does not exist"),
    ],
)
def test_refuses_paths_that_are_not_files_of_the_skill(
    skill: Skill, path: str, reason: str
) -> None:
    result = read(context(skill), path)
    assert result.is_error
    assert reason in result.content


def test_refuses_a_symlink_out_of_the_skill(skill: Skill, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("password")
    (skill.root / "link.md").symlink_to(secret)
    (skill.root / "up").symlink_to(tmp_path)
    for path in ("link.md", "up/secret.txt"):
        result = read(context(skill), path)
        assert result.is_error and "leads outside the skill's folder" in result.content
        assert "password" not in result.content


def test_follows_a_symlink_that_stays_inside(skill: Skill) -> None:
    (skill.root / "alias.md").symlink_to(skill.root / "references" / "checklist.md")
    assert read(context(skill), "alias.md").content.startswith("1. df -h")


def test_refuses_a_fifo_without_hanging(skill: Skill) -> None:
    os.mkfifo(skill.root / "pipe")
    result = read(context(skill), "pipe")
    assert result.is_error and "not a regular file" in result.content


def test_binary_files_are_named_with_their_size(skill: Skill) -> None:
    (skill.root / "assets").mkdir()
    (skill.root / "assets" / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    result = read(context(skill), "assets/logo.png")
    assert result.is_error
    assert "binary" in result.content and "264 bytes" in result.content


def test_large_files_are_cut_at_the_cap_and_say_so(skill: Skill) -> None:
    # A multi-byte character straddles the cap: the cut must not make the file look binary.
    text = "a" * (MAX_SKILL_FILE_BYTES - 1) + "é" + "b" * 1000
    (skill.root / "big.md").write_text(text)
    result = read(context(skill), "big.md")
    assert not result.is_error
    shown, notice = result.content.rsplit("\n", 1)
    assert shown == "a" * (MAX_SKILL_FILE_BYTES - 1)
    assert "file truncated" in notice and str(len(text.encode())) in notice


def test_read_needs_a_known_skill(skill: Skill) -> None:
    result = read(context(skill), "SKILL.md", skill="other")
    assert result.is_error and "unknown skill 'other'" in result.content
    assert read(ToolContext(), "SKILL.md").content == "no skills are available to this persona"


def test_nul_in_a_path_is_refused_before_the_tool_runs(skill: Skill) -> None:
    with pytest.raises(ToolArgumentError, match="NUL"):
        ReadFileSkillTool().validate_arguments({"skill": "ops:disk-triage", "path": "a\0b"})
