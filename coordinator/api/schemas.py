"""Request and response bodies of the HTTP API.

Request models refuse fields they do not define (``extra="forbid"``), except the persona bodies:
a persona's frontmatter keeps keys this version does not know (SPEC §2), so ``POST`` and ``PATCH``
of a custom persona accept them and store them in ``unknown_fields``. Every request string is
refused if it holds a NUL character or an unpaired surrogate, which no database column can store.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from coordinator.storage.personas import MAX_NAME_LENGTH
from registry.persona import DEFAULT_MAX_TURNS, NAME_PATTERN, PermissionMode, Source
from registry.policy import Confirmation
from registry.template import (
    MAX_CONTEXT_BYTES,
    MAX_CONTEXT_DEPTH,
    check_context,
    check_depth,
)
from registry.tools import ToolClass
from workers.loop import Approval
from workers.messages import Message, ToolCall, Usage
from workers.spawns import SpawnStatus

__all__ = [
    "RESPONSE_ONLY_FIELDS",
    "AgentChange",
    "AgentOut",
    "CancelOut",
    "ChatIn",
    "DecisionIn",
    "DecisionOut",
    "ErrorOut",
    "HealthOut",
    "HistoryOut",
    "MessageIn",
    "MessageOut",
    "PendingApprovalOut",
    "PersonaIn",
    "PersonaPatch",
    "ReadyOut",
    "ReloadOut",
    "SessionOut",
    "SkillsOut",
    "TranscriptOut",
    "WarningOut",
]


# -- text hygiene ------------------------------------------------------------------------------


def _check_text(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    if any("\ud800" <= ch <= "\udfff" for ch in value):
        raise ValueError("must not contain unpaired surrogates (invalid Unicode)")
    return value


def _check_tree(value: Any) -> Any:
    """Apply :func:`_check_text` to every string (keys too) of a JSON value."""
    if isinstance(value, str):
        _check_text(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_text(str(key))
            _check_tree(item)
    elif isinstance(value, list):
        for item in value:
            _check_tree(item)
    return value


Text = Annotated[str, AfterValidator(_check_text)]


def _bounded(value: Any) -> Any:
    return check_depth(value, MAX_JSON_DEPTH)


#: How deep any other JSON object of a request may nest.
MAX_JSON_DEPTH = 16
JsonObject = Annotated[dict[str, Any], AfterValidator(_bounded), AfterValidator(_check_tree)]
_CONTEXT_DESCRIPTION = (
    "Values for the persona's `initial_prompt` template "
    f"(at most {MAX_CONTEXT_DEPTH} levels deep, {MAX_CONTEXT_BYTES} bytes as JSON)."
)
#: A spawn context: bounded in depth and size before anything walks it recursively.
ContextObject = Annotated[
    dict[str, Any], AfterValidator(check_context), AfterValidator(_check_tree)
]
AgentName = Annotated[
    str, Field(min_length=1, max_length=MAX_NAME_LENGTH, description="A persona's name.")
]
#: The shape a new persona's name must have (the rule of ``registry.persona``, documented here).
NewAgentName = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_NAME_LENGTH,
        pattern=NAME_PATTERN,
        description="snake_case or kebab-case: lowercase letters, digits, '_' or '-'.",
    ),
]
ToolPatterns = Annotated[
    list[Text] | Text,
    Field(description="Tool names or `*` patterns: a list, or a comma-separated string."),
]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- errors and health -------------------------------------------------------------------------


class ErrorDetail(BaseModel):
    code: str = Field(description="Stable machine-readable code, e.g. `not_found`.")
    message: str = Field(description="What went wrong and, where it can, what to do.")
    details: Any = Field(default=None, description="Structured specifics (fields, choices, …).")


class ErrorOut(BaseModel):
    """Every error response has this shape."""

    error: ErrorDetail


class HealthOut(BaseModel):
    status: Literal["ok"] = "ok"


class ReadyOut(BaseModel):
    status: Literal["ok", "unavailable"]
    checks: dict[str, str] = Field(description="Per dependency: `ok`, or why it failed.")


# -- chat --------------------------------------------------------------------------------------


class ChatIn(_Request):
    """Start a conversation: the first message of a new session."""

    prompt: Text = Field(min_length=1, description="The user's question.")
    agent: AgentName | None = Field(
        default=None,
        description="Spawn this persona directly instead of letting the coordinator pick one.",
    )
    context: ContextObject = Field(default_factory=dict, description=_CONTEXT_DESCRIPTION)


class MessageIn(_Request):
    """A further message in an existing session."""

    content: Text = Field(min_length=1, description="The user's message.")
    agent: AgentName | None = Field(default=None, description="Spawn this persona directly.")
    context: ContextObject = Field(default_factory=dict, description=_CONTEXT_DESCRIPTION)


class SessionOut(BaseModel):
    id: str
    user: str
    title: str
    created_at: datetime
    updated_at: datetime


class MessageOut(BaseModel):
    id: int
    role: Literal["user", "assistant", "system"] = Field(
        description="`user`: a question; `assistant`: a turn's final answer; `system`: a turn "
        "that ended failed or cancelled."
    )
    content: str
    agent: str | None = Field(description="The persona asked for (user) or that answered.")
    spawn_id: str | None = Field(description="The spawn of the turn this message belongs to.")
    created_at: datetime


class HistoryOut(BaseModel):
    session: SessionOut
    messages: list[MessageOut] = Field(description="Each question followed by its answer.")


class CancelOut(BaseModel):
    spawn_id: str
    status: Literal["cancel_requested"] = "cancel_requested"


# -- spawns ------------------------------------------------------------------------------------


class ToolCallOut(BaseModel):
    call_id: str
    name: str
    arguments: str = Field(description="The JSON text the model produced.")
    result: str | None = Field(description="The tool's output; null while it has none.")


class UsageOut(BaseModel):
    total: Usage
    turns: list[Usage] = Field(description="One entry per model call, in order.")


class TranscriptOut(BaseModel):
    """Everything a spawn did: the tile's "open transcript"."""

    spawn_id: str
    session_id: str
    persona: str
    persona_source: str = Field(description="builtin, disk or user; empty before it started.")
    model: str = Field(description="The model it runs on; empty before it started.")
    status: SpawnStatus
    background: bool
    attempts: int
    prompt: str
    context: dict[str, Any]
    result: str
    error: str
    created: float = Field(description="Unix time.")
    updated: float = Field(description="Unix time.")
    messages: list[Message]
    tool_calls: list[ToolCallOut]
    usage: UsageOut
    pending: list[ToolCall] = Field(description="Tool calls not yet run (e.g. awaiting approval).")
    approvals: dict[str, Approval] = Field(description="Decisions on calls needing confirmation.")


