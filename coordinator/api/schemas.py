"""Request and response bodies of the HTTP API.

Request models refuse fields they do not define (``extra="forbid"``), except the persona bodies:
a persona's frontmatter keeps keys this version does not know (SPEC §2), so ``POST`` and ``PATCH``
of a custom persona accept them and store them in ``unknown_fields``. Every request string is
refused if it holds a NUL character or an unpaired surrogate, which no database column can store.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    create_model,
    model_validator,
)
from pydantic.fields import FieldInfo

from coordinator.storage.personas import MAX_NAME_LENGTH
from registry.budget import Budget
from registry.errors import PersonaError
from registry.lint import FindingKind
from registry.parser import check_bounds
from registry.persona import FILE_FIELDS, NAME_PATTERN, PLUGIN_NAME_RESERVED, Persona, Source
from registry.policy import Confirmation
from registry.template import (
    MAX_CONTEXT_BYTES,
    MAX_CONTEXT_DEPTH,
    check_context,
    check_depth,
)
from registry.tools import ToolClass
from workers.budget import SpawnBudget
from workers.loop import Approval
from workers.messages import Message, Requester, ToolCall, Usage
from workers.spawns import SpawnStatus

__all__ = [
    "RESPONSE_ONLY_FIELDS",
    "AgentChange",
    "AgentOut",
    "AuditEntryOut",
    "CancelOut",
    "ChatIn",
    "DecisionIn",
    "DecisionOut",
    "ErrorOut",
    "HealthOut",
    "HistoryOut",
    "MessageIn",
    "MeOut",
    "MessageOut",
    "PendingApprovalOut",
    "PermissionsOut",
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
_BUDGET_DESCRIPTION = (
    "Limits on the turn's spawn (tokens, cost, seconds, tool calls); they can only tighten the "
    "organisation's and the persona's. A coordinator's covers the specialists it dispatches."
)
#: A spawn context: bounded in depth and size before anything walks it recursively.
ContextObject = Annotated[
    dict[str, Any], AfterValidator(check_context), AfterValidator(_check_tree)
]
AgentName = Annotated[
    str, Field(min_length=1, max_length=MAX_NAME_LENGTH, description="A persona's name.")
]


def _not_plugin_form(value: Any) -> Any:
    """``<plugin>:<agent>`` is refused with the reason, not as a mere pattern mismatch."""
    if isinstance(value, str) and ":" in value:
        raise ValueError(PLUGIN_NAME_RESERVED)
    return value


#: The shape a new persona's name must have (the rule of ``registry.persona``, documented here).
NewAgentName = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_NAME_LENGTH,
        pattern=NAME_PATTERN,
        description="snake_case or kebab-case: lowercase letters, digits, '_' or '-'.",
    ),
    BeforeValidator(_not_plugin_form),  # runs first: the reason, not a pattern mismatch
]
ToolPatterns = Annotated[
    list[Text] | Text,
    Field(description="Tool names or `*` patterns: a list, or a comma-separated string."),
]
SkillNames = Annotated[
    list[Text] | Text,
    Field(
        description="Skills it may load: `<plugin>:<skill>` or a bare name; a list, or a "
        "comma-separated string."
    ),
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


# -- the caller --------------------------------------------------------------------------------


class PermissionsOut(BaseModel):
    """What the caller's role may do and see."""

    edit_personas: bool = Field(description="Create, change and delete user personas; reload.")
    approve: bool = Field(description="Decide on tool calls that need confirmation.")
    audit: bool = Field(description="Read the approvals' audit trail.")
    manage_plugins: bool = Field(
        description="Add marketplaces; install, update and remove plugins."
    )
    tools: list[str] = Field(description="Tool name patterns (`*` wildcards) the role sees.")


class MeOut(BaseModel):
    """Who the token speaks for, so a client can show only what the caller may do."""

    user: str
    role: str
    permissions: PermissionsOut
    roles: list[str] = Field(
        description="Roles the caller may look at (e.g. a tool bag per role): every configured "
        "role for a caller who may edit personas, else only their own."
    )


# -- chat --------------------------------------------------------------------------------------


class ChatIn(_Request):
    """Start a conversation: the first message of a new session."""

    prompt: Text = Field(min_length=1, description="The user's question.")
    agent: AgentName | None = Field(
        default=None,
        description="Spawn this persona directly instead of letting the coordinator pick one.",
    )
    context: ContextObject = Field(default_factory=dict, description=_CONTEXT_DESCRIPTION)
    budget: Budget | None = Field(default=None, description=_BUDGET_DESCRIPTION)


