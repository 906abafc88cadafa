"""Persona files: split the frontmatter from the body, read the YAML, validate, and write back.

Real persona files are messier than the format: CRLF line endings, a UTF-8 byte-order mark, no
trailing newline, ``tools`` as a comma-separated string, and descriptions that strict YAML rejects
(an unquoted ``: `` inside the text, a value opening with ``**``). The parser accepts all of them.
When the frontmatter is not valid YAML, a **lenient fallback** reads it as flat ``key: value``
lines: each line that starts at column 0 with ``key:`` opens a key, the indented or ``- `` lines
after it belong to it; each key's block is parsed as YAML on its own, and a block that still fails
is taken as plain text (surrounding quotes removed). The persona then loads with a note saying
which keys were read as text. A line the fallback cannot place fails the file with its line and
column. A block whose field takes a list or a mapping (``tools``, ``metadata``…), or that is shaped
like one (opening with ``[`` or ``{``, or made of ``- `` items or indented ``key:`` lines), is
structure, not text: if it is not valid YAML the file fails, naming the field, line and column.
Only ``yaml.safe_load`` semantics are used (the C loader when it is available).

Hostile files are bounded before anything walks them: the file's size, the frontmatter's size, and
what the frontmatter holds once every YAML alias is expanded (values, characters of text, depth).
Aliases are shared references, so a few lines of anchors can stand for billions of values (the
"billion laughs"); the bound counts them as expanded, measuring each shared node once, and stops as
soon as a limit is passed. The same bound applies to a mapping that did not come from YAML (the
API's JSON bodies).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from registry._bounds import (
    MAX_FILE_BYTES,
    MAX_FRONTMATTER_BYTES,
    MAX_FRONTMATTER_DEPTH,
    MAX_FRONTMATTER_TEXT,
    MAX_FRONTMATTER_VALUES,
    MAX_INTEGER_DIGITS,
    Oversized,
    measure_nodes,
    measure_values,
)
from registry.errors import FieldProblem, PersonaError, TemplateError
from registry.persona import FILE_FIELDS, PLUGIN_NAME_RESERVED, Persona

__all__ = [
    "MAX_FILE_BYTES",
    "MAX_FRONTMATTER_BYTES",
    "MAX_FRONTMATTER_DEPTH",
    "MAX_FRONTMATTER_TEXT",
    "MAX_FRONTMATTER_VALUES",
    "MAX_INTEGER_DIGITS",
    "Parsed",
    "check_bounds",
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
#: Anchors and tags in front of a value (``&base``, ``!!map``): not part of its shape.
_PROPERTIES = re.compile(r"^(?:[&!]\S*[ \t]*)+")


@dataclass(frozen=True)
class Parsed:
    """A loaded persona and the non-fatal notes about how it was read (e.g. the fallback)."""

    persona: Persona
    notes: tuple[str, ...] = ()


# -- bounded YAML ------------------------------------------------------------------------------


def check_bounds(data: Any, *, path: str | None = None) -> None:
    """Refuse (:class:`PersonaError` naming the key) frontmatter data past the bounds of
    :func:`registry._bounds.measure_values`, whatever it came from."""
    try:
        measure_values(data)
    except Oversized as exc:
        raise PersonaError([exc.problem], path) from None


def _bounded_load(text: str) -> Any:
    """What ``yaml.load`` does, with the composed document measured before it is built."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        measure_nodes(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _load_yaml(text: str) -> Any:
    """``yaml.safe_load`` of ``text``, refusing (:class:`Oversized`) a document past the bounds
    before any value is built from it."""
    try:
        return _bounded_load(text)
    except RecursionError:
        # The pure-Python composer recurses once per level, far past the depth bound.
        raise Oversized(
            FieldProblem("", f"frontmatter nests deeper than {MAX_FRONTMATTER_DEPTH} levels")
        ) from None
    except ValueError as exc:
        # The constructor's own checks (a date such as 2021-13-01, an integer too long to read)
        # refuse YAML that cannot be read, like a syntax error does.
        raise yaml.constructor.ConstructorError(problem=f"cannot read a value: {exc}") from None


# -- reading -----------------------------------------------------------------------------------


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