class DecisionIn(_Request):
    call_id: Text = Field(min_length=1, description="The `call_id` of `confirmation_required`.")
    approve: bool


class DecisionOut(BaseModel):
    spawn_id: str
    status: SpawnStatus
    approvals: dict[str, Approval]
    call: ToolCall = Field(description="The call decided on: tool name and arguments.")


class PendingApprovalOut(BaseModel):
    """A tool call waiting for a decision the caller may take."""

    spawn_id: str
    session_id: str
    owner: str = Field(description="The user whose spawn it is.")
    persona: str
    call: ToolCall = Field(description="Tool name and the arguments it will run with.")
    approved_by: list[str] = Field(description="Who approved it so far (dual sign-off).")


# -- agents ------------------------------------------------------------------------------------

#: Keys of :class:`AgentOut` that the registry sets; a persona body must not carry them.
RESPONSE_ONLY_FIELDS = frozenset(
    {
        "source",
        "path",
        "available",
        "unavailable_reason",
        "shadows",
        "unknown_fields",
        "notice",
        "registry_version",
    }
)


class _PersonaBody(BaseModel):
    # Unknown frontmatter keys are kept (SPEC §2), so no extra="forbid" here.
    model_config = ConfigDict(extra="allow")

    @model_validator(mode="after")
    def _extras(self) -> _PersonaBody:
        extra = self.model_extra or {}
        taken = sorted(RESPONSE_ONLY_FIELDS & set(extra))
        if taken:
            raise ValueError(
                f"{', '.join(taken)}: set by the registry, not part of a persona; leave out"
            )
        _check_tree(extra)
        return self


