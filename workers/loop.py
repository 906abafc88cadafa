"""The ReAct loop: reason (a model call) → act (tool calls) → observe, until a final answer.

A plain function over a model, a tool bag, an event sink and a checkpoint callback: it knows
nothing of Celery or Redis, so it is tested on its own. The whole state lives in
:class:`LoopState`, which the caller persists at each checkpoint; calling :func:`run_loop` again
with a restored state resumes where the last checkpoint left off:

- a model reply is checkpointed as soon as it is complete, so a finished call is not paid again;
- a tool call is marked *started* (checkpointed) before it runs and its result checkpointed after,
  so a call that completed is never executed again; a call that was running when the worker died
  is reported to the model as interrupted, with its outcome unknown, instead of being re-run
  (unless its tool is ``idempotent``: then it runs again with the same call id);
- events carry a spawn-local index saved with the state, so the sink can drop the events a
  resumed attempt emits a second time.

The loop is a coroutine: every spawn of a worker process runs on one event loop
(:mod:`workers.engine`). Tools are blocking functions and run through ``LoopSetup.run_tool`` (in
a worker: its bounded thread pool, with a span and a metric per call). The calls a model asks
for in one turn run concurrently when each of them only reads (tool class ``read``, no
confirmation, not started before): their write-ahead marks are one checkpoint, their results are
reported in the order the model gave. Any other mix runs in order, one call at a time, as a
write may depend on what came before it.

A tool may bound how many of its calls run (:class:`~registry.budget.CallLimits`, the
coordinator's ``spawn_agent``): in one reply, the calls beyond ``per_reply`` are not run, and over
the spawn, those beyond ``per_spawn``; each gets an error result saying the bound, before any call
of the reply runs or is batched. Which calls a bound refuses is worked out from the checkpointed
messages (:func:`over_limits`), never from a counter of the attempt: a resumed attempt refuses
and counts exactly the same calls, and a call already started is never refused afterwards.

A call that needs people's confirmation parks the spawn (outcome ``interrupted``) with an
:class:`Approval` in the state, bound by :func:`approval_hash` to exactly that spawn, call, tool
and arguments, and with a deadline. The deciding side settles it (approved, denied, or expired
undecided) and resumes the spawn; the model then gets the call's result, or a tool result that
says it was denied or expired.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from registry.budget import CallLimits
from registry.errors import RunError, ToolArgumentError
from registry.policy import Confirmation, ToolBag
from registry.tools import BaseTool, ToolClass, ToolContext, ToolResult
from workers.messages import (
    ConfirmationRequired,
    Event,
    Message,
    Requester,
    TextDelta,
    ToolCall,
    ToolCallEvent,
    ToolResultEvent,
    Usage,
)
from workers.model import Model, ModelReply, ModelRequest, ToolSpec

__all__ = [
    "Approval",
    "LoopSetup",
    "LoopState",
    "Outcome",
    "approval_hash",
    "ask_model",
    "over_limits",
    "run_loop",
    "system_reminder_message",
]

#: How long a confirmation request waits for a decision unless the worker says otherwise.
DEFAULT_APPROVAL_TTL = 3600.0


def approval_hash(spawn_id: str, call: ToolCall) -> str:
    """The hex SHA-256 that binds an approval to exactly this spawn, call, tool and arguments.

    Over canonical JSON (sorted keys, no white space, ASCII) of ``[spawn_id, call id, tool name,
    arguments]``, the arguments parsed, so the hash does not depend on how the model spaced or
    ordered them; arguments that are not JSON are bound as their text.
    """
    try:
        arguments: Any = json.loads(call.arguments or "{}")
    except json.JSONDecodeError:
        arguments = call.arguments
    canonical = json.dumps(
        [spawn_id, call.id, call.name, arguments], sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


class Approval(BaseModel):
    """People's decisions on one tool call that needs confirmation."""

    approved_by: list[str] = Field(default_factory=list)
    denied_by: str | None = None
    #: Different people who must approve (2 for a destructive call): the deciding side resumes
    #: the spawn once that many have, or one has denied it.
    needed: int = 1
    #: :func:`approval_hash` of the call: a decision must name it. Empty in states saved before
    #: approvals were bound to their arguments.
    args_hash: str = ""
    requested_by: Requester = Field(default_factory=Requester)
    #: Unix time after which no decision is taken; 0: never.
    expires_at: float = 0.0
    #: The deadline passed undecided: the call is settled and is not run.
    expired: bool = False

    @property
    def settled(self) -> bool:
        """Denied, expired, or approved by as many different people as the call needs."""
        return (
            self.expired or self.denied_by is not None or len(set(self.approved_by)) >= self.needed
        )