def _takes_structure(annotation: Any) -> bool:
    """Whether a field's declared type is a list or a mapping (a model counts as a mapping)."""
    kind = get_origin(annotation) or annotation
    if isinstance(kind, type):
        return issubclass(kind, list | tuple | set | dict | BaseModel)
    return any(_takes_structure(arg) for arg in get_args(annotation))


#: Fields whose value is a list or a mapping: their YAML must parse, never be read as text.
_STRUCTURED_FIELDS = frozenset(
    name for name in FILE_FIELDS if _takes_structure(Persona.model_fields[name].annotation)
)
#: Fields declared as text: whatever their value looks like (``[WIP] Disk: triage``), a block
#: that is not valid YAML is text, which is what the fallback exists for.
_TEXT_FIELDS = frozenset(
    name for name in FILE_FIELDS if Persona.model_fields[name].annotation in (str, "str")
)


@dataclass(frozen=True)
class _Block:
    """One top-level key of a frontmatter read by the fallback, and the lines that belong to it."""

    key: str
    line: int  # the key line's number in the file
    lines: list[str]

    @property
    def structured(self) -> bool:
        """Whether the block is a list or a mapping, by its field's type or by its shape."""
        if self.key in _STRUCTURED_FIELDS:
            return True
        if self.key in _TEXT_FIELDS:
            return False
        first = _KEY_LINE.match(self.lines[0])
        inline = _PROPERTIES.sub("", first.group(2) if first else "").strip()
        if inline and not inline.startswith("#"):
            return inline[0] in "[{"
        for line in self.lines[1:]:
            item = line.strip()
            if item and not item.startswith("#"):
                return item == "-" or item.startswith(("- ", "-\t")) or bool(_KEY_LINE.match(item))
        return False

    def text(self) -> str:
        """The block as plain text: the value after ``key:`` and its continuation lines."""
        first = _KEY_LINE.match(self.lines[0])
        rest = [first.group(2) if first else ""] + [ln.strip() for ln in self.lines[1:]]
        return _plain("\n".join(part for part in rest if part))

    def where(self, exc: yaml.YAMLError) -> str:
        """``line L, column C: YAML error: …`` in the file's numbering.

        An unclosed ``[`` is only noticed past the block's last line: the position is then
        where the broken list or mapping opened (the error's context).
        """
        context = getattr(exc, "context", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        mark = getattr(exc, "problem_mark", None)
        if mark is None or mark.line >= len(self.lines):
            mark = getattr(exc, "context_mark", None) or mark
        what = f"{context}: {problem}" if context else problem
        if mark is None or mark.line >= len(self.lines):
            return f"line {self.line}: YAML error: {what}"
        return f"line {self.line + mark.line}, column {mark.column + 1}: YAML error: {what}"


def _blocks(frontmatter: str, yaml_error: str, path: str | None) -> list[_Block]:
    blocks: list[_Block] = []
    for number, line in enumerate(frontmatter.splitlines(), start=2):
        match = _KEY_LINE.match(line)
        if match:
            blocks.append(_Block(match.group(1), number, [line]))
        elif not line.strip() or line.lstrip().startswith("#"):
            if blocks:
                blocks[-1].lines.append(line)
        elif line[0] in " \t-" and blocks:
            blocks[-1].lines.append(line)
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
    return blocks


def _value_of(block: _Block, parsed: Any) -> Any:
    """The block's value from its own YAML; a key YAML reads as another type (``on:``, ``yes:``
    are booleans) still names the block's only entry."""
    if isinstance(parsed, dict):
        if block.key in parsed:
            return parsed[block.key]
        if len(parsed) == 1:
            return next(iter(parsed.values()))
    raise KeyError(block.key)


def _lenient(
    frontmatter: str, yaml_error: str, path: str | None
) -> tuple[dict[str, Any], list[str]]:
    """Read flat ``key: value`` blocks; return the mapping and the keys taken as plain text.

    A list or mapping block whose YAML is broken fails the file, every such block named.
    """
    data: dict[str, Any] = {}
    as_text: list[str] = []
    broken: list[FieldProblem] = []
    for block in _blocks(frontmatter, yaml_error, path):
        try:
            data[block.key] = _value_of(block, _load_yaml("\n".join(block.lines) + "\n"))
        except Oversized as exc:
            problem = exc.problem
            raise PersonaError(
                [FieldProblem(problem.field or block.key, problem.message)], path
            ) from None
        except (yaml.YAMLError, KeyError) as exc:
            if not block.structured:
                data[block.key] = block.text()
                as_text.append(block.key)
            elif isinstance(exc, yaml.YAMLError):
                broken.append(FieldProblem(block.key, block.where(exc)))
            else:
                broken.append(FieldProblem(block.key, f"line {block.line}: not one 'key: value'"))
    if broken:
        raise PersonaError(broken, path)
    return data, as_text


def _read_frontmatter(frontmatter: str, path: str | None) -> tuple[dict[str, Any], list[str]]:
    size = len(frontmatter.encode("utf-8"))
    if size > MAX_FRONTMATTER_BYTES:
        raise PersonaError(
            [FieldProblem("", f"frontmatter is {size} bytes; at most {MAX_FRONTMATTER_BYTES}")],
            path,
        )
    notes: list[str] = []
    try:
        data = _load_yaml(frontmatter)
    except Oversized as exc:
        raise PersonaError([exc.problem], path) from None
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
    check_bounds(data, path=path)  # the blocks of the fallback, counted together
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
    data: dict[str, Any],
    *,
    body: str = "",
    path: str | None = None,
    plugin_name: bool = False,
) -> Persona:
    """Validate a frontmatter mapping. Keys the format does not define are kept verbatim.

    The mapping is bounded first (:func:`check_bounds`), whatever it came from. A name of the
    ``<plugin>:<agent>`` form is refused unless ``plugin_name`` (a persona installed with a
    plugin, or the pinned copy of one a spawn resumes with).
    """
    check_bounds(data, path=path)
    known = {k: v for k, v in data.items() if k in _KNOWN}
    unknown = {str(k): v for k, v in data.items() if k not in _KNOWN}
    try:
        persona = Persona(**known, body=body, unknown_fields=unknown, path=path)
    except ValidationError as exc:
        raise PersonaError(_problems(exc), path) from None
    except TemplateError as exc:
        raise PersonaError([FieldProblem("initial_prompt", str(exc))], path) from None
    if ":" in persona.name and not plugin_name:
        raise PersonaError([FieldProblem("name", PLUGIN_NAME_RESERVED)], path)
    return persona