class PersonaIn(_PersonaBody):
    """A persona's frontmatter as JSON, plus ``body`` (the system prompt). Keys the format does
    not define are kept as ``unknown_fields``. Validated exactly like a persona file."""

    name: NewAgentName
    description: Text = Field(pattern=r"\S", description="Shown in pickers and the catalog.")
    when_to_use: Text = Field(pattern=r"\S", description="Spawn hint; line 1 goes in the catalog.")
    tools: ToolPatterns = Field(default_factory=list)
    disallowed_tools: ToolPatterns = Field(default_factory=list)
    permission_mode: PermissionMode = PermissionMode.READ_ONLY
    max_turns: int = Field(default=DEFAULT_MAX_TURNS, ge=0, description="0 means the default.")
    model: Text = Field(default="", description="LLM id; empty: the organisation default.")
    critical_reminder: Text = ""
    initial_prompt: Text = Field(default="", description="Go-template over the spawn context.")
    background: bool = False
    omit_claude_md: bool = False
    metadata: JsonObject = Field(default_factory=dict)
    body: Text = Field(default="", description="The system prompt, kept verbatim.")


class PersonaPatch(_PersonaBody):
    """Fields to change; the others keep their value. ``null`` resets a field to its default."""

    name: AgentName | None = Field(default=None, description="Must equal the current name.")
    description: Text | None = None
    when_to_use: Text | None = None
    tools: ToolPatterns | None = None
    disallowed_tools: ToolPatterns | None = None
    permission_mode: PermissionMode | None = None
    max_turns: int | None = Field(default=None, ge=0)
    model: Text | None = None
    critical_reminder: Text | None = None
    initial_prompt: Text | None = None
    background: bool | None = None
    omit_claude_md: bool | None = None
    metadata: JsonObject | None = None
    body: Text | None = None


class AgentOut(BaseModel):
    """A persona as the registry holds it, with where it came from and whether it can run."""

    name: str
    description: str
    when_to_use: str
    tools: list[str]
    disallowed_tools: list[str]
    permission_mode: PermissionMode
    max_turns: int
    model: str
    critical_reminder: str
    initial_prompt: str
    background: bool
    omit_claude_md: bool
    metadata: dict[str, Any]
    body: str
    unknown_fields: dict[str, Any]
    source: Source | None = Field(description="builtin, disk (a file) or user (the API).")
    path: str | None = Field(description="The file it was loaded from (disk personas).")
    available: bool
    unavailable_reason: str | None
    shadows: Source | None = Field(description="The source of the persona this one overrides.")


class AgentChange(AgentOut):
    """A saved user persona, and the registry version the broadcast reload carries."""

    notice: str | None = Field(default=None, description="E.g. which persona it now shadows.")
    registry_version: int


class WarningOut(BaseModel):
    path: str
    reason: str


class ReloadOut(BaseModel):
    registry_version: int
    agents: int
    warnings: int


# -- skills ------------------------------------------------------------------------------------


class SkillOut(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    name: str
    description: str
    tool_class: ToolClass = Field(alias="class")
    parameters: dict[str, Any] = Field(description="JSON schema of the arguments.")
    confirmation: Confirmation | None = Field(
        default=None, description="With `?agent=`: what a call needs under its permission_mode."
    )


class DroppedOut(BaseModel):
    name: str
    reason: str


class SkillsOut(BaseModel):
    role: str
    agent: str | None = Field(description="The persona whose bag this is, with `?agent=`.")
    tools: list[SkillOut]
    dropped: list[DroppedOut] = Field(
        description="With `?agent=`: tools the persona asked for that are not in its bag, and why."
    )
