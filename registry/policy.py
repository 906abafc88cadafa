"""Which tools a spawn may call, and what confirmation each call needs (SPEC §4).

The bag is computed per spawn, in this order:

1. the tools the caller's role may see (patterns from the role's configuration);
2. intersected with the persona's ``tools`` when that list is non-empty (empty inherits step 1,
   but only the runtime's own tools: a tool a bundle brought — a skill manifest's, an MCP
   server's — enters a bag only when ``tools`` names it or matches it by a pattern, so
   installing a plugin never silently arms a persona that asked for nothing); a persona with
   ``skills`` is given the skill tools (``load_skill``, ``read_file_skill``) as if it listed
   them, and one without never is;
3. minus everything matching ``disallowed_tools`` (black wins over white);
4. each remaining tool checked against ``permission_mode`` by its class.

The AgentTool is always removed from a worker's bag: workers cannot spawn workers. Whatever was
asked for but did not make it into the bag is reported in ``dropped`` with the reason, for lints.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache

from registry.persona import PermissionMode, Persona
from registry.tools import AGENT_TOOL_NAME, SKILL_TOOL_NAMES, BaseTool, ToolCatalog, ToolClass

__all__ = [
    "BagEntry",
    "Confirmation",
    "DroppedTool",
    "ToolBag",
    "confirmation_for",
    "matches_any",
    "resolve_bag",
]


class Confirmation(StrEnum):
    """What a call of the tool needs before it runs."""

    NONE = "none"
    ONCE = "once"  # one approval per call
    DUAL = "dual"  # two-step sign-off by two different people


#: Per mode: class → confirmation; a class missing from a mode's map is not allowed in it.
_MODE_RULES: dict[PermissionMode, dict[ToolClass, Confirmation]] = {
    PermissionMode.READ_ONLY: {ToolClass.READ: Confirmation.NONE},
    PermissionMode.MUTATING_WITH_CONFIRM: {
        ToolClass.READ: Confirmation.NONE,
        ToolClass.WRITE: Confirmation.ONCE,
    },
    PermissionMode.DUAL_SIGN_REQUIRED: {
        ToolClass.READ: Confirmation.NONE,
        ToolClass.WRITE: Confirmation.ONCE,
        ToolClass.DESTRUCTIVE: Confirmation.DUAL,
    },
}


@lru_cache(maxsize=1024)
def _pattern(text: str) -> re.Pattern[str]:
    # Only '*' is special: tool names are plain identifiers, so '?' and '[' stay literal.
    return re.compile("^" + ".*".join(re.escape(part) for part in text.split("*")) + "$")


def matches_any(name: str, patterns: Iterable[str]) -> str | None:
    """The first pattern that matches ``name`` (``*`` is the only wildcard), else ``None``."""
    return next((p for p in patterns if _pattern(p).match(name)), None)


def confirmation_for(mode: PermissionMode, tool_class: ToolClass) -> Confirmation | None:
    """The confirmation a class needs under ``mode``; ``None`` when the mode forbids it."""
    return _MODE_RULES[mode].get(tool_class)


@dataclass(frozen=True)
class BagEntry:
    tool: BaseTool
    confirmation: Confirmation

    def describe(self) -> dict[str, object]:
        return {**self.tool.describe(), "confirmation": self.confirmation.value}


@dataclass(frozen=True)
class DroppedTool:
    """A tool (or whitelist entry) that is not in the bag, and why."""

    name: str
    reason: str


@dataclass(frozen=True)
class ToolBag:
    entries: tuple[BagEntry, ...]
    dropped: tuple[DroppedTool, ...] = ()

    def __iter__(self) -> Iterator[BagEntry]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, name: object) -> bool:
        return any(e.tool.name == name for e in self.entries)

    def names(self) -> list[str]:
        return [e.tool.name for e in self.entries]

    def entry(self, name: str) -> BagEntry | None:
        return next((e for e in self.entries if e.tool.name == name), None)


def resolve_bag(
    persona: Persona,
    catalog: ToolCatalog,
    role_patterns: Sequence[str],
    *,
    role: str = "",
    for_worker: bool = True,
) -> ToolBag:
    """Compute the bag of ``persona`` for a caller whose role sees ``role_patterns``."""
    entries: list[BagEntry] = []
    dropped: list[DroppedTool] = []
    role_label = f"role {role!r}" if role else "the caller's role"
    whitelist = [*persona.tools, *SKILL_TOOL_NAMES] if persona.skills else persona.tools
    for tool in catalog:
        name = tool.name
        if name in SKILL_TOOL_NAMES and not persona.skills:
            continue  # nothing to load
        if persona.tools and not matches_any(name, whitelist):
            continue  # not asked for: not in the bag, and nothing to report
        if tool.bundle and not persona.tools:
            continue  # a bundle's tool is never inherited: it must be asked for
        if for_worker and name == AGENT_TOOL_NAME:
            if persona.tools:
                dropped.append(DroppedTool(name, "the AgentTool is never in a worker's bag"))
            continue
        if not matches_any(name, role_patterns):
            if persona.tools:
                dropped.append(DroppedTool(name, f"not visible to {role_label}"))
            continue
        black = matches_any(name, persona.disallowed_tools)
        if black:
            dropped.append(DroppedTool(name, f"matches disallowed_tools pattern {black!r}"))
            continue
        confirmation = confirmation_for(persona.permission_mode, tool.tool_class)
        if confirmation is None:
            dropped.append(
                DroppedTool(
                    name,
                    f"class {tool.tool_class.value} is not allowed under permission_mode "
                    f"{persona.permission_mode.value}",
                )
            )
            continue
        entries.append(BagEntry(tool, confirmation))
    names = catalog.names()
    for wanted in persona.tools:
        if not any(_pattern(wanted).match(n) for n in names):
            kind = "pattern matches no tool" if "*" in wanted else "not in the tool catalog"
            dropped.append(DroppedTool(wanted, kind))
    return ToolBag(tuple(entries), tuple(dropped))
