"""Convert Claude Code subagent files into Ongrid personas.

Claude Code files carry ``name``, ``description``, ``tools`` (often a comma-separated string),
``model`` (an alias such as ``sonnet`` or ``inherit``) and fields of their own (``color``,
``permissionMode``, ``skills``…). The conversion keeps every field, fills ``when_to_use`` from
``description`` when it is missing, makes the name a valid spawn key, maps model aliases to full
ids, and keeps Claude's tool names (which a report lists as not in the current catalog, so the bag
drops them until tools of those names exist). Each change is recorded so a person can check it.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from registry.errors import FieldProblem, PersonaError
from registry.parser import dump_persona, persona_from_mapping, read_document, read_text_file
from registry.persona import Persona

__all__ = ["ImportReport", "Imported", "convert_claude_file", "import_claude_files"]

#: Claude Code model aliases → full model ids.
MODEL_ALIASES: dict[str, str] = {
    "sonnet": "anthropic/claude-sonnet-4-6",
    "opus": "anthropic/claude-opus-4-7",
    "haiku": "anthropic/claude-haiku-4-5",
    "inherit": "",
}
#: Claude Code field names whose Ongrid twin has another spelling.
FIELD_RENAMES: dict[str, str] = {
    "disallowedTools": "disallowed_tools",
    "maxTurns": "max_turns",
    "initialPrompt": "initial_prompt",
    "whenToUse": "when_to_use",
}


@dataclass
class Imported:
    """One converted file: where it came from, the persona, and what was changed on the way."""

    source: str
    persona: Persona
    changes: list[str] = field(default_factory=list)
    unknown_tools: list[str] = field(default_factory=list)
    out: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "name": self.persona.name,
            "out": self.out,
            "changes": self.changes,
            "unknown_tools": self.unknown_tools,
        }


@dataclass
class ImportReport:
    imported: list[Imported] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)

    def unknown_tools(self) -> list[str]:
        return sorted({t for item in self.imported for t in item.unknown_tools})

    def as_dict(self) -> dict[str, Any]:
        return {
            "imported": [item.as_dict() for item in self.imported],
            "skipped": self.skipped,
            "unknown_tools": self.unknown_tools(),
        }


def _spawn_key(text: str) -> str:
    key = re.sub(r"[^a-z0-9_-]+", "-", text.strip().lower())
    key = re.sub(r"[-_]{2,}", "-", key).strip("-_")
    return key


def _first_line_of(body: str) -> str:
    return next((ln.strip("# ").strip() for ln in body.splitlines() if ln.strip("# ").strip()), "")


def _convert_mapping(
    data: dict[str, Any], body: str, stem: str, changes: list[str]
) -> dict[str, Any]:
    data = dict(data)
    for old, new in FIELD_RENAMES.items():
        if old in data and new not in data:
            data[new] = data.pop(old)
            changes.append(f"{old} → {new}")
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        data["name"] = _spawn_key(stem)
        changes.append(f"name missing: taken from the file name as {data['name']!r}")
    elif _spawn_key(name) != name:
        data["name"] = _spawn_key(name)
        changes.append(f"name {name!r} → {data['name']!r} (spawn keys are kebab-case)")
    description = data.get("description")
    if not isinstance(description, str) or not description.strip():
        data["description"] = _first_line_of(body)
        changes.append("description missing: taken from the body's first line")
    if not isinstance(data.get("when_to_use"), str) or not data["when_to_use"].strip():
        data["when_to_use"] = data["description"]
        changes.append("when_to_use ← description")
    model = data.get("model")
    if isinstance(model, str) and model in MODEL_ALIASES:
        data["model"] = MODEL_ALIASES[model]
        changes.append(f"model {model!r} → {data['model'] or 'organisation default'!r}")
    elif isinstance(model, str) and model.startswith("claude-"):
        data["model"] = f"anthropic/{model}"
        changes.append(f"model {model!r} → {data['model']!r}")
    return data


def convert_claude_file(path: str | Path, catalog_names: Collection[str] = ()) -> Imported:
    """Convert one file. Raises :class:`PersonaError` with the reason when it cannot be used."""
    source = str(path)
    data, body, notes = read_document(read_text_file(path), path=source)
    changes = list(notes)
    converted = _convert_mapping(data, body, Path(path).stem, changes)
    if not converted["description"]:
        raise PersonaError(
            [FieldProblem("description", "missing, and the body has no text to take it from")],
            source,
        )
    persona = persona_from_mapping(converted, body=body, path=source)
    unknown = [t for t in persona.tools if "*" not in t and t not in catalog_names]
    return Imported(source, persona, changes, unknown)


def _sources(paths: Iterable[Path]) -> list[tuple[Path, Path]]:
    """(file, root) pairs: the root is what the output layout is made relative to.

    With several source folders, each keeps its own name in the output (relative to its parent),
    so two collections given side by side never map onto the same output path.
    """
    paths = list(paths)
    several = sum(1 for p in paths if p.is_dir()) > 1
    out: list[tuple[Path, Path]] = []
    for path in paths:
        if path.is_dir():
            root = path.parent if several else path
            out.extend((f, root) for f in sorted(path.rglob("*.md")) if f.is_file())
        else:
            out.append((path, path.parent))
    return out


def import_claude_files(
    paths: Iterable[Path], out_dir: Path, catalog_names: Collection[str] = ()
) -> ImportReport:
    """Convert every ``*.md`` under ``paths`` into ``out_dir``.

    The output keeps each file's folder relative to the source it was found under (names repeat
    across collections: two ``code-reviewer`` files must not overwrite each other), and is named
    ``<name>.md``. Files that cannot be converted, and files whose output name is already taken,
    are skipped with the reason.
    """
    report = ImportReport()
    written: dict[Path, str] = {}
    for file, root in _sources(paths):
        if file.name in {"README.md", "SOURCES.md", "LICENSE.md", "CHANGELOG.md"}:
            continue
        try:
            item = convert_claude_file(file, catalog_names)
        except PersonaError as exc:
            report.skipped.append({"path": str(file), "reason": exc.reason})
            continue
        target = out_dir / file.parent.relative_to(root) / f"{item.persona.name}.md"
        if target in written:
            report.skipped.append(
                {
                    "path": str(file),
                    "reason": f"persona name {item.persona.name!r} is already taken in that "
                    f"folder by {written[target]}; rename one of them and import it again",
                }
            )
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(dump_persona(item.persona), encoding="utf-8", newline="")
        written[target] = str(file)
        item.out = str(target)
        report.imported.append(item)
    return report
