"""Lint the personas of a snapshot against the tool catalog and the settings.

A persona file can be valid and still not do what its author meant: a misspelt tool is dropped
from the bag without a word (SPEC §4), a read-only persona cannot run the write tool it lists.
:func:`lint` finds such problems; each :class:`Finding` names the persona (or the file that did not
load), its kind, what is wrong and what to do about it.

Every kind but ``missing_config`` and ``model`` depends only on the personas and the tool
catalog; those two depend on the host where they are checked (a tool whose backend URL is unset
answers "not configured" there, and may be configured on the workers; a provider's key may be
set on one host and not another): the API takes ``model`` from the workers' own reports.
"""

from __future__ import annotations

import difflib
import re
import unicodedata
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from registry.agent_registry import Snapshot
from registry.errors import NotFoundError
from registry.persona import PermissionMode, Persona, Source
from registry.policy import ToolBag, confirmation_for, matches_any, resolve_bag
from registry.settings import Settings, env_var_of
from registry.tools import AGENT_TOOL_NAME, ToolCatalog, ToolClass

__all__ = ["COLLISION_THRESHOLD", "Finding", "FindingKind", "hint_tokens", "lint"]

#: Two catalog lines collide when this share of their words (token-set Jaccard, after folding
#: case and dropping punctuation) is common to both. On the 967 Claude Code agents of the test
#: corpus, 0.8 flags 122 pairs: 119 identical lines and 3 near ones, of which 2 (Python vs
#: TypeScript, Next.js vs Nuxt) a reader can tell apart. Between 0.6 and 0.8 lie 12 more copies
#: with a reworded line, but also 5 distinct pairs (AWS vs Azure, React vs Vue): not flagged.
COLLISION_THRESHOLD = 0.8

_WORD = re.compile(r"[^\W_]+")


class FindingKind(StrEnum):
    """What a finding is about."""

    #: A file or stored persona that did not load, or a note on one that did.
    LOAD = "load"
    #: A name in ``tools`` or ``disallowed_tools`` that is no tool of the catalog.
    UNKNOWN_TOOL = "unknown_tool"
    #: A ``*`` pattern in ``tools`` or ``disallowed_tools`` that matches no tool.
    PATTERN_MATCHES_NOTHING = "pattern_matches_nothing"
    #: A whitelisted tool the persona's own fields keep out of its bag.
    DROPPED_TOOL = "dropped_tool"
    #: A bag that is empty for every role linted.
    NO_TOOLS = "no_tools"
    #: Two personas whose catalog lines are the same or nearly so.
    WHEN_TO_USE_COLLISION = "when_to_use_collision"
    #: A tool in the bag whose required setting is unset here.
    MISSING_CONFIG = "missing_config"
    #: A model that cannot be used where it was checked (unknown provider, key unset).
    MODEL = "model"


@dataclass(frozen=True)
class Finding:
    """One problem: where it is, what kind, what is wrong (``reason``) and what to do (``hint``)."""

    kind: FindingKind
    reason: str
    #: The persona's name; empty for a file that did not load.
    persona: str = ""
    source: str = ""
    path: str = ""
    hint: str = ""
    #: What the finding is about: the tool name or pattern, the other persona of a collision,
    #: the unset setting; empty for ``load`` and ``no_tools``.
    subject: str = ""

    def as_dict(self) -> dict[str, str]:
        return {
            "kind": self.kind.value,
            "persona": self.persona,
            "source": self.source,
            "path": self.path,
            "subject": self.subject,
            "reason": self.reason,
            "hint": self.hint,
        }


def lint(
    snapshot: Snapshot,
    catalog: ToolCatalog,
    settings: Settings,
    role: str | None = None,
    *,
    model_problems: Mapping[str, str] | None = None,
) -> list[Finding]:
    """Every finding of ``snapshot``: load problems first, then each persona's, by name.

    Bags are computed for ``role``, or for every role of ``settings`` when it is ``None``: a bag
    is then empty only when it is empty for all of them, and a setting is missing when a tool of
    any of them needs it. ``model_problems`` (persona → why its model cannot be used, from
    :func:`workers.model.resolve_model` where the check ran) become ``model`` findings.
    """
    if role is not None and role not in settings.roles:
        raise NotFoundError("role", role, list(settings.roles))
    roles = [role] if role is not None else list(settings.roles)
    findings = [Finding(FindingKind.LOAD, w.reason, path=w.path) for w in snapshot.warnings]
    personas = [snapshot.personas[name] for name in snapshot.names()]
    collisions = _collisions(personas)
    for persona in personas:
        bags = {r: resolve_bag(persona, catalog, settings.roles[r].tools, role=r) for r in roles}
        problems = [
            *_tool_names(persona, catalog),
            *_dropped(persona, catalog),
            *_no_tools(persona, catalog, settings, bags),
            *collisions.get(persona.name, ()),
            *_missing_config(bags.values(), settings),
            *_model(persona, (model_problems or {}).get(persona.name, "")),
        ]
        source, path = _where(persona)
        findings.extend(
            Finding(kind, reason, persona.name, source, path, hint, subject)
            for kind, subject, reason, hint in problems
        )
    return findings


