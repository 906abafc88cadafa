"""The subset of Go's text/template that ``initial_prompt`` may use: field lookups, nothing else.

Supported: ``{{.key}}``, ``{{ .key }}``, nested ``{{.a.b}}``, the whole context ``{{.}}`` and Go's
whitespace trim markers ``{{- .key -}}``. A missing key renders ``<no value>`` as Go's default
``missingkey`` option does. Anything else between ``{{`` and ``}}`` (pipelines, functions, range,
if) is rejected when the persona is loaded: no code runs, ever.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from registry.errors import TemplateError

__all__ = [
    "MAX_CONTEXT_BYTES",
    "MAX_CONTEXT_DEPTH",
    "MISSING",
    "Rendered",
    "check_context",
    "check_depth",
    "check_template",
    "render",
    "render_template",
    "walk_json",
]

#: How deep a spawn context may nest (``{"a": {"b": 1}}`` is 2) and how large it may be as JSON.
MAX_CONTEXT_DEPTH = 8
MAX_CONTEXT_BYTES = 16 * 1024

#: What Go prints for a key that is not in the map.
MISSING = "<no value>"

_ACTION = re.compile(r"\{\{(-\s)?(.*?)(\s-)?\}\}", re.DOTALL)
_FIELD = re.compile(r"^\.(?:[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)?$")


def _path(action: str, template: str) -> list[str]:
    expr = action.strip()
    if not _FIELD.match(expr):
        raise TemplateError(
            f"unsupported template action {{{{{action}}}}} in {template[:60]!r}: only field "
            "lookups such as {{.incident_id}} or {{.device.id}} are allowed"
        )
    return [part for part in expr.split(".") if part]


def check_template(template: str) -> None:
    """Raise :class:`TemplateError` if ``template`` uses anything outside the subset."""
    if template.rfind("{{") > template.rfind("}}"):
        # Refused before the pattern runs: from each '{{' with no '}}' after it the lazy
        # pattern would rescan the rest of the text, quadratic on a prompt full of '{{'.
        raise TemplateError(f"unclosed '{{{{' in {template[:60]!r}")
    for match in _ACTION.finditer(template):
        _path(match.group(2), template)
    rest = _ACTION.sub("", template)
    if "{{" in rest:
        raise TemplateError(f"unclosed '{{{{' in {template[:60]!r}")


#: What a lookup finds when a key is absent (distinct from a value that happens to read
#: ``<no value>``).
_ABSENT = object()


def _lookup(context: Any, path: list[str]) -> Any:
    value = context
    for key in path:
        if not isinstance(value, Mapping) or key not in value:
            return _ABSENT
        value = value[key]
    return value


def _format(value: Any) -> str:
    if value is None or value is _ABSENT:
        return MISSING
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping | list | tuple):
        return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    return str(value)


class Rendered(NamedTuple):
    """A rendered template and the keys that rendered ``<no value>``."""

    text: str
    #: Dotted paths (``device.id``) of the lookups that found no value (absent or null), each
    #: once, in the order they first appear in the template.
    missing: list[str]


def render(template: str, context: Mapping[str, Any] | None) -> Rendered:
    """Render ``template`` over ``context`` and say which keys it lacked.

    Values are inserted as text, never evaluated.
    """
    check_template(template)
    ctx = context or {}
    out: list[str] = []
    missing: list[str] = []
    pos = 0
    for match in _ACTION.finditer(template):
        chunk = template[pos : match.start()]
        if match.group(1):
            chunk = chunk.rstrip()
        out.append(chunk)
        path = _path(match.group(2), template)
        value = _lookup(ctx, path)
        if value is None or value is _ABSENT:
            key = ".".join(path) or "."
            if key not in missing:
                missing.append(key)
        out.append(_format(value))
        pos = match.end()
        if match.group(3):
            while pos < len(template) and template[pos].isspace():
                pos += 1
    out.append(template[pos:])
    return Rendered("".join(out), missing)


def render_template(template: str, context: Mapping[str, Any] | None) -> str:
    """Render ``template`` over ``context``. Values are inserted as text, never evaluated."""
    return render(template, context).text


def walk_json(value: Any) -> Iterator[tuple[Any, int]]:
    """Every node of JSON-like data (dict keys included) with its depth, the root at 1.

    Iterative: a hostile depth must not exhaust the recursion limit.
    """
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        yield item, depth
        if isinstance(item, dict):
            stack.extend((key, depth + 1) for key in item)
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)


def check_depth(value: Any, limit: int, what: str = "value") -> Any:
    """Refuse (``ValueError``) JSON-like data whose dicts and lists nest deeper than ``limit``."""
    for item, depth in walk_json(value):
        if depth > limit and isinstance(item, dict | list):
            raise ValueError(f"{what} nests deeper than {limit} levels")
    return value


def check_context(context: Mapping[str, Any]) -> Mapping[str, Any]:
    """Refuse (``ValueError`` saying why) a spawn context nested deeper than
    :data:`MAX_CONTEXT_DEPTH` or larger than :data:`MAX_CONTEXT_BYTES` as JSON."""
    check_depth(context, MAX_CONTEXT_DEPTH, "context")
    size = len(json.dumps(context, ensure_ascii=False, default=str).encode())
    if size > MAX_CONTEXT_BYTES:
        raise ValueError(f"context is {size} bytes as JSON; at most {MAX_CONTEXT_BYTES} allowed")
    return context