class MessageIn(_Request):
    """A further message in an existing session."""

    content: Text = Field(min_length=1, description="The user's message.")
    agent: AgentName | None = Field(default=None, description="Spawn this persona directly.")
    context: ContextObject = Field(default_factory=dict, description=_CONTEXT_DESCRIPTION)
    budget: Budget | None = Field(default=None, description=_BUDGET_DESCRIPTION)


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


class TurnAcceptedOut(BaseModel):
    """A turn started without its stream (``Prefer: respond-async``): where to follow it."""

    session_id: str
    spawn_id: str
    agent: str = Field(description="The persona spawned (`coordinator` when none was named).")
    background: bool
    events: str = Field(
        description="The session's event stream from just before this turn (also `Location`)."
    )


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
    is_error: bool = Field(default=False, description="Its result was an error.")


class UsageOut(BaseModel):
    total: Usage
    turns: list[Usage] = Field(description="One entry per model call, in order.")


class TranscriptOut(BaseModel):
    """Everything a spawn did: the tile's "open transcript"."""

    spawn_id: str
    session_id: str
    parent_spawn_id: str = Field(
        default="", description="The spawn that dispatched this one; empty for a top-level spawn."
    )
    persona: str
    persona_source: str = Field(description="builtin, disk or user; empty before it started.")
    model: str = Field(description="The model it runs on; empty before it started.")
    status: SpawnStatus
    background: bool
    attempts: int
    prompt: str
    context: dict[str, Any]
    missing_context: list[str] = Field(
        default_factory=list,
        description="Context keys the initial prompt looked up and the spawn lacked: each "
        "rendered `<no value>`.",
    )
    result: str
    error: str
    created: float = Field(description="Unix time.")
    updated: float = Field(description="Unix time.")
    messages: list[Message]
    tool_calls: list[ToolCallOut]
    usage: UsageOut
    pending: list[ToolCall] = Field(description="Tool calls not yet run (e.g. awaiting approval).")
    approvals: dict[str, Approval] = Field(description="Decisions on calls needing confirmation.")
    budget: SpawnBudget = Field(
        description="Its limits (resolved at the first attempt), the tool calls, running seconds "
        "and children's spend counted against them, and the limit that stopped it, if one did."
    )


class DecisionIn(_Request):
    call_id: Text = Field(min_length=1, description="The `call_id` of `confirmation_required`.")
    args_hash: Text = Field(
        min_length=1,
        max_length=128,
        description="The `args_hash` of `confirmation_required`: the decision binds to exactly "
        "that call's tool and arguments, and is refused (409 `hash_mismatch`) for any other.",
    )
    approve: bool


class DecisionOut(BaseModel):
    spawn_id: str
    status: SpawnStatus
    approvals: dict[str, Approval]
    call: ToolCall = Field(description="The call decided on: tool name and arguments.")
    args_hash: str = Field(description="The hash the decision was bound to.")
    settled: bool = Field(description="Whether this decision settled the call: the spawn resumes.")
    approved_by: list[str] = Field(description="Who approved the call so far.")
    needed: int = Field(description="Approvals from different people the call needs.")
    message: str = Field(description="What happens next, e.g. that a second signer is needed.")


class PendingApprovalOut(BaseModel):
    """A tool call waiting for a decision the caller may take."""

    spawn_id: str
    session_id: str
    owner: str = Field(description="The user whose spawn it is.")
    persona: str
    call: ToolCall = Field(description="Tool name and the arguments it will run with.")
    args_hash: str = Field(description="What a decision must name (`DecisionIn.args_hash`).")
    requested_by: Requester = Field(description="The spawn's user, their role, the persona.")
    expires_at: float = Field(description="Unix time after which no decision is taken; 0: never.")
    approved_by: list[str] = Field(description="Who approved it so far (dual sign-off).")
    needed: int = Field(description="Approvals from different people it needs (2: destructive).")


class AuditEntryOut(BaseModel):
    """One row of the approvals' audit trail."""

    id: int
    at: datetime
    spawn_id: str
    session_id: str
    call_id: str
    tool: str
    args_hash: str = Field(description="The hash requested or decided on (as sent, if refused).")
    actor: str = Field(description="Who acted: the requester, the decider; empty for an expiry.")
    role: str = Field(description="The actor's role.")
    action: Literal["requested", "approved", "denied", "expired", "refused"]
    outcome: str = Field(description="What came of it; for a refusal, the code and the reason.")


