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
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from pydantic import BaseModel, Field

from registry.errors import RunError, ToolArgumentError
from registry.policy import Confirmation, ToolBag
from registry.tools import BaseTool, ToolClass, ToolContext, ToolResult
from workers.messages import (
    ConfirmationRequired,
    Event,
    Message,
    TextDelta,
    ToolCall,
    ToolCallEvent,
    ToolResultEvent,
    Usage,
)
from workers.model import Model, ModelReply, ModelRequest, ToolSpec

__all__ = ["Approval", "LoopSetup", "LoopState", "Outcome", "run_loop", "system_reminder_message"]


class Approval(BaseModel):
    """People's decisions on one tool call that needs confirmation."""

    approved_by: list[str] = Field(default_factory=list)
    denied_by: str | None = None
    #: Different people who must approve (2 for a destructive call): the deciding side resumes
    #: the spawn once that many have, or one has denied it.
    needed: int = 1


class LoopState(BaseModel):
    """Everything needed to resume a spawn on any worker."""

    messages: list[Message]
    turns: int = 0
    usage: Usage = Field(default_factory=Usage)
    turn_usage: list[Usage] = Field(default_factory=list)
    pending: list[ToolCall] = Field(default_factory=list)
    started: list[str] = Field(default_factory=list)
    approvals: dict[str, Approval] = Field(default_factory=dict)
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


#: (event, spawn-local index) → None, without blocking. The index lets the sink drop replays
#: after a resume.
EventSink = Callable[[Event, int], None]
#: Persists the state; an event emitted before it must be published once it returns.
Checkpoint = Callable[[LoopState], Awaitable[None]]


def system_reminder_message(reminder: str) -> Message:
    """The per-turn reminder, in the ``<system-reminder>`` wrapper models are trained on."""
    return Message(role="user", content=f"<system-reminder>\n{reminder}\n</system-reminder>")


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


class _Run:
    def __init__(self, setup: LoopSetup, state: LoopState, sink: EventSink, save: Checkpoint):
        self.setup, self.state, self._sink, self._save = setup, state, sink, save
        # Once per attempt: a tool's JSON schema is generated by pydantic each time it is read
        # (7 % of a worker's loop when rebuilt every turn, measured).
        self._tools = _tool_specs(setup.bag)

    def emit(self, event_type: type, **fields: object) -> None:
        event = event_type(session_id=self.setup.session_id, spawn_id=self.setup.spawn_id, **fields)
        self._sink(event, self.state.event_index)
        self.state.event_index += 1

    async def checkpoint(self) -> None:
        await self._save(self.state)

    # -- one model call ---------------------------------------------------------------------

    async def think(self, model: Model) -> None:
        stream = True if self.setup.stream is None else await self.setup.stream()
        request = ModelRequest(
            model=self.setup.model_id,
            messages=[*self.state.messages, system_reminder_message(self.setup.reminder)],
            tools=self._tools,
            stream=stream,
        )
        reply: ModelReply | None = None
        async for item in model.stream(request):
            if isinstance(item, ModelReply):
                reply = item
            elif item:
                self.emit(TextDelta, text=item)
        if reply is None:
            raise RuntimeError(f"model adapter for {self.setup.model_id} returned no reply")
        state = self.state
        state.turns += 1
        state.usage = state.usage + reply.usage
        state.turn_usage.append(reply.usage)
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
        while self.state.pending:
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
        self.state.pending.pop(0)

    def _concurrent_reads(self) -> list[ToolCall]:
        """The pending calls from the first on that may run at the same time: tools of class
        ``read`` that need nobody's confirmation and were not started by an earlier attempt."""
        batch = []
        for call in self.state.pending:
            entry = self.setup.bag.entry(call.name)
            if (
                entry is None
                or entry.tool.tool_class is not ToolClass.READ
                or entry.confirmation is not Confirmation.NONE
                or call.id in self.state.started
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
        approval = self.state.approvals.get(call.id, Approval())
        needed = 2 if entry.confirmation is Confirmation.DUAL else 1
        approval.needed = needed
        if approval.denied_by is not None or len(set(approval.approved_by)) >= needed:
            return None
        if call.id not in self.state.approvals:
            self.state.approvals[call.id] = approval
            self.emit(
                ConfirmationRequired,
                call_id=call.id,
                name=call.name,
                arguments=call.arguments,
                confirmation=entry.confirmation.value,
            )
            await self.checkpoint()
        return Outcome(
            "interrupted", f"{call.name} needs confirmation ({entry.confirmation})", call
        )

    async def _execute(self, call: ToolCall) -> tuple[str, bool]:
        entry = self.setup.bag.entry(call.name)
        if entry is None:
            names = ", ".join(self.setup.bag.names()) or "none"
            return f"tool {call.name!r} is not in your tool bag; available: {names}", True
        approval = self.state.approvals.get(call.id)
        if approval is not None and approval.denied_by is not None:
            return f"the call was denied by {approval.denied_by}; do not retry it", True
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
