"""Agent Skills as a spawn sees them: a prompt section that names them, and two tools to read them.

A persona's system prompt carries only each skill's name and description (:func:`skills_prompt`),
so a persona with many skills pays for their bodies only when it needs one. The model then calls
``load_skill`` for a skill's instructions and ``read_file_skill`` for one of its files (a
reference, a script to read, an asset). Both are read-only and both are confined to the skill's
folder. Their names end in ``_skill`` like every tool that comes from skills, so a persona's
``disallowed_tools: ["*_skill"]`` blocks all of them in one line.

The skills a spawn may load are handed to the tools in ``ToolContext.extras["skills"]``: a mapping
of qualified name (``<plugin>:<name>``, or ``<name>`` for a skill outside any plugin) to
:class:`Skill`. The tools read nothing else, so a spawn never reaches another persona's skills.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from registry.tools import BaseTool, ToolClass, ToolContext, ToolResult

__all__ = [
    "MAX_SKILL_FILE_BYTES",
    "SKILLS_EXTRA",
    "SKILL_TOOLS",
    "LoadSkillTool",
    "ReadFileSkillTool",
    "Skill",
    "skills_prompt",
]

#: The ``ToolContext.extras`` key holding the skills a spawn may load.
SKILLS_EXTRA = "skills"
#: ``read_file_skill`` returns at most this much of a file (and says when it cut).
MAX_SKILL_FILE_BYTES = 256 * 1024
#: A description longer than this is cut in the prompt (the Agent Skills limit is 1024).
_MAX_PROMPT_DESCRIPTION = 1024


@dataclass(frozen=True)
class Skill:
    """One Agent Skill, read from its ``SKILL.md`` and ready to hand to a spawn."""

    #: ``<plugin>:<name>``, or ``<name>`` for a skill that no plugin ships.
    qualified: str
    #: The skill's own name (its folder's name, as ``SKILL.md`` states it).
    name: str
    #: The plugin that ships it; empty for a skill outside any plugin.
    plugin: str
    #: When to use it: the only text of the skill that goes into a system prompt.
    description: str
    #: The instructions: ``SKILL.md`` without its frontmatter, returned by ``load_skill``.
    body: str
    #: The skill's folder; ``read_file_skill`` reads nothing outside it.
    root: Path
    #: The skill's files, as paths relative to :attr:`root` (``references/api.md``).
    files: tuple[str, ...] = ()
    #: ``allowed-tools`` of ``SKILL.md``, kept as written.
    allowed_tools: tuple[str, ...] = ()

    @classmethod
    def create(
        cls,
        *,
        name: str,
        description: str,
        body: str,
        root: Path,
        plugin: str = "",
        files: Sequence[str] = (),
        allowed_tools: Sequence[str] = (),
    ) -> Skill:
        """A skill whose :attr:`qualified` name is derived from ``plugin`` and ``name``."""
        return cls(
            qualified=f"{plugin}:{name}" if plugin else name,
            name=name,
            plugin=plugin,
            description=description,
            body=body,
            root=root,
            files=tuple(files),
            allowed_tools=tuple(allowed_tools),
        )


def _one_line(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def skills_prompt(skills: Sequence[Skill]) -> str:
    """The system prompt's skills section: names and descriptions only, never a body.

    Empty for no skills, so a persona without skills gets no section at all.
    """
    if not skills:
        return ""
    lines = [
        "## Skills",
        "",
        "These skills hold instructions for particular tasks. Before you use one, call "
        "`load_skill` with its name to read its instructions.",
        "",
    ]
    for skill in sorted(skills, key=lambda s: s.qualified):
        description = _one_line(skill.description, _MAX_PROMPT_DESCRIPTION) or "(no description)"
        lines.append(f"- {skill.qualified}: {description}")
    return "\n".join(lines) + "\n"


# -- finding a skill ---------------------------------------------------------------------------


def _available(context: ToolContext) -> Mapping[str, Skill]:
    skills = context.extras.get(SKILLS_EXTRA)
    return skills if isinstance(skills, Mapping) else {}


def _find(context: ToolContext, name: str) -> Skill | ToolResult:
    """The skill ``name`` names (qualified, or bare when only one skill has that name), or the
    error result that says which names exist."""
    skills = _available(context)
    if not skills:
        return ToolResult("no skills are available to this persona", is_error=True)
    found = skills.get(name)
    if found is not None:
        return found
    same = [s for s in skills.values() if s.name == name]
    if len(same) == 1:
        return same[0]
    if same:
        names = ", ".join(sorted(s.qualified for s in same))
        return ToolResult(
            f"skill name {name!r} is ambiguous: say which one ({names})", is_error=True
        )
    known = ", ".join(sorted(skills))
    return ToolResult(f"unknown skill {name!r}; available: {known}", is_error=True)


class _StrictArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- load_skill --------------------------------------------------------------------------------


class _LoadSkillArgs(_StrictArgs):
    name: str = Field(description="The skill's name, as the Skills section lists it.")


class LoadSkillTool(BaseTool):
    """``load_skill``: a skill's instructions and the list of its files."""

    name = "load_skill"
    description = (
        "Read the instructions of one of your skills (listed in the Skills section of your "
        "instructions), and the list of the skill's files. Call it before using a skill."
    )
    tool_class = ToolClass.READ
    args_model = _LoadSkillArgs
    idempotent = True

    def run(self, arguments: BaseModel, context: ToolContext) -> ToolResult:
        assert isinstance(arguments, _LoadSkillArgs)
        skill = _find(context, arguments.name)
        if isinstance(skill, ToolResult):
            return skill
        parts = [skill.body.rstrip() or "(this skill has no instructions)", ""]
        if skill.files:
            parts.append(
                f"Files of skill {skill.qualified} (read one with read_file_skill, "
                f'skill="{skill.qualified}" and path set to one of these):'
            )
            parts += [f"- {path}" for path in skill.files]
        else:
            parts.append(f"Skill {skill.qualified} has no other files.")
        data: dict[str, Any] = {"skill": skill.qualified, "files": list(skill.files)}
        return ToolResult("\n".join(parts), data=data)