class NotificationOut(BaseModel):
    """One delivery of a notification to one channel, and where it stands."""

    id: str = Field(description="The delivery's id: its `Idempotency-Key` on every attempt.")
    channel: str
    kind: str = Field(description="`approval.requested`, `spawn.finished`, …")
    spawn_id: str
    session_id: str
    owner: str
    persona: str
    status: Literal["pending", "sent", "failed"]
    attempts: int
    next_attempt_at: datetime = Field(description="When a pending delivery is tried next.")
    created_at: datetime
    sent_at: datetime | None
    last_status: int | None = Field(description="The receiver's last HTTP status, if any.")
    last_error: str = Field(description="Why the last attempt did not deliver it.")


# -- agents ------------------------------------------------------------------------------------

# The persona bodies are derived from :class:`registry.persona.Persona`: a field added there is in
# the requests and the responses, with its type and description, without an edit here. What a
# request needs beyond the persona's own type (text hygiene, a name's shape, tools as a list or a
# comma-separated string, metadata as a bounded JSON object) is said once, below.

#: Frontmatter strings that must hold more than white space (as a persona file's must).
# (The pattern before the validator: after it, the OpenAPI document would not show it.)
_FilledText = Annotated[str, Field(pattern=r"\S"), AfterValidator(_check_text)]
#: Request types of the persona fields that a plain mapping of the persona's type does not give.
_CREATE_TYPES: dict[str, Any] = {
    "name": NewAgentName,
    "description": _FilledText,
    "when_to_use": _FilledText,
    "tools": ToolPatterns,
    "disallowed_tools": ToolPatterns,
    "skills": SkillNames,
}
#: A PATCH names an existing persona, and leaves blank text to the persona's own check.
_PATCH_TYPES: dict[str, Any] = {
    **_CREATE_TYPES,
    "name": AgentName,
    "description": Text,
    "when_to_use": Text,
}
#: Descriptions of the API's view where the persona's own would mislead.
_DESCRIPTIONS = {
    "source": "builtin, disk (a file), plugin (installed from a marketplace) or user (the API).",
    "path": "The file it was loaded from (disk personas).",
}
#: The persona fields a request may carry: the frontmatter and the body (the system prompt).
_REQUEST_FIELDS = (*FILE_FIELDS, "body")


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _request_type(name: str, info: FieldInfo, overrides: Mapping[str, Any]) -> Any:
    """The request type of a persona field, with the persona's constraints (e.g. ``ge=0``)."""
    if name in overrides:
        return overrides[name]
    kind = info.annotation
    if kind is str:
        kind = Text
    elif _is_model(kind) or get_origin(kind) is dict:
        kind = JsonObject
    return Annotated[(kind, *info.metadata)] if info.metadata else kind


def _description(name: str, info: FieldInfo, kind: Any = None) -> str | None:
    """What the API says of a field: the request type's own words (e.g. that tools may be a
    comma-separated string), else the persona's."""
    own = [m.description for m in get_args(kind)[1:] if isinstance(m, FieldInfo) and m.description]
    return own[-1] if own else _DESCRIPTIONS.get(name, info.description)


def _create_fields() -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for name in _REQUEST_FIELDS:
        info = Persona.model_fields[name]
        kind = _request_type(name, info, _CREATE_TYPES)
        doc = _description(name, info, kind)
        if info.is_required():
            fields[name] = (kind, Field(description=doc))
        elif info.default_factory is not None:
            factory = dict if kind is JsonObject else info.default_factory
            fields[name] = (kind, Field(default_factory=factory, description=doc))
        else:
            fields[name] = (kind, Field(default=info.default, description=doc))
    return fields


def _patch_fields() -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for name in _REQUEST_FIELDS:
        info = Persona.model_fields[name]
        doc = "Must equal the current name." if name == "name" else _description(name, info)
        kind = _request_type(name, info, _PATCH_TYPES)
        fields[name] = (kind | None, Field(default=None, description=doc))
    return fields


def _response_fields() -> dict[str, Any]:
    """Every persona field as the registry describes it (``metadata`` as a plain object)."""
    fields: dict[str, Any] = {}
    for name, info in Persona.model_fields.items():
        kind = dict[str, Any] if _is_model(info.annotation) else info.annotation
        fields[name] = (kind, Field(description=_description(name, info)))
    return fields