#: A finding before it is placed: (kind, subject, reason, hint).
_Problem = tuple[FindingKind, str, str, str]


def _where(persona: Persona) -> tuple[str, str]:
    source = persona.source.value if persona.source else ""
    if persona.path:
        return source, persona.path
    if persona.source is Source.USER:
        return source, f"database:agents/{persona.name}"
    return source, f"{source}:{persona.name}" if source else persona.name


def _model(persona: Persona, problem: str) -> Iterator[_Problem]:
    if problem:
        hint = "a spawn of it fails with this sentence until then"
        subject = persona.model or "(organisation default)"
        # The kind already says "model": the reason starts with the model itself.
        yield FindingKind.MODEL, subject, problem.removeprefix("model "), hint


# -- tool names ------------------------------------------------------------------------------------


def _tool_names(persona: Persona, catalog: ToolCatalog) -> Iterator[_Problem]:
    """Names that are no tool, and patterns that match none, in either list."""
    names = catalog.names()
    for field in ("tools", "disallowed_tools"):
        white = field == "tools"
        for entry in getattr(persona, field):
            if entry == AGENT_TOOL_NAME:
                continue  # never in a worker's bag: _dropped says so for a whitelisted one
            if "*" in entry:
                if not any(matches_any(n, [entry]) for n in names):
                    yield _unmatched_pattern(field, entry, white)
            elif entry not in catalog:
                yield _unknown(field, entry, names, white)


def _unmatched_pattern(field: str, entry: str, white: bool) -> _Problem:
    effect = "it adds no tool to the bag" if white else "it keeps nothing out of the bag"
    return (
        FindingKind.PATTERN_MATCHES_NOTHING,
        entry,
        f"{field} pattern {entry!r} matches no tool of the catalog: {effect}",
        "correct the pattern (`*` is the only wildcard) or remove it; `ongrid agents bag` "
        "lists the tools",
    )


def _unknown(field: str, entry: str, names: Sequence[str], white: bool) -> _Problem:
    effect = "it is dropped from the bag" if white else "it keeps nothing out of the bag"
    # 0.75: a letter or two wrong in a name; lower, it offers any tool of the same family.
    close = difflib.get_close_matches(entry, names, n=3, cutoff=0.75)
    hint = (
        f"did you mean {' or '.join(repr(c) for c in close)}?"
        if close
        else "remove it, or add a tool of that name through tool_modules"
    )
    return (
        FindingKind.UNKNOWN_TOOL,
        entry,
        f"{field} names {entry!r}, no tool of the catalog: {effect}",
        hint,
    )


def _dropped(persona: Persona, catalog: ToolCatalog) -> Iterator[_Problem]:
    """Whitelisted tools that the persona's own ``disallowed_tools`` or mode keep out."""
    mode = persona.permission_mode
    for entry in persona.tools:
        if entry == AGENT_TOOL_NAME:
            yield (
                FindingKind.DROPPED_TOOL,
                AGENT_TOOL_NAME,
                f"tools lists {AGENT_TOOL_NAME!r}, which is never in a worker's bag: workers "
                "cannot spawn workers",
                "remove it; only the coordinator spawns personas",
            )
            continue
        if "*" in entry or entry not in catalog:
            continue
        black = matches_any(entry, persona.disallowed_tools)
        if black:
            yield (
                FindingKind.DROPPED_TOOL,
                entry,
                f"tools lists {entry!r} and disallowed_tools pattern {black!r} matches it: it "
                "is never in the bag (black wins)",
                "remove it from one of the two lists",
            )
            continue
        tool_class = catalog.get(entry).tool_class
        if confirmation_for(mode, tool_class) is None:
            yield (
                FindingKind.DROPPED_TOOL,
                entry,
                f"tools lists {entry!r}, of class {tool_class.value}, which permission_mode "
                f"{mode.value} does not allow: it is never in the bag",
                f"use permission_mode {_mode_for(tool_class).value}, or remove it from tools",
            )


