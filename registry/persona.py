"""The persona: inert, validated data parsed from a Markdown file with YAML frontmatter.

A :class:`Persona` never runs anything; the worker's run loop does. Field order here is the order
in which :func:`registry.parser.dump_persona` writes the frontmatter back.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from registry.budget import Budget
from registry.template import check_template

__all__ = [
    "DEFAULT_MAX_TURNS",
    "FILE_FIELDS",
    "NAME_PATTERN",
    "NON_FILE_FIELDS",
    "PLUGIN_NAME_PATTERN",
    "PLUGIN_NAME_RESERVED",
    "Metadata",
    "OngridMetadata",
    "PermissionMode",
    "Persona",
    "Requirements",
    "Source",
]

#: The ReAct cap a persona gets when it names none (or names 0).
DEFAULT_MAX_TURNS = 15

#: What a persona name (its spawn key) looks like: snake_case or kebab-case.
NAME_PATTERN = r"^[a-z0-9]+(?:[_-][a-z0-9]+)*$"
#: A persona installed from a plugin is named ``<plugin>:<agent>``, as Claude Code names it, so
#: two plugins may both ship a ``docker-expert``. Only plugin personas may take this form (the
#: parser refuses it elsewhere: :data:`PLUGIN_NAME_RESERVED`).
PLUGIN_NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]*:[a-z0-9]+(?:[_-][a-z0-9]+)*$"
_NAME_RE = re.compile(NAME_PATTERN)
_PLUGIN_NAME_RE = re.compile(PLUGIN_NAME_PATTERN)
PLUGIN_NAME_RESERVED = (
    "the <plugin>:<agent> form is reserved for personas installed from a plugin; "
    "name it in snake_case or kebab-case"
)


class PermissionMode(StrEnum):
    """Which tool classes a persona may run, and what confirmation they need (SPEC §4)."""

    READ_ONLY = "read-only"
    MUTATING_WITH_CONFIRM = "mutating-with-confirm"
    DUAL_SIGN_REQUIRED = "dual-sign-required"


class Source(StrEnum):
    """Where a persona came from. Not part of the file; the registry sets it."""

    BUILTIN = "builtin"
    DISK = "disk"
    #: Installed with a plugin from a marketplace (``Persona.plugin`` names it).
    PLUGIN = "plugin"
    USER = "user"


def _as_list(value: Any) -> Any:
    """Accept a YAML list, a comma-separated string (as Claude Code writes ``tools``) or null."""
    if value is None:
        return []
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


class _Open(BaseModel):
    """A metadata block: the keys the registry reads are typed, every other key passes through."""

    model_config = ConfigDict(extra="allow", frozen=True)


class Requirements(_Open):
    bins: list[str] = Field(default_factory=list, description="Executables that must be on PATH.")
    config: list[str] = Field(
        default_factory=list, description="Configuration keys that must be set."
    )

    _lists = field_validator("bins", "config", mode="before")(_as_list)


class OngridMetadata(_Open):
    scope: str | None = Field(default=None, description="Where the persona runs, e.g. manager.")
    min_ongrid_version: str | None = Field(
        default=None, description="Lowest runtime version that may load it."
    )
    edge_runtime: str | None = None
    edge_capabilities: list[str] = Field(default_factory=list)
    budget: Budget | None = Field(
        default=None, description="Limits on each spawn of it; tightens the organisation's."
    )

    @field_validator("min_ongrid_version", mode="before")
    @classmethod
    def _version_text(cls, value: Any) -> Any:
        # YAML reads an unquoted 0.10 as the float 0.1: the text is lost, so refuse floats.
        if isinstance(value, float):
            raise ValueError(f"write the version as a quoted string (e.g. '0.10'), got {value!r}")
        return str(value) if isinstance(value, int) else value

    _lists = field_validator("edge_capabilities", mode="before")(_as_list)


class Metadata(_Open):
    """``metadata``: the availability gate plus Ongrid extensions; unknown keys are kept."""

    os: list[str] = Field(default_factory=list, description="Operating systems it may run on.")
    requires: Requirements = Field(default_factory=Requirements)
    ongrid: OngridMetadata = Field(default_factory=OngridMetadata)

    _lists = field_validator("os", mode="before")(_as_list)


class Persona(BaseModel):
    """One specialist. Build it with :func:`registry.parser.parse_persona` or :meth:`from_dict`."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=False)

    name: str = Field(description="Spawn key: unique, snake_case or kebab-case.")
    description: str = Field(description="Shown in pickers and in the coordinator's catalog.")
    when_to_use: str = Field(description="Spawn hint; its first line goes in the catalog.")
    tools: list[str] = Field(default_factory=list, description="Whitelist; `*` wildcards.")
    disallowed_tools: list[str] = Field(
        default_factory=list, description="Blacklist applied after the whitelist; black wins."
    )
    skills: list[str] = Field(
        default_factory=list,
        description="Skills it may load (load_skill); only their names and descriptions are "
        "in its system prompt.",
    )
    permission_mode: PermissionMode = PermissionMode.READ_ONLY
    max_turns: int = Field(default=DEFAULT_MAX_TURNS, ge=0, description="0 means the default.")
    model: str = Field(default="", description="LLM id; empty means the organisation default.")
    critical_reminder: str = ""
    initial_prompt: str = Field(default="", description="Go-template over the spawn context.")
    background: bool = False
    omit_claude_md: bool = False
    metadata: Metadata = Field(default_factory=Metadata)
    body: str = Field(default="", description="The system prompt, kept verbatim.")
    unknown_fields: dict[str, Any] = Field(
        default_factory=dict, description="Frontmatter keys this version does not know, kept."
    )
    source: Source | None = Field(default=None, description="Set by the registry, not the file.")
    path: str | None = Field(default=None, description="The file it was loaded from, if any.")
    plugin: str | None = Field(
        default=None, description="The installed plugin it came with (set by the registry)."
    )

    @field_validator("name")
    @classmethod
    def _name_shape(cls, value: str) -> str:
        if not _NAME_RE.match(value) and not _PLUGIN_NAME_RE.match(value):
            raise ValueError(
                f"expected snake_case or kebab-case (lowercase letters, digits, '_' or '-'), "
                f"got {value!r}"
            )
        return value

    @field_validator("description", "when_to_use")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value

    @field_validator("tools", "disallowed_tools", "skills", mode="before")
    @classmethod
    def _tool_list(cls, value: Any) -> Any:
        return _as_list(value)

    @field_validator("skills")
    @classmethod
    def _skill_names(cls, value: list[str]) -> list[str]:
        for item in value:
            if not isinstance(item, str) or not item.strip() or any(c.isspace() for c in item):
                raise ValueError(f"expected skill names, got {item!r}")
        return value

    @field_validator("tools", "disallowed_tools")
    @classmethod
    def _tool_names(cls, value: list[str]) -> list[str]:
        for item in value:
            if not isinstance(item, str) or not item.strip() or "\n" in item:
                raise ValueError(f"expected tool names or patterns, got {item!r}")
        return value

    @field_validator("max_turns")
    @classmethod
    def _default_turns(cls, value: int) -> int:
        return value or DEFAULT_MAX_TURNS

    @field_validator("model", "critical_reminder", "initial_prompt", mode="before")
    @classmethod
    def _null_is_empty(cls, value: Any) -> Any:
        return "" if value is None else value

    @field_validator("metadata", mode="before")
    @classmethod
    def _null_metadata(cls, value: Any) -> Any:
        return {} if value is None else value

    @field_validator("initial_prompt")
    @classmethod
    def _template_subset(cls, value: str) -> str:
        check_template(value)
        return value

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, body: str = "", path: str | None = None) -> Persona:
        """Validate frontmatter ``data``; keys the format does not know go to ``unknown_fields``."""
        from registry.parser import persona_from_mapping

        return persona_from_mapping(data, body=body, path=path)

    @classmethod
    def from_text(cls, text: str, *, path: str | None = None) -> Persona:
        from registry.parser import parse_persona

        return parse_persona(text, path=path).persona

    @classmethod
    def from_file(cls, path: str) -> Persona:
        from registry.parser import load_persona_file

        return load_persona_file(path).persona

    @property
    def catalog_hint(self) -> str:
        """The first non-empty line of ``when_to_use``: what the coordinator's catalog shows."""
        return next((ln.strip() for ln in self.when_to_use.splitlines() if ln.strip()), "")

    def to_markdown(self) -> str:
        from registry.parser import dump_persona

        return dump_persona(self)


#: Fields of a :class:`Persona` that are not frontmatter: the body, and what the registry sets.
NON_FILE_FIELDS = frozenset({"body", "unknown_fields", "source", "path", "plugin"})

#: Frontmatter keys the format defines, in the order they are written back.
FILE_FIELDS: tuple[str, ...] = tuple(n for n in Persona.model_fields if n not in NON_FILE_FIELDS)
