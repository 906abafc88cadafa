"""Bounds on a persona's frontmatter, counted as if every YAML alias were expanded.

YAML aliases are shared references: a few lines of anchors can stand for billions of values (the
"billion laughs"), harmless until something walks the expanded tree (validation, a JSON or YAML
dump, a copy). :class:`_Measure` counts values, characters of text and depth as expanded, but
measures each shared container once (memoised by ``id``), so its own work follows the document's
size; it is iterative and stops as soon as a limit is passed. It reads composed YAML nodes (before
any value is built) and loaded values alike, so a mapping that never was YAML (an API's JSON body)
gets the same bounds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import yaml

from registry.errors import FieldProblem

__all__ = [
    "MAX_FILE_BYTES",
    "MAX_FRONTMATTER_BYTES",
    "MAX_FRONTMATTER_DEPTH",
    "MAX_FRONTMATTER_TEXT",
    "MAX_FRONTMATTER_VALUES",
    "MAX_INTEGER_DIGITS",
    "Oversized",
    "measure_nodes",
    "measure_values",
]

#: Largest persona file read, the body included (a system prompt is far smaller).
MAX_FILE_BYTES = 1024 * 1024
#: Largest frontmatter: UTF-8 bytes between the ``---`` lines.
MAX_FRONTMATTER_BYTES = 64 * 1024
#: Most values a frontmatter may hold, mapping keys included, every alias expanded.
MAX_FRONTMATTER_VALUES = 10_000
#: Most characters of text (strings and keys) a frontmatter may hold, every alias expanded.
MAX_FRONTMATTER_TEXT = MAX_FRONTMATTER_BYTES
#: Deepest nesting of mappings and lists; the frontmatter mapping itself is level 1.
MAX_FRONTMATTER_DEPTH = 32
#: Longest integer kept: Python refuses to write much longer ones as text (JSON, YAML, logs).
MAX_INTEGER_DIGITS = 4000
_MAX_INTEGER_BITS = int(MAX_INTEGER_DIGITS * math.log2(10))
_ALIASES = "through YAML aliases (anchors and aliases used as a 'billion laughs')"


class _Limit(Exception):
    """A bound passed somewhere below one top-level key; :class:`_Measure` adds the key."""


class Oversized(Exception):
    """Data past a bound; ``problem`` names the top-level key and the bound.

    Not a YAML error, so a reader that falls back on YAML errors never retries it."""

    def __init__(self, problem: FieldProblem) -> None:
        super().__init__(str(problem))
        self.problem = problem


#: (children, characters of text, whether the children alternate key and value).
_Parts = tuple[Iterable[Any] | None, int, bool]


def _value_parts(value: Any) -> _Parts:
    """How :class:`_Measure` sees loaded data: dicts, lists, tuples and sets hold values."""
    if isinstance(value, dict):
        return chain.from_iterable(value.items()), 0, True
    if isinstance(value, list | tuple | set | frozenset):
        return value, 0, False
    if isinstance(value, str):
        return None, len(value), False
    if isinstance(value, bytes):
        # Pydantic cannot write arbitrary bytes as JSON: one such value breaks every listing.
        raise _Limit("binary data (!!binary) is not supported: write it as text")
    if isinstance(value, int) and value.bit_length() > _MAX_INTEGER_BITS:
        raise _Limit(f"holds an integer of more than {MAX_INTEGER_DIGITS} digits")
    return None, 0, False


def _node_parts(node: yaml.Node) -> _Parts:
    """How :class:`_Measure` sees a composed YAML document, before any value is built."""
    if isinstance(node, yaml.MappingNode):
        return chain.from_iterable(node.value), 0, True
    if isinstance(node, yaml.SequenceNode):
        return node.value, 0, False
    return None, len(node.value), False


def _label(key: Any) -> str:
    """A top-level key as a field name (a key node's text, or a loaded key)."""
    if isinstance(key, yaml.ScalarNode):
        key = key.value
    return str(key)[:60] if isinstance(key, str | int | float) else ""


@dataclass
class _Frame:
    """A container being measured: where the running totals stood when it was entered."""

    node: Any
    children: Iterator[Any]
    depth: int
    values: int
    text: int
    height: int = 1


_END = object()


@dataclass
class _Measure:
    """The size of data as if every alias were expanded.

    A container reached again through an alias adds the totals memoised for it (by ``id``)
    instead of being walked again, so the work follows the document's own size however far it
    expands; the walk is iterative and raises as soon as a limit is passed.
    """

    parts: Callable[[Any], _Parts]
    #: Composed nodes are shared only through aliases, so a repeated scalar node is one too.
    scalars_shared_by_alias: bool = False
    values: int = 0
    text: int = 0
    shared: bool = False
    _done: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    _open: set[int] = field(default_factory=set)
    _scalars: set[int] = field(default_factory=set)

    def check(self, root: Any) -> None:
        """Raise :class:`Oversized` naming the top-level key under which a bound is passed."""
        label = ""
        try:
            children, text, mapping = self.parts(root)
            self._add(1, text)
            if children is None:
                return
            self._open.add(id(root))
            for index, child in enumerate(children):
                if mapping and index % 2 == 0:
                    label = _label(child)
                self._walk(child)
        except _Limit as exc:
            raise Oversized(FieldProblem(label, str(exc))) from None

    def _add(self, values: int, text: int) -> None:
        self.values += values
        self.text += text
        how = _ALIASES if self.shared else ""
        if self.values > MAX_FRONTMATTER_VALUES:
            raise _Limit(
                f"frontmatter expands to more than {MAX_FRONTMATTER_VALUES} values {how}"
                if how
                else f"frontmatter holds more than {MAX_FRONTMATTER_VALUES} values"
            )
        if self.text > MAX_FRONTMATTER_TEXT:
            raise _Limit(
                f"frontmatter text expands to more than {MAX_FRONTMATTER_TEXT} characters {how}"
                if how
                else f"frontmatter holds more than {MAX_FRONTMATTER_TEXT} characters of text"
            )

    def _visit(self, item: Any, depth: int) -> tuple[_Frame | None, int]:
        """Count ``item`` at ``depth``: (a frame to descend into, or None; its height)."""
        children, text, _ = self.parts(item)
        key = id(item)
        if children is None:
            if self.scalars_shared_by_alias:
                self.shared = self.shared or key in self._scalars
                self._scalars.add(key)
            self._add(1, text)
            return None, 0
        if key in self._open:
            raise _Limit("refers to itself through a YAML alias (a recursive structure)")
        done = self._done.get(key)
        deepest = depth if done is None else depth + done[2] - 1
        if deepest > MAX_FRONTMATTER_DEPTH:
            raise _Limit(f"frontmatter nests deeper than {MAX_FRONTMATTER_DEPTH} levels")
        if done is not None:
            self.shared = True
            self._add(done[0], done[1])
            return None, done[2]
        self._add(1, text)
        self._open.add(key)
        return _Frame(item, iter(children), depth, self.values - 1, self.text), 0

    def _walk(self, item: Any) -> None:
        """Count a top-level value (depth 2) and everything under it."""
        frame, _ = self._visit(item, 2)
        stack = [frame] if frame is not None else []
        while stack:
            top = stack[-1]
            child = next(top.children, _END)
            if child is _END:
                stack.pop()
                self._open.discard(id(top.node))
                self._done[id(top.node)] = (
                    self.values - top.values,
                    self.text - top.text,
                    top.height,
                )
                if stack:
                    stack[-1].height = max(stack[-1].height, top.height + 1)
                continue
            sub, height = self._visit(child, top.depth + 1)
            if sub is not None:
                stack.append(sub)
            else:
                top.height = max(top.height, height + 1)


def measure_values(data: Any) -> None:
    """Raise :class:`Oversized` for loaded data past the bounds: more than
    :data:`MAX_FRONTMATTER_VALUES` values, :data:`MAX_FRONTMATTER_TEXT` characters or
    :data:`MAX_FRONTMATTER_DEPTH` levels with every alias expanded, a recursive structure, binary
    data, or an integer of more than :data:`MAX_INTEGER_DIGITS` digits."""
    _Measure(_value_parts).check(data)


def measure_nodes(node: yaml.Node) -> None:
    """Raise :class:`Oversized` for a composed YAML document past the bounds, before any value
    is built from it (the constructor would follow every alias)."""
    _Measure(_node_parts, scalars_shared_by_alias=True).check(node)
