"""Provider-neutral wire types: chat messages, tool calls, usage, and the events a spawn emits.

The same types travel through Celery payloads, Redis and the SSE ``data:`` line. Events are a
tagged union on ``type`` read and written through :data:`EVENT_ADAPTER`.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

__all__ = [
    "EVENT_ADAPTER",
    "AgentTile",
    "ApprovalDecided",
    "ConfirmationRequired",
    "ContextCompacted",
    "Event",
    "Message",
    "Requester",
    "QueueWaiting",
    "SPAWN_END_TEXT_LIMIT",
    "SpawnEnded",
    "TaskNotification",
    "TextDelta",
    "ToolCall",
    "ToolCallEvent",
    "ToolResultEvent",
    "Usage",
]


class ToolCall(BaseModel):
    """A model's request to call a tool. ``arguments`` is the JSON text the model produced."""

    id: str
    name: str
    arguments: str = "{}"


class Message(BaseModel):
    """One chat message. A ``tool`` message answers the call ``tool_call_id`` of tool ``name``;
    an ``assistant`` message may carry ``tool_calls``. Adapters translate it to their provider's
    shape."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None


class Usage(BaseModel):
    """Tokens and cost (USD, litellm's accounting) of one model call or a sum of them.

    ``prompt_tokens`` counts every input token of the calls, cached or not; of those,
    ``cache_write_tokens`` were written to the provider's prompt cache and ``cache_read_tokens``
    read from it (each priced differently, which ``cost`` accounts for).
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cost: float = 0.0
    model_calls: int = 0
    cache_write_tokens: int = 0
    cache_read_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            total_tokens=self.total_tokens + other.total_tokens,
            cost=self.cost + other.cost,
            model_calls=self.model_calls + other.model_calls,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
        )


class _Envelope(BaseModel):
    """Fields every event carries. ``seq`` is per session, assigned when the event is stored."""

    model_config = ConfigDict(extra="forbid")

    session_id: str
    spawn_id: str = ""
    seq: int = 0
    ts: float = Field(default_factory=time.time)


class TextDelta(_Envelope):
    type: Literal["text"] = "text"
    text: str


class AgentTile(_Envelope):
    """One per dispatch: which persona runs, why it was chosen, and its resolved bag."""

    type: Literal["agent_tile"] = "agent_tile"
    persona: str
    description: str
    tools: list[dict[str, Any]] = Field(default_factory=list)
    reason: str = ""
    background: bool = False
    #: Context keys the persona's initial prompt needed and the spawn lacked (rendered
    #: ``<no value>``).
    missing_context: list[str] = Field(default_factory=list)
    #: The spawn that dispatched this one (the coordinator's); empty for a top-level spawn.
    parent_spawn_id: str = ""
    #: The model the spawn runs on, as resolved (``ongrid/demo``: the offline demo model).
    model: str = ""
    #: Set when the model is the demo: it is no LLM, and what to configure for a real one.
    model_note: str = ""


class ToolCallEvent(_Envelope):
    type: Literal["tool_call"] = "tool_call"
    call_id: str
    name: str
    arguments: str


class ToolResultEvent(_Envelope):
    type: Literal["tool_result"] = "tool_result"
    call_id: str
    name: str
    content: str
    is_error: bool = False


class Requester(BaseModel):
    """Whose spawn asks for a confirmation: its user, that user's role, and the persona."""

    model_config = ConfigDict(extra="forbid")

    user: str = ""
    role: str = ""
    persona: str = ""


class ConfirmationRequired(_Envelope):
    """A tool call waits for people's approval; a decision names ``args_hash``, which binds it
    to exactly this spawn, call, tool and arguments."""

    type: Literal["confirmation_required"] = "confirmation_required"
    call_id: str
    name: str
    arguments: str
    confirmation: Literal["once", "dual"]
    #: :func:`workers.loop.approval_hash` of the call (hex SHA-256).
    args_hash: str = ""
    requested_by: Requester = Field(default_factory=Requester)
    #: Unix time after which the call is not run: the model is told it expired undecided.
    expires_at: float = 0.0
    #: Approvals from different people the call needs (2: a destructive call).
    needed: int = 1
    #: The tool's class (``read``, ``write``, ``destructive``): how much the call can change.
    tool_class: str = ""