class LoopState(BaseModel):
    """Everything needed to resume a spawn on any worker."""

    messages: list[Message]
    turns: int = 0
    usage: Usage = Field(default_factory=Usage)
    turn_usage: list[Usage] = Field(default_factory=list)
    pending: list[ToolCall] = Field(default_factory=list)
    started: list[str] = Field(default_factory=list)
    approvals: dict[str, Approval] = Field(default_factory=dict)
    #: Ids of the calls whose result was an error (the transcript marks them; the messages
    #: sent to the model carry no such flag).
    failed_calls: list[str] = Field(default_factory=list)
    final: str | None = None
    event_index: int = 0


@dataclass(frozen=True)
class Outcome:
    kind: Literal["final", "failed", "interrupted"]
    text: str = ""
    call: ToolCall | None = None


#: Runs one tool call off the event loop: ``await run_tool(tool, arguments, context)``.
RunTool = Callable[[BaseTool, BaseModel, ToolContext], Awaitable[ToolResult]]


async def run_in_thread(tool: BaseTool, arguments: BaseModel, context: ToolContext) -> ToolResult:
    """The default :data:`RunTool`: the tool in a thread of asyncio's default pool."""
    return await asyncio.to_thread(tool.run, arguments, context)


@dataclass(frozen=True)
class LoopSetup:
    """The fixed inputs of one spawn's loop."""

    session_id: str
    spawn_id: str
    model_id: str
    max_turns: int
    reminder: str
    bag: ToolBag
    tool_context: ToolContext
    run_tool: RunTool = run_in_thread
    """How a tool call runs; a worker passes its own (bounded pool, span, metric)."""
    published: Mapping[str, tuple[str, bool]] = field(default_factory=dict)
    """Results (content, is_error) by call id that an earlier attempt published but did not
    checkpoint before it was lost; a resumed attempt reports them instead of "interrupted"."""
    stream: Callable[[], Awaitable[bool]] | None = None
    """Asked before each model call whether to stream its text (someone watches the session);
    ``None``: always stream."""
    persona: str = ""
    """The persona's name: with the tool context's user and role, who requests a confirmation."""
    approval_ttl_seconds: float = DEFAULT_APPROVAL_TTL
    """How long a confirmation request waits for its decision before it expires."""
    announce: Callable[[ConfirmationRequired, int], Awaitable[None]] | None = None
    """Called with each new confirmation request and its event index before the checkpoint
    that records it (a worker tells the approvers and files the deadline)."""
    clock: Callable[[], float] = time.time
    """Unix time, for the deadline of a confirmation request."""


#: (event, spawn-local index) → None, without blocking. The index lets the sink drop replays
#: after a resume.
EventSink = Callable[[Event, int], None]
#: Persists the state; an event emitted before it must be published once it returns.
Checkpoint = Callable[[LoopState], Awaitable[None]]


def system_reminder_message(reminder: str) -> Message:
    """The per-turn reminder, in the ``<system-reminder>`` wrapper models are trained on."""
    return Message(role="user", content=f"<system-reminder>\n{reminder}\n</system-reminder>")


async def ask_model(
    model: Model,
    setup: LoopSetup,
    state: LoopState,
    tools: list[ToolSpec],
    on_text: Callable[[str], object],
    *,
    then: Message | None = None,
) -> ModelReply:
    """One model call (a turn): the state's messages, the turn's reminder, then ``then`` if
    given, offered ``tools``. Its text goes to ``on_text`` as it streams; its usage is added to
    the state's."""
    stream = True if setup.stream is None else await setup.stream()
    messages = [*state.messages, system_reminder_message(setup.reminder)]
    request = ModelRequest(
        model=setup.model_id,
        messages=messages if then is None else [*messages, then],
        tools=tools,
        stream=stream,
    )
    reply: ModelReply | None = None
    async for item in model.stream(request):
        if isinstance(item, ModelReply):
            reply = item
        elif item:
            on_text(item)
    if reply is None:
        raise RuntimeError(f"model adapter for {setup.model_id} returned no reply")
    state.turns += 1
    state.usage = state.usage + reply.usage
    state.turn_usage.append(reply.usage)
    return reply