def _mode_for(tool_class: ToolClass) -> PermissionMode:
    """The least permissive mode that allows ``tool_class``."""
    return next(m for m in PermissionMode if confirmation_for(m, tool_class) is not None)


# -- the bag ---------------------------------------------------------------------------------------


def _no_tools(
    persona: Persona, catalog: ToolCatalog, settings: Settings, bags: Mapping[str, ToolBag]
) -> Iterator[_Problem]:
    if not bags or any(len(bag) for bag in bags.values()):
        return
    roles = ", ".join(bags)
    mode = persona.permission_mode
    # Would a mode that allows every class leave something? Then the mode alone empties the bag.
    widest = persona.model_copy(update={"permission_mode": PermissionMode.DUAL_SIGN_REQUIRED})
    kept = sorted(
        {
            e.tool.name
            for r in bags
            for e in resolve_bag(widest, catalog, settings.roles[r].tools, role=r)
        }
    )
    if kept:
        yield (
            FindingKind.NO_TOOLS,
            "",
            f"permission_mode {mode.value} leaves no tool in the bag (roles: {roles}): the "
            f"tools it asks for ({', '.join(kept)}) are all of classes the mode forbids",
            f"use permission_mode {_mode_for(_least_class(catalog, kept)).value}, or give it "
            "read tools",
        )
        return
    yield (
        FindingKind.NO_TOOLS,
        "",
        f"the bag is empty for every role linted ({roles}): no tool of the catalog is both "
        "whitelisted and not disallowed, and visible to the role",
        "check tools and disallowed_tools against the catalog (`ongrid agents bag NAME`)",
    )


def _least_class(catalog: ToolCatalog, names: Iterable[str]) -> ToolClass:
    order = list(ToolClass)
    return min((catalog.get(n).tool_class for n in names), key=order.index)


def _missing_config(bags: Iterable[ToolBag], settings: Settings) -> Iterator[_Problem]:
    """One problem per unset setting, naming the tools of the bags that need it."""
    needing: dict[str, set[str]] = {}
    for bag in bags:
        for entry in bag:
            for key in entry.tool.requires:
                if not settings.has_config(key):
                    needing.setdefault(key, set()).add(entry.tool.name)
    for key in sorted(needing):
        tools = sorted(needing[key])
        var = env_var_of(key)
        where = f"set {var} (or {key} in ONGRID_CONFIG)" if var else f"set {key} in ONGRID_CONFIG"
        need, answer = ("needs", "it answers") if len(tools) == 1 else ("need", "they answer")
        yield (
            FindingKind.MISSING_CONFIG,
            key,
            f"{', '.join(tools)} {need} setting {key}, unset here: {answer} 'not configured'",
            f"{where} where the workers run",
        )


# -- catalog lines ---------------------------------------------------------------------------------


def hint_tokens(text: str) -> frozenset[str]:
    """The words of a catalog line, case and compatibility forms folded, punctuation dropped."""
    return frozenset(_WORD.findall(unicodedata.normalize("NFKC", text).casefold()))


def _collisions(personas: Sequence[Persona]) -> dict[str, list[_Problem]]:
    """Pairs of personas whose catalog lines share at least :data:`COLLISION_THRESHOLD`."""
    items = sorted(((hint_tokens(p.catalog_hint), p) for p in personas), key=lambda i: len(i[0]))
    found: dict[str, list[_Problem]] = {}
    for i, (words, persona) in enumerate(items):
        for other_words, other in items[i + 1 :]:
            # Sorted by size: Jaccard is at most len(words) / len(other_words), which only falls.
            if len(words) < COLLISION_THRESHOLD * len(other_words):
                break
            score = _similarity(words, other_words, persona, other)
            if score >= COLLISION_THRESHOLD:
                found.setdefault(persona.name, []).append(_collision(other, score))
                found.setdefault(other.name, []).append(_collision(persona, score))
    return found


def _similarity(a: frozenset[str], b: frozenset[str], pa: Persona, pb: Persona) -> float:
    union = a | b
    if not union:  # no word in either line: only the same text is the same line
        return 1.0 if pa.catalog_hint == pb.catalog_hint else 0.0
    return len(a & b) / len(union)


def _collision(other: Persona, score: float) -> _Problem:
    how = "the same as" if score == 1 else f"nearly the same ({score:.0%} of words shared) as"
    return (
        FindingKind.WHEN_TO_USE_COLLISION,
        other.name,
        f"the first line of when_to_use is {how} that of {other.name!r} ({_where(other)[1]}): "
        "the coordinator's catalog cannot tell them apart",
        "make the first line say when to pick this persona rather than the other",
    )