class _PersonaBody(BaseModel):
    # Unknown frontmatter keys are kept (SPEC §2), so no extra="forbid" here.
    model_config = ConfigDict(extra="allow")

    @model_validator(mode="before")
    @classmethod
    def _within_bounds(cls, data: Any) -> Any:
        # Before anything walks it: the bounds of a persona file's frontmatter (values, text,
        # depth), so a body no file could hold is refused up front with the reason.
        if isinstance(data, dict):
            try:
                check_bounds({k: v for k, v in data.items() if k != "body"})
            except PersonaError as exc:
                raise ValueError(exc.reason) from None
        return data

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


_PersonaFields = create_model("_PersonaFields", __base__=_PersonaBody, **_create_fields())
_PatchFields = create_model("_PatchFields", __base__=_PersonaBody, **_patch_fields())
_AgentFields = create_model("_AgentFields", **_response_fields())


class PersonaIn(_PersonaFields):  # type: ignore[misc,valid-type]
    """A persona's frontmatter as JSON, plus ``body`` (the system prompt). Keys the format does
    not define are kept as ``unknown_fields``. Validated exactly like a persona file."""


class PersonaPatch(_PatchFields):  # type: ignore[misc,valid-type]
    """Fields to change; the others keep their value. ``null`` resets a field to its default."""


class AgentOut(_AgentFields):  # type: ignore[misc,valid-type]
    """A persona as the registry holds it, with where it came from and whether it can run."""

    available: bool
    unavailable_reason: str | None
    shadows: Source | None = Field(description="The source of the persona this one overrides.")
    editable: bool = Field(description="Whether the API may change or delete it (user personas).")
    read_only_reason: str | None = Field(
        description="Why it is read-only and how to override it (the message a PATCH or DELETE "
        "would be refused with); null for a user persona."
    )
    resolved_model: str = Field(
        description="The model it runs on, as the workers resolve `model` (alias, organisation "
        "default, default provider); `ongrid/demo` is the offline demo model. Empty until a "
        "worker has reported.",
    )
    model_problem: str = Field(
        description="Why its model cannot be used, and what to set: a spawn of it fails with "
        "this sentence. Empty when the workers can run it.",
    )
    model_checked_by: int = Field(
        description="How many live workers reported on its model (0: none yet)."
    )


class WarningOut(BaseModel):
    """A load problem (kind ``load``) or a lint finding of a persona (``ongrid agents lint``)."""

    path: str
    reason: str
    kind: FindingKind = Field(default=FindingKind.LOAD, description="What the finding is about.")
    persona: str = Field(default="", description="The persona; empty for a file not loaded.")
    source: str = Field(default="", description="The persona's source: builtin, disk or user.")
    subject: str = Field(
        default="", description="The tool, pattern, other persona or setting it is about."
    )
    hint: str = Field(default="", description="What to do about it.")


class AgentChange(AgentOut):
    """A saved user persona, and the registry version the broadcast reload carries."""

    notice: str | None = Field(default=None, description="E.g. which persona it now shadows.")
    registry_version: int
    findings: list[WarningOut] = Field(
        default_factory=list,
        description="What `ongrid agents lint` finds in the saved persona (a tool that is not "
        "in the catalog, one its own mode keeps out, …): saved anyway, but worth a look.",
    )


#: Keys of :class:`AgentChange` that the registry sets; a persona body must not carry them.
RESPONSE_ONLY_FIELDS = frozenset(AgentChange.model_fields) - frozenset(PersonaIn.model_fields)


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
    bundle: str | None = Field(
        default=None,
        description="The plugin that brought it (or `config`, an MCP server of the config "
        "file); absent for the runtime's own tools. A persona gets such a tool only by naming "
        "it in `tools`.",
    )
    confirmation: Confirmation | None = Field(
        default=None, description="With `?agent=`: what a call needs under its permission_mode."
    )


class DroppedOut(BaseModel):
    name: str
    reason: str


class SkillsOut(BaseModel):
    role: str = Field(description="The role whose view this is (`?role=`, else the caller's).")
    agent: str | None = Field(description="The persona whose bag this is, with `?agent=`.")
    tools: list[SkillOut]
    dropped: list[DroppedOut] = Field(
        description="With `?agent=`: tools the persona asked for that are not in its bag, and why."
    )