def _tool_specs(bag: ToolBag) -> list[ToolSpec]:
    return [ToolSpec(e.tool.name, e.tool.description, e.tool.parameters) for e in bag]


def _distinct_ids(calls: list[ToolCall], history: list[Message], turn: int) -> list[ToolCall]:
    """``calls`` with every id non-empty and unused in the spawn so far.

    Call ids key the write-ahead log (``started``) and the approvals: a provider that sends no id,
    or reuses one across turns, would otherwise make a new call look already started (so it
    never runs) or already approved by someone who approved a different call.
    """
    used = {c.id for m in history for c in m.tool_calls}
    out: list[ToolCall] = []
    for i, call in enumerate(calls):
        if not call.id or call.id in used:
            new_id, n = f"ongrid_{turn}_{i}", 0
            while new_id in used:
                n += 1
                new_id = f"ongrid_{turn}_{i}_{n}"
            call = call.model_copy(update={"id": new_id})
        used.add(call.id)
        out.append(call)
    return out


def over_limits(
    messages: list[Message], bag: ToolBag, started: Collection[str] = ()
) -> dict[str, str]:
    """The calls of ``messages`` a tool's :class:`~registry.budget.CallLimits` refuses, by id,
    each with the error result that says why.

    In each assistant message, in the model's order: a call past the tool's ``per_reply`` is
    refused; otherwise one past ``per_spawn`` (counting the calls let through so far, in this
    reply and the earlier ones) is refused; otherwise it is let through and counted. A call in
    ``started`` ran already and is always let through. A pure function of the checkpointed
    messages, so every attempt of a spawn finds the same answer.
    """
    refused: dict[str, str] = {}
    counted: Counter[str] = Counter()
    for message in messages:
        if message.role != "assistant" or not message.tool_calls:
            continue
        in_reply = Counter(call.name for call in message.tool_calls)
        position: Counter[str] = Counter()
        for call in message.tool_calls:
            entry = bag.entry(call.name)
            limits = entry.tool.call_limits if entry is not None else None
            if limits is None:
                continue
            name = call.name
            position[name] += 1
            why = (
                ""
                if call.id in started
                else _refusal(limits, name, position[name], in_reply[name], counted[name])
            )
            if why:
                refused[call.id] = why
            else:
                counted[name] += 1
    return refused


def _refusal(limits: CallLimits, name: str, position: int, in_reply: int, counted: int) -> str:
    """Why the ``position``-th call of tool ``name`` in a reply of ``in_reply`` such calls, after
    ``counted`` were let through, is not run; empty when it runs."""
    if limits.per_reply is not None and position > limits.per_reply:
        why = (
            f"not run: only the first {limits.per_reply} {name} calls of one reply run, and "
            f"this reply made {in_reply}."
        )
    elif limits.per_spawn is not None and counted >= limits.per_spawn:
        why = (
            f"not run: {name} runs at most {limits.per_spawn} times in one task, and all "
            f"{limits.per_spawn} have run. Go on with what they returned."
        )
    else:
        return ""
    return f"{why} {limits.advice}".rstrip()