class ApprovalDecided(_Envelope):
    """A decision on a call that waited for confirmation, or its expiry (the approval feed)."""

    type: Literal["approval_decided"] = "approval_decided"
    call_id: str
    name: str
    args_hash: str
    decision: Literal["approved", "denied", "expired"]
    #: Who decided; empty for an expiry.
    by: str = ""
    #: The user whose spawn it is.
    owner: str = ""
    #: Who approved so far, and how many approvals the call needs.
    approved_by: list[str] = Field(default_factory=list)
    needed: int = 1
    #: Whether the call is settled by it (the spawn resumes).
    settled: bool = False


class TaskNotification(_Envelope):
    type: Literal["task_notification"] = "task_notification"
    status: Literal["ok", "failed", "cancelled"]
    persona: str = ""
    message: str = ""
    usage: Usage = Field(default_factory=Usage)
    #: The budget limit that stopped the spawn (``ok``: ``message`` then holds its partial
    #: answer); ``None``: no limit did.
    budget_reached: Literal["tokens", "cost", "time", "tool_calls", "context"] | None = None


class SpawnEnded(_Envelope):
    """A spawn ended (the spawn-end feed, :mod:`workers.spawn_ends`): what a notification of it
    says, without a reader having to look the spawn up."""

    type: Literal["spawn_ended"] = "spawn_ended"
    status: Literal["ok", "failed", "cancelled"]
    persona: str
    #: The user whose spawn it is, and whether it ran in the background.
    owner: str = ""
    background: bool = False
    #: The spawn that dispatched this one (a coordinator's); empty for a spawn a person started.
    parent_spawn_id: str = ""
    #: Its answer (``ok``) or error, cut at :data:`SPAWN_END_TEXT_LIMIT` characters.
    message: str = ""
    budget_reached: Literal["tokens", "cost", "time", "tool_calls", "context"] | None = None
    cost_usd: float = 0.0
    #: Channels named by the spawn itself (a schedule's), besides the routing rules'.
    notify: list[str] = Field(default_factory=list)


#: Characters of a spawn's answer a :class:`SpawnEnded` carries (its notification shows the first
#: lines; the whole answer stays in the spawn's record).
SPAWN_END_TEXT_LIMIT = 2000


class QueueWaiting(_Envelope):
    """A spawn someone waits on sits on a queue no live worker consumes: it keeps its place and
    runs when one arrives; said again every minute while it lasts."""

    type: Literal["queue_waiting"] = "queue_waiting"
    queue: str
    #: Seconds it has waited for a worker so far.
    waited_seconds: float
    #: Seconds after which it is failed if no worker came (``queue_wait_limit``); ``None``:
    #: never (a background spawn, or no limit).
    fails_in_seconds: float | None = None
    #: The whole notice, with the command that starts a worker for the queue.
    message: str


class ContextCompacted(_Envelope):
    """The spawn's earlier turns were replaced by an investigation ledger the model wrote, to
    keep the conversation inside the model's window (:mod:`workers.context`)."""

    type: Literal["context_compacted"] = "context_compacted"
    #: 1 for the spawn's first compaction, then 2…
    number: int
    #: Why: the estimate against the budget, or the provider's refusal as too long.
    reason: str
    #: Messages the ledger replaced.
    replaced: int
    #: Estimated input tokens of the next request before and after.
    tokens_before: int
    tokens_after: int
    ledger: str


Event = Annotated[
    TextDelta
    | AgentTile
    | ToolCallEvent
    | ToolResultEvent
    | ConfirmationRequired
    | ApprovalDecided
    | TaskNotification
    | QueueWaiting
    | ContextCompacted
    | SpawnEnded,
    Field(discriminator="type"),
]

#: Reads and writes any event as JSON.
EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)
