"""An Agent Skill (agentskills.io) as a folder holds it: ``SKILL.md`` and its other files.

``SKILL.md`` is read with the project's bounded, ``safe_load``-only frontmatter reader; the
fields are ``name``, ``description``, ``license``, ``compatibility``, ``metadata`` and
``allowed-tools``, and the rest of the frontmatter is kept as written. The folder's other files
are listed through :func:`~marketplace._files.check_tree`, so a skill that links out of its
folder, or holds a FIFO or an oversized file, is refused before anything uses it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marketplace._files import _inside, _real_dir, _text, check_tree, read_file_bytes
from marketplace.model import BundleError
from registry.errors import PersonaError
from registry.parser import MAX_FILE_BYTES as MAX_SKILL_BYTES
from registry.parser import read_document

__all__ = ["SkillDoc", "read_skill"]

#: An Agent Skills name: lowercase letters and digits in hyphen-separated runs, at most 64.
SKILL_NAME = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
MAX_SKILL_NAME = 64
MAX_SKILL_DESCRIPTION = 1024
MAX_SKILL_COMPATIBILITY = 500


@dataclass(frozen=True)
class SkillDoc:
    """An Agent Skill: its SKILL.md frontmatter and body, and the other files of its folder."""

    name: str
    description: str
    license: str
    compatibility: str
    metadata: dict[str, Any]
    allowed_tools: tuple[str, ...]
    body: str
    root: Path
    #: Every other file of the skill folder, relative (``scripts/x.sh``), sorted.
    files: tuple[str, ...]
    warnings: tuple[str, ...] = ()
    #: The whole frontmatter, the fields other tools define (``user-invocable``…) included.
    raw: dict[str, Any] = field(default_factory=dict)


def read_skill(skill_dir: Path) -> SkillDoc:
    """Read ``skill_dir/SKILL.md`` (the project's bounded, ``safe_load``-only frontmatter reader).

    ``name`` must be an Agent Skills name; when it is missing the folder's name is used, and a
    name that differs from the folder's is kept with a warning (the official marketplace ships
    one). ``description`` is required.
    """
    base = _real_dir(skill_dir, "skill")
    path = Path(base) / "SKILL.md"
    _inside(base, path, "SKILL.md")
    data = read_file_bytes(path, MAX_SKILL_BYTES, "SKILL.md")
    try:
        frontmatter, body, notes = read_document(data.decode("utf-8"), path=str(path))
    except UnicodeDecodeError as exc:
        raise BundleError(str(path), f"SKILL.md is not UTF-8 text (byte {exc.start})") from None
    except PersonaError as exc:
        raise BundleError(str(path), exc.reason) from None
    warnings = list(notes)
    folder = Path(skill_dir).name or Path(base).name
    name = _skill_name(frontmatter.get("name"), folder, str(path), warnings)
    description = frontmatter.get("description")
    if not isinstance(description, str) or not description.strip():
        raise BundleError(str(path), "description: required, what the skill does and when")
    if len(description) > MAX_SKILL_DESCRIPTION:
        warnings.append(f"description is longer than {MAX_SKILL_DESCRIPTION} characters")
    compatibility = _text(frontmatter.get("compatibility"), f"{path}: compatibility")
    if len(compatibility) > MAX_SKILL_COMPATIBILITY:
        warnings.append(f"compatibility is longer than {MAX_SKILL_COMPATIBILITY} characters")
    metadata = frontmatter.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise BundleError(str(path), "metadata: must be a mapping of keys to values")
    try:
        tree = check_tree(Path(base))
    except BundleError as exc:
        raise BundleError(str(Path(base) / exc.where), exc.reason) from None
    files = tuple(p.as_posix() for p in tree if p.as_posix() != "SKILL.md")
    return SkillDoc(
        name=name,
        description=description.strip(),
        license=_text(frontmatter.get("license"), f"{path}: license"),
        compatibility=compatibility,
        metadata=metadata,
        allowed_tools=_tool_list(frontmatter.get("allowed-tools"), str(path)),
        body=body,
        root=Path(base),
        files=files,
        warnings=tuple(warnings),
        raw=frontmatter,
    )


def _skill_name(value: Any, folder: str, where: str, warnings: list[str]) -> str:
    rule = "lowercase letters, digits and single hyphens, at most 64 characters"
    if value is None or value == "":
        if not SKILL_NAME.match(folder) or len(folder) > MAX_SKILL_NAME:
            raise BundleError(where, f"name: required ({rule}); the folder name is not one")
        warnings.append(f"no name in the frontmatter: the folder's name {folder} is used")
        return folder
    if not isinstance(value, str) or len(value) > MAX_SKILL_NAME or not SKILL_NAME.match(value):
        raise BundleError(where, f"name: {str(value)[:80]!r} is not a skill name ({rule})")
    if value != folder:
        warnings.append(
            f"name {value} differs from its folder {folder} (the spec wants them equal)"
        )
    return value


def _tool_list(value: Any, where: str) -> tuple[str, ...]:
    """``allowed-tools`` as a list, or a string split on spaces and commas outside parentheses
    (``Bash(git status *)`` is one entry)."""
    if value is None:
        return ()
    if isinstance(value, list):
        if not all(isinstance(item, str) for item in value):
            raise BundleError(where, "allowed-tools: every entry must be a string")
        return tuple(item.strip() for item in value if item.strip())
    if not isinstance(value, str):
        raise BundleError(where, "allowed-tools: a list, or a string of names")
    out, current, depth = [], "", 0
    for char in value:
        if char == "(":
            depth += 1
        elif char == ")":
            depth = max(depth - 1, 0)
        elif depth == 0 and (char.isspace() or char == ","):
            out.append(current)
            current = ""
            continue
        current += char
    out.append(current)
    return tuple(item for item in out if item)