class _Run:
    def __init__(self, setup: LoopSetup, state: LoopState, sink: EventSink, save: Checkpoint):
        self.setup, self.state, self._sink, self._save = setup, state, sink, save
        # Once per attempt: a tool's JSON schema is generated by pydantic each time it is read
        # (7 % of a worker's loop when rebuilt every turn, measured).
        self._tools = _tool_specs(setup.bag)
        self._bounded = any(e.tool.call_limits is not None for e in setup.bag)
        #: The pending calls a tool's call limits refuse, by id, with their error result.
        self._refused: dict[str, str] = {}

    def emit(self, event_type: type, **fields: object) -> tuple[Any, int]:
        """Build and sink one event; returns it with its spawn-local index."""
        event = event_type(session_id=self.setup.session_id, spawn_id=self.setup.spawn_id, **fields)
        index = self.state.event_index
        self._sink(event, index)
        self.state.event_index += 1
        return event, index

    async def checkpoint(self) -> None:
        await self._save(self.state)

    # -- one model call ---------------------------------------------------------------------

    async def think(self, model: Model) -> None:
        reply = await ask_model(
            model, self.setup, self.state, self._tools, lambda text: self.emit(TextDelta, text=text)
        )
        state = self.state
        calls = _distinct_ids(reply.message.tool_calls, state.messages, state.turns)
        state.messages.append(reply.message.model_copy(update={"tool_calls": calls}))
        for call in calls:
            self.emit(ToolCallEvent, call_id=call.id, name=call.name, arguments=call.arguments)
        state.pending = list(calls)
        if not calls:
            state.final = reply.message.content
        await self.checkpoint()

    # -- tool calls ---------------------------------------------------------------------------

    async def act(self) -> Outcome | None:
        """Run the pending calls; stop at one that waits for a person."""
        if self._bounded:
            state = self.state
            self._refused = over_limits(state.messages, self.setup.bag, set(state.started))
        while self.state.pending:
            if self.state.pending[0].id in self._refused:
                await self._refuse()
                continue
            batch = self._concurrent_reads()
            if len(batch) > 1:
                await self._run_together(batch)
                continue
            call = self.state.pending[0]
            blocked = await self._needs_decision(call)
            if blocked is not None:
                return blocked
            if call.id in self.state.started and call.id in self.setup.published:
                # Run to its end by the lost attempt, whose result event got out before its
                # checkpoint: that is the call's result, not "unknown".
                content, is_error = self.setup.published[call.id]
            elif call.id in self.state.started and not self._idempotent(call):
                content, is_error = (
                    "interrupted: the worker running this call was lost; its outcome is unknown. "
                    "Check the current state before calling it again.",
                    True,
                )
            else:
                if call.id not in self.state.started:
                    self.state.started.append(call.id)
                    await self.checkpoint()  # write-ahead: never run a call twice
                content, is_error = await self._execute(call)
            self._observe(call, content, is_error)
            await self.checkpoint()
        return None

    def _observe(self, call: ToolCall, content: str, is_error: bool) -> None:
        """Report the result of the first pending call, which is ``call``."""
        self.emit(
            ToolResultEvent, call_id=call.id, name=call.name, content=content, is_error=is_error
        )
        self.state.messages.append(
            Message(role="tool", content=content, tool_call_id=call.id, name=call.name)
        )
        if is_error:
            self.state.failed_calls.append(call.id)
        self.state.pending.pop(0)

    async def _refuse(self) -> None:
        """Answer the pending calls from the first on that a call limit refuses; one
        checkpoint for all of them."""
        pending = self.state.pending
        while pending and pending[0].id in self._refused:
            self._observe(pending[0], self._refused[pending[0].id], True)
        await self.checkpoint()

    def _concurrent_reads(self) -> list[ToolCall]:
        """The pending calls from the first on that may run at the same time: tools of class
        ``read`` that need nobody's confirmation, were not started by an earlier attempt and
        are not refused by a call limit."""
        batch = []
        for call in self.state.pending:
            entry = self.setup.bag.entry(call.name)
            if (
                entry is None
                or entry.tool.tool_class is not ToolClass.READ
                or entry.confirmation is not Confirmation.NONE
                or call.id in self.state.started
                or call.id in self._refused
            ):
                break
            batch.append(call)
        return batch

    async def _run_together(self, batch: list[ToolCall]) -> None:
        self.state.started.extend(call.id for call in batch)
        await self.checkpoint()  # one write-ahead mark for the whole batch
        outcomes = await asyncio.gather(
            *(self._execute(call) for call in batch), return_exceptions=True
        )
        for outcome in outcomes:  # the run stops (RunError) once every call of it has ended
            if isinstance(outcome, BaseException):
                raise outcome
        for call, outcome in zip(batch, outcomes, strict=True):
            content, is_error = outcome  # type: ignore[misc]
            self._observe(call, content, is_error)
        await self.checkpoint()

    def _idempotent(self, call: ToolCall) -> bool:
        """Tools that make a repeat harmless (same call id, same effect) are simply run again."""
        entry = self.setup.bag.entry(call.name)
        return entry is not None and entry.tool.idempotent

    async def _needs_decision(self, call: ToolCall) -> Outcome | None:
        entry = self.setup.bag.entry(call.name)
        if entry is None or entry.confirmation is Confirmation.NONE:
            return None
        needed = 2 if entry.confirmation is Confirmation.DUAL else 1
        approval = self.state.approvals.get(call.id)
        if approval is None:
            await self._request(call, entry.confirmation, needed)
        else:
            approval.needed = needed
            if approval.settled:
                return None
        return Outcome(
            "interrupted", f"{call.name} needs confirmation ({entry.confirmation})", call
        )

    async def _request(self, call: ToolCall, confirmation: Confirmation, needed: int) -> None:
        """Put ``call`` to people: its approval entry, the request event, the checkpoint."""
        context = self.setup.tool_context
        approval = Approval(
            needed=needed,
            args_hash=approval_hash(self.setup.spawn_id, call),
            requested_by=Requester(
                user=context.user, role=context.role, persona=self.setup.persona
            ),
            expires_at=self.setup.clock() + self.setup.approval_ttl_seconds,
        )
        self.state.approvals[call.id] = approval
        event, index = self.emit(
            ConfirmationRequired,
            call_id=call.id,
            name=call.name,
            arguments=call.arguments,
            confirmation=confirmation.value,
            args_hash=approval.args_hash,
            requested_by=approval.requested_by,
            expires_at=approval.expires_at,
            needed=needed,
        )
        if self.setup.announce is not None:
            await self.setup.announce(event, index)
        await self.checkpoint()

    def _refusal(self, call: ToolCall) -> str | None:
        """Why a call put to people is not run (denied, expired, approved for other
        arguments); ``None`` when it may run."""
        approval = self.state.approvals.get(call.id)
        if approval is None:
            return None
        if approval.denied_by is not None:
            return f"the call was denied by {approval.denied_by}; do not retry it"
        if approval.expired:
            when = datetime.fromtimestamp(approval.expires_at, UTC).isoformat(timespec="seconds")
            return (
                f"the approval request expired undecided at {when}; the call was not run. "
                "Ask for it again only if it is still needed"
            )
        if approval.args_hash and approval.args_hash != approval_hash(self.setup.spawn_id, call):
            return "the approval was given for other arguments; the call was not run"
        return None

    async def _execute(self, call: ToolCall) -> tuple[str, bool]:
        entry = self.setup.bag.entry(call.name)
        if entry is None:
            names = ", ".join(self.setup.bag.names()) or "none"
            return f"tool {call.name!r} is not in your tool bag; available: {names}", True
        refused = self._refusal(call)
        if refused is not None:
            return refused, True
        try:
            raw = json.loads(call.arguments or "{}")
        except json.JSONDecodeError as exc:
            return f"arguments of {call.name} are not valid JSON: {exc}", True
        if not isinstance(raw, dict):
            return f"arguments of {call.name} must be a JSON object", True
        try:
            args = entry.tool.validate_arguments(raw)
            context = replace(self.setup.tool_context, call_id=call.id)
            result = await self.setup.run_tool(entry.tool, args, context)
        except ToolArgumentError as exc:
            return str(exc), True
        except RunError:
            raise  # the run itself stops (e.g. its worker shuts down): not an observation
        except Exception as exc:  # noqa: BLE001 - a failing tool is an observation, not a crash
            return f"{call.name} failed: {type(exc).__name__}: {exc}", True
        return result.content, result.is_error


async def run_loop(
    setup: LoopSetup,
    state: LoopState,
    model: Model,
    sink: EventSink,
    checkpoint: Checkpoint,
) -> Outcome:
    """Run (or resume) the loop until a final answer, a failure, or a call awaiting a person."""
    run = _Run(setup, state, sink, checkpoint)
    while True:
        waiting = await run.act()
        if waiting is not None:
            return waiting
        if state.final is not None:
            return Outcome("final", state.final)
        if state.turns >= setup.max_turns:
            return Outcome(
                "failed",
                f"ran out of turns: max_turns={setup.max_turns} model calls ended without a "
                "final answer",
            )
        await run.think(model)
