"""Persona files: split the frontmatter from the body, read the YAML, validate, and write back.

Real persona files are messier than the format: CRLF line endings, a UTF-8 byte-order mark, no
trailing newline, ``tools`` as a comma-separated string, and descriptions that strict YAML rejects
(an unquoted ``: `` inside the text, a value opening with ``**``). The parser accepts all of them.
When the frontmatter is not valid YAML, a **lenient fallback** reads it as flat ``key: value``
lines: each line that starts at column 0 with ``key:`` opens a key, the indented or ``- `` lines
after it belong to it; each key's block is parsed as YAML on its own, and a block that still fails
is taken as plain text (surrounding quotes removed). The persona then loads with a note saying
which keys were read as text. A line the fallback cannot place fails the file with its line and
column. Only ``yaml.safe_load`` semantics are used (the C loader when it is available).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from registry.errors import FieldProblem, PersonaError, TemplateError
from registry.persona import FILE_FIELDS, Persona

__all__ = [
    "Parsed",
    "dump_persona",
    "load_persona_file",
    "parse_persona",
    "persona_from_mapping",
    "read_document",
    "read_text_file",
]

_Loader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_BaseDumper: type = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
_KNOWN = frozenset(FILE_FIELDS)
_RULE = re.compile(r"^-{4,}[ \t]*\r?\n?$")
_KEY_LINE = re.compile(r"^([A-Za-z_][A-Za-z0-9_.-]*)[ \t]*:(?:[ \t]|$)(.*)$")


@dataclass(frozen=True)
class Parsed:
    """A loaded persona and the non-fatal notes about how it was read (e.g. the fallback)."""

    persona: Persona
    notes: tuple[str, ...] = ()


def _split(text: str, path: str | None) -> tuple[str, str, list[str]]:
    """Return (frontmatter, body, notes). The body is everything after the closing line."""
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].rstrip() != "---":
        raise PersonaError(
            [FieldProblem("", "no frontmatter: the file must start with a '---' line")], path
        )
    closing = next((i for i in range(1, len(lines)) if lines[i].rstrip() == "---"), None)
    notes = []
    if closing is None:
        # Some published files close with a longer rule ("-----"); tools that match a "---"
        # prefix accept them, so we do too, and say so.
        closing = next((i for i in range(1, len(lines)) if _RULE.match(lines[i])), None)
        if closing is None:
            raise PersonaError(
                [FieldProblem("", "frontmatter is not closed: no '---' line after line 1")], path
            )
        notes.append(
            f"frontmatter closed by line {closing + 1} ({lines[closing].strip()[:12]}…)"
            " instead of '---'"
        )
    return "".join(lines[1:closing]), "".join(lines[closing + 1 :]), notes


def _where(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if mark is None:
        return problem
    # +2: the frontmatter starts on the file's second line; marks count from 0.
    return f"line {mark.line + 2}, column {mark.column + 1}: {problem}"


def _plain(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def _lenient(frontmatter: str, yaml_error: str, path: str | None) -> tuple[dict[str, Any], list]:
    """Read flat ``key: value`` blocks; return the mapping and the keys taken as plain text."""
    blocks: list[tuple[str, list[str]]] = []
    for number, line in enumerate(frontmatter.splitlines(), start=2):
        match = _KEY_LINE.match(line)
        if match:
            blocks.append((match.group(1), [line]))
        elif not line.strip() or line.lstrip().startswith("#"):
            if blocks:
                blocks[-1][1].append(line)
        elif line[0] in " \t-" and blocks:
            blocks[-1][1].append(line)
        else:
            raise PersonaError(
                [
                    FieldProblem(
                        "",
                        f"frontmatter is not valid YAML ({yaml_error}) and line {number}, "
                        f"column 1 is not a 'key: value' line either: {line.strip()[:60]!r}",
                    )
                ],
                path,
            )
    data: dict[str, Any] = {}
    as_text: list[str] = []
    for key, block in blocks:
        try:
            parsed = yaml.load("\n".join(block) + "\n", Loader=_Loader)  # noqa: S506 - safe loader
            data[key] = parsed[key]
        except (yaml.YAMLError, TypeError, KeyError):
            first = _KEY_LINE.match(block[0])
            rest = [first.group(2) if first else ""] + [ln.strip() for ln in block[1:]]
            data[key] = _plain("\n".join(part for part in rest if part))
            as_text.append(key)
    return data, as_text


def _read_frontmatter(frontmatter: str, path: str | None) -> tuple[dict[str, Any], list[str]]:
    notes: list[str] = []
    try:
        data = yaml.load(frontmatter, Loader=_Loader)  # noqa: S506 - safe loader
    except yaml.YAMLError as exc:
        where = _where(exc)
        data, as_text = _lenient(frontmatter, where, path)
        keys = ", ".join(as_text) or "none"
        notes.append(
            f"frontmatter is not valid YAML ({where}); read with the lenient key: value "
            f"fallback (keys read as plain text: {keys})"
        )
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise PersonaError(
            [FieldProblem("", f"frontmatter must be a mapping, got {type(data).__name__}")], path
        )
    return data, notes


def _problems(exc: ValidationError) -> list[FieldProblem]:
    out = []
    for err in exc.errors():
        field = ".".join(str(part) for part in err["loc"])
        if err["type"] == "missing":
            out.append(FieldProblem(field, "required field is missing"))
            continue
        message = err["msg"].removeprefix("Value error, ")
        got = err.get("input")
        if got is not None and err["type"] != "value_error" and not isinstance(got, dict):
            message += f" (got {got!r:.80})"
        out.append(FieldProblem(field, message))
    return out


def persona_from_mapping(
    data: dict[str, Any], *, body: str = "", path: str | None = None
) -> Persona:
    """Validate a frontmatter mapping. Keys the format does not define are kept verbatim."""
    known = {k: v for k, v in data.items() if k in _KNOWN}
    unknown = {str(k): v for k, v in data.items() if k not in _KNOWN}
    try:
        return Persona(**known, body=body, unknown_fields=unknown, path=path)
    except ValidationError as exc:
        raise PersonaError(_problems(exc), path) from None
    except TemplateError as exc:
        raise PersonaError([FieldProblem("initial_prompt", str(exc))], path) from None


def read_document(text: str, *, path: str | None = None) -> tuple[dict[str, Any], str, list[str]]:
    """Split and read a persona-shaped file without validating it: (mapping, body, notes).

    Importers use this to repair a foreign file before validation; everyone else wants
    :func:`parse_persona`.
    """
    text = text.removeprefix("\ufeff")
    frontmatter, body, notes = _split(text, path)
    data, yaml_notes = _read_frontmatter(frontmatter, path)
    return data, body, notes + yaml_notes


def parse_persona(text: str, *, path: str | None = None) -> Parsed:
    """Parse a persona from the text of a file. Raises :class:`PersonaError` naming each problem."""
    data, body, notes = read_document(text, path=path)
    return Parsed(persona_from_mapping(data, body=body, path=path), tuple(notes))


def read_text_file(path: str | Path) -> str:
    """A file's text as UTF-8; unreadable or undecodable files are a PersonaError."""
    name = str(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise PersonaError([FieldProblem("", f"cannot read file: {exc.strerror}")], name) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PersonaError(
            [FieldProblem("", f"not UTF-8 text (byte {exc.start}: {exc.reason})")], name
        ) from None
    return text


def load_persona_file(path: str | Path) -> Parsed:
    """Read and parse one file. Every failure, I/O and encoding included, is a PersonaError."""
    return parse_persona(read_text_file(path), path=str(path))


class _Dumper(_BaseDumper):  # type: ignore[misc,valid-type]
    """Writes multi-line strings as ``|`` blocks so prompts stay readable in the file."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def _frontmatter_data(persona: Persona) -> dict[str, Any]:
    data: dict[str, Any] = {}
    always = {"name", "description", "when_to_use"}
    for field in FILE_FIELDS:
        if field not in persona.model_fields_set and field not in always:
            continue
        value = getattr(persona, field)
        if field == "metadata":
            value = value.model_dump(mode="python", exclude_unset=True)
        elif field == "permission_mode":
            value = value.value
        data[field] = value
    data.update(persona.unknown_fields)
    return data


def dump_persona(persona: Persona) -> str:
    """The on-disk text: parsing it again gives an equal persona and the body byte for byte."""
    newline = "\r\n" if "\r\n" in persona.body else "\n"
    front = yaml.dump(
        _frontmatter_data(persona),
        Dumper=_Dumper,
        sort_keys=False,
        allow_unicode=True,
        default_flow_style=False,
        width=10_000,
    )
    if newline != "\n":
        front = front.replace("\n", newline)
    return f"---{newline}{front}---{newline}{persona.body}"