# -- read_file_skill ---------------------------------------------------------------------------


class _ReadFileSkillArgs(_StrictArgs):
    skill: str = Field(description="The skill's name, as load_skill was given it.")
    path: str = Field(
        description="A file of the skill, relative to the skill's folder (references/api.md)."
    )


class _Refused(Exception):
    """A path ``read_file_skill`` will not read; the message says why."""


def _relative_parts(path: str) -> tuple[str, ...]:
    """The components of a path inside the skill, refusing anything that could leave it."""
    if "\0" in path:
        raise _Refused("the path contains a NUL character")
    if not path.strip():
        raise _Refused("the path is empty: give a file of the skill, relative to its folder")
    pure = PurePosixPath(path.replace("\\", "/"))
    if pure.is_absolute() or path.startswith("~"):
        raise _Refused(f"{path!r} is absolute: give a path relative to the skill's folder")
    parts = tuple(p for p in pure.parts if p != ".")
    if ".." in parts:
        raise _Refused(f"{path!r} goes up with '..': only files inside the skill may be read")
    if not parts:
        raise _Refused(f"{path!r} is the skill's folder itself, not a file")
    return parts


def _inside(child: str, parent: str) -> bool:
    return child == parent or child.startswith(parent.rstrip(os.sep) + os.sep)


def _open_inside(root: Path, path: str) -> tuple[int, os.stat_result]:
    """An open descriptor of the regular file ``path`` under ``root``, symlinks resolved and
    checked to stay inside ``root``; :class:`_Refused` otherwise."""
    real_root = os.path.realpath(root)
    real = os.path.realpath(os.path.join(real_root, *_relative_parts(path)))
    if not _inside(real, real_root) or real == real_root:
        raise _Refused(f"{path!r} leads outside the skill's folder (through a symbolic link)")
    # O_NOFOLLOW: the resolved path must not have become a link since; O_NONBLOCK: a FIFO
    # does not hang the open (fstat then refuses it as not a regular file).
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(real, flags)
    except FileNotFoundError:
        raise _Refused(f"{path!r} does not exist in the skill") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _Refused(f"{path!r} changed into a symbolic link while being read") from None
        raise _Refused(f"{path!r} cannot be opened: {exc.strerror}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
        raise _Refused(f"{path!r} is {kind}; give a file of the skill")
    return fd, info


def _read_bounded(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = os.read(fd, min(65536, limit + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _decode(raw: bytes, truncated: bool) -> str | None:
    """UTF-8 text, or ``None`` for binary content (undecodable, or holding NUL bytes)."""
    if b"\0" in raw:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        # A cut at the cap may split the last character; that alone is not binary.
        if truncated and exc.start >= len(raw) - 3 and exc.reason == "unexpected end of data":
            return raw[: exc.start].decode("utf-8", "strict")
        return None


class ReadFileSkillTool(BaseTool):
    """``read_file_skill``: one file of a skill, confined to the skill's folder."""

    name = "read_file_skill"
    description = (
        "Read one file of one of your skills (a path load_skill listed, relative to the skill's "
        f"folder). Text files only; at most {MAX_SKILL_FILE_BYTES // 1024} KiB are returned."
    )
    tool_class = ToolClass.READ
    args_model = _ReadFileSkillArgs
    idempotent = True

    def run(self, arguments: BaseModel, context: ToolContext) -> ToolResult:
        assert isinstance(arguments, _ReadFileSkillArgs)
        skill = _find(context, arguments.skill)
        if isinstance(skill, ToolResult):
            return skill
        try:
            fd, info = _open_inside(skill.root, arguments.path)
        except _Refused as exc:
            return ToolResult(f"cannot read {skill.qualified}: {exc}", is_error=True)
        try:
            raw = _read_bounded(fd, MAX_SKILL_FILE_BYTES)
        finally:
            os.close(fd)
        truncated = len(raw) > MAX_SKILL_FILE_BYTES
        raw = raw[:MAX_SKILL_FILE_BYTES]
        text = _decode(raw, truncated)
        if text is None:
            return ToolResult(
                f"{arguments.path} of skill {skill.qualified} is a binary file "
                f"({info.st_size} bytes), not UTF-8 text: it cannot be shown",
                is_error=True,
            )
        if truncated:
            text += (
                f"\n[file truncated: only the first {MAX_SKILL_FILE_BYTES // 1024} KiB of "
                f"{info.st_size} bytes are shown]"
            )
        data = {"skill": skill.qualified, "path": arguments.path, "size": info.st_size}
        return ToolResult(text, data=data)


#: The two tools every persona with skills gets.
SKILL_TOOLS: tuple[BaseTool, ...] = (LoadSkillTool(), ReadFileSkillTool())