def read_document(text: str, *, path: str | None = None) -> tuple[dict[str, Any], str, list[str]]:
    """Split and read a persona-shaped file without validating it: (mapping, body, notes).

    Importers use this to repair a foreign file before validation; everyone else wants
    :func:`parse_persona`.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        # Only a caller's string can hold one (files are decoded strictly); nothing downstream
        # could write it back.
        raise PersonaError(
            [FieldProblem("", f"not valid Unicode text (character {exc.start}: {exc.reason})")],
            path,
        ) from None
    text = text.removeprefix("\ufeff")
    frontmatter, body, notes = _split(text, path)
    data, yaml_notes = _read_frontmatter(frontmatter, path)
    return data, body, notes + yaml_notes


def parse_persona(text: str, *, path: str | None = None, plugin_name: bool = False) -> Parsed:
    """Parse a persona from the text of a file. Raises :class:`PersonaError` naming each problem.

    ``plugin_name``: see :func:`persona_from_mapping`."""
    data, body, notes = read_document(text, path=path)
    return Parsed(
        persona_from_mapping(data, body=body, path=path, plugin_name=plugin_name), tuple(notes)
    )


def read_text_file(path: str | Path) -> str:
    """A file's text as UTF-8; unreadable or undecodable files are a PersonaError."""
    name = str(path)
    try:
        with Path(path).open("rb") as handle:
            raw = handle.read(MAX_FILE_BYTES + 1)  # never more, however large the file
    except OSError as exc:
        raise PersonaError([FieldProblem("", f"cannot read file: {exc.strerror}")], name) from None
    if len(raw) > MAX_FILE_BYTES:
        raise PersonaError(
            [FieldProblem("", f"file is larger than {MAX_FILE_BYTES // 1024} KiB")], name
        )
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
