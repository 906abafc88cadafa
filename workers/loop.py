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
from workers import context as ctx
from workers.context import Compaction, ContextExhausted, ContextPolicy, StoredResult
from workers.messages import (
    ConfirmationRequired,
    ContextCompacted,
    Event,
    Message,
    Requester,
    TextDelta,
    ToolCall,
    ToolCallEvent,
    ToolResultEvent,
    Usage,
)
from workers.model import Model, ModelError, ModelReply, ModelRequest, ToolSpec

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
    #: Tool results kept in the context policy's result store, by call id (:mod:`workers.context`).
    stored: dict[str, StoredResult] = Field(default_factory=dict)
    #: Characters per token of this spawn's model, as its provider counted them (0: not yet).
    chars_per_token: float = 0.0
    #: Counts the rewrites of ``messages`` in place (results shrunk, a compaction): a store that
    #: appends new messages to its copy must then rewrite it whole.
    rewrites: int = 0
    compactions: list[Compaction] = Field(default_factory=list)


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
    context: ContextPolicy | None = None
    """How the conversation is kept inside the model's window (:mod:`workers.context`);
    ``None``: sent as it is, with no output limit."""


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
    messages: list[Message] | None = None,
    max_tokens: int | None = None,
    turn: bool = True,
) -> ModelReply:
    """One model call: ``messages`` (the state's by default), the turn's reminder, then
    ``then`` if given, offered ``tools``. Its text goes to ``on_text`` as it streams; its usage
    is added to the state's, and it counts as a turn unless ``turn`` is false (the runtime's
    own calls, such as a compaction's)."""
    stream = True if setup.stream is None else await setup.stream()
    history = state.messages if messages is None else messages
    sent = [*history, system_reminder_message(setup.reminder)]
    if then is not None:
        sent.append(then)
    policy = setup.context
    request = ModelRequest(
        model=setup.model_id,
        messages=sent,
        tools=tools,
        stream=stream,
        max_tokens=max_tokens or (policy.max_tokens() if policy is not None else None),
        cache_key=setup.spawn_id,
        # Everything before the reminder is sent again, unchanged, by the next call.
        stable=len(history),
        settled=ctx.first_shrinkable(history, state.stored) if policy is not None else 0,
    )
    reply: ModelReply | None = None
    async for item in model.stream(request):
        if isinstance(item, ModelReply):
            reply = item
        elif item:
            on_text(item)
    if reply is None:
        raise RuntimeError(f"model adapter for {setup.model_id} returned no reply")
    if turn:
        state.turns += 1
        state.turn_usage.append(reply.usage)
    state.usage = state.usage + reply.usage
    measured = ctx.calibrated(ctx.request_chars(sent, tools), len(sent), reply.usage.prompt_tokens)
    if measured:
        state.chars_per_token = measured
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
        self._bag_tools = _tool_specs(setup.bag)
        self._with_read = [*self._bag_tools, ctx.READ_TOOL_SPEC]
        self._bounded = any(e.tool.call_limits is not None for e in setup.bag)
        #: The pending calls a tool's call limits refuse, by id, with their error result.
        self._refused: dict[str, str] = {}

    def _offered(self) -> list[ToolSpec]:
        """The tools a request offers: the bag's, and the stored-result reader once a result
        has been stored (a persona that never spills never sees it)."""
        return self._with_read if self.state.stored else self._bag_tools

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
        def on_text(text: str) -> None:
            self.emit(TextDelta, text=text)

        if self.setup.context is None:
            reply = await ask_model(model, self.setup, self.state, self._offered(), on_text)
        else:
            await self.fit(model)
            try:
                reply = await ask_model(model, self.setup, self.state, self._offered(), on_text)
            except ModelError as exc:
                if not exc.context_exceeded:
                    raise
                # The estimate was wrong: learn from the provider's figures, compact, once more.
                self._recalibrate(exc, self._sent())
                await self.fit(model, reason="the provider refused the request as too long")
                try:
                    reply = await ask_model(model, self.setup, self.state, self._offered(), on_text)
                except ModelError as again:
                    if not again.context_exceeded:
                        raise
                    raise self._exhausted(
                        "the provider still refused the conversation as too long after it "
                        "was compacted"
                    ) from again
        state = self.state
        calls = _distinct_ids(reply.message.tool_calls, state.messages, state.turns)
        state.messages.append(reply.message.model_copy(update={"tool_calls": calls}))
        for call in calls:
            self.emit(ToolCallEvent, call_id=call.id, name=call.name, arguments=call.arguments)
        state.pending = list(calls)
        if not calls:
            state.final = reply.message.content
        await self.checkpoint()

    # -- the context window -------------------------------------------------------------------

    def _sent(self) -> list[Message]:
        """The messages the next request sends: the state's, then the turn's reminder."""
        return [*self.state.messages, system_reminder_message(self.setup.reminder)]

    def _estimate(self) -> int:
        return ctx.estimate(self._sent(), self._offered(), self.state.chars_per_token)

    def _recalibrate(self, exc: ModelError, sent: list[Message]) -> None:
        """Characters per token from a "prompt is too long: N tokens > M maximum" refusal of a
        request that sent ``sent``."""
        figures = ctx.exceeded_figures(str(exc))
        if figures is None:
            # No figures: assume the text is denser than thought, by a margin.
            self.state.chars_per_token = (
                self.state.chars_per_token or ctx.DEFAULT_CHARS_PER_TOKEN
            ) * 0.8
            return
        tokens, _maximum = figures
        measured = ctx.calibrated(ctx.request_chars(sent, self._offered()), len(sent), tokens)
        if measured:
            self.state.chars_per_token = measured

    def _exhausted(self, why: str) -> ContextExhausted:
        assert self.setup.context is not None
        window = self.setup.context.window.context_window
        return ContextExhausted(self._estimate(), window, why)

    async def fit(self, model: Model, *, reason: str = "") -> None:
        """Bring the next request inside the input budget (:mod:`workers.context`): shrink
        older stored results, then compact; ``reason`` forces both (a refusal as too long)."""
        policy = self.setup.context
        assert policy is not None
        state = self.state
        budget = policy.input_budget()
        if reason or self._estimate() > policy.shrink_at * budget:
            until = ctx.recent_start(state.messages, policy.keep_turns)
            if ctx.shrink(state.messages, state.stored, policy, until=until):
                state.rewrites += 1
                await self.checkpoint()
        tokens = self._estimate()
        if reason or tokens > policy.compact_at * budget:
            await self.compact(model, reason or f"about {tokens:,} of {budget:,} input tokens")
        # The kept turns alone too long: their results shrink too.
        if self._estimate() > budget and ctx.shrink(
            state.messages, state.stored, policy, until=len(state.messages)
        ):
            state.rewrites += 1
            await self.checkpoint()
        if (tokens := self._estimate()) > budget:
            raise self._exhausted(
                f"the conversation needs about {tokens:,} input tokens after compaction; the "
                f"model's window leaves {budget:,}"
            )

    async def compact(self, model: Model, reason: str) -> None:
        """Replace the turns before the last ``keep_turns`` by a ledger the model writes."""
        policy = self.setup.context
        assert policy is not None
        state = self.state
        keep_from = ctx.first_kept(state.messages, policy.keep_turns)
        if keep_from <= 2:  # only the opening and the kept turns: nothing to replace
            return
        before = self._estimate()
        try:
            ledger = await self._write_ledger(model, policy)
        except ModelError as exc:
            if not exc.context_exceeded:
                raise
            raise self._exhausted(
                "even the request for the investigation ledger was refused as too long"
            ) from exc
        if not ledger:
            raise self._exhausted("the model wrote an empty ledger when asked to compact")
        number = len(state.compactions) + 1
        replaced = keep_from - 2
        state.messages = ctx.compacted(
            state.messages, ctx.ledger_message(ledger, number, replaced), keep_from
        )
        state.rewrites += 1
        after = self._estimate()
        state.compactions.append(
            Compaction(
                turn=state.turns,
                reason=reason,
                replaced=replaced,
                tokens_before=before,
                tokens_after=after,
            )
        )
        self.emit(
            ContextCompacted,
            number=number,
            reason=reason,
            replaced=replaced,
            tokens_before=before,
            tokens_after=after,
            ledger=ledger,
        )
        await self.checkpoint()

    async def _write_ledger(self, model: Model, policy: ContextPolicy) -> str:
        """The model's ledger of the conversation so far; one more try, on fewer turns, when
        the provider refuses the ledger request as too long."""
        state = self.state

        async def attempt() -> ModelReply:
            view, omitted = ctx.ledger_input(
                state.messages, self._offered(), policy, state.stored, state.chars_per_token
            )
            ask = Message(role="user", content=ctx.ledger_instruction(omitted))
            sent[:] = [*view, system_reminder_message(self.setup.reminder), ask]
            return await ask_model(
                model,
                self.setup,
                state,
                self._offered(),  # the same tools: the cached prefix stays valid
                lambda _text: None,  # the ledger is shown once, in the compaction event
                messages=view,
                then=ask,
                max_tokens=min(policy.ledger_tokens, policy.max_tokens()),
                turn=False,
            )

        sent: list[Message] = []
        try:
            reply = await attempt()
        except ModelError as exc:
            if not exc.context_exceeded:
                raise
            self._recalibrate(exc, sent)
            reply = await attempt()
        return reply.message.content.strip()

    async def _kept(self, call: ToolCall, content: str) -> str:
        """The content the conversation holds of ``call``'s result: a large one is stored
        first, and one too large for the window enters as its preview."""
        policy = self.setup.context
        if policy is None or len(content) <= policy.spill_chars or call.name == ctx.READ_TOOL:
            return content
        await policy.store.put(call.id, content)
        entry = StoredResult(chars=len(content), lines=content.count("\n") + 1)
        self.state.stored[call.id] = entry
        per_token = self.state.chars_per_token or ctx.DEFAULT_CHARS_PER_TOKEN
        if len(content) / per_token > policy.input_budget() / 4:
            entry.shrunk = True
            return ctx.preview(content, call.id, policy.head_chars, policy.tail_chars)
        return content

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
            await self._observe(call, content, is_error)
            await self.checkpoint()
        return None

    async def _observe(self, call: ToolCall, content: str, is_error: bool) -> None:
        """Report the result of the first pending call, which is ``call``."""
        kept = await self._kept(call, content)
        self.emit(
            ToolResultEvent, call_id=call.id, name=call.name, content=content, is_error=is_error
        )
        self.state.messages.append(
            Message(role="tool", content=kept, tool_call_id=call.id, name=call.name)
        )
        if is_error:
            self.state.failed_calls.append(call.id)
        self.state.pending.pop(0)

    async def _refuse(self) -> None:
        """Answer the pending calls from the first on that a call limit refuses; one
        checkpoint for all of them."""
        pending = self.state.pending
        while pending and pending[0].id in self._refused:
            await self._observe(pending[0], self._refused[pending[0].id], True)
        await self.checkpoint()

    def _concurrent_reads(self) -> list[ToolCall]:
        """The pending calls from the first on that may run at the same time: tools of class
        ``read`` that need nobody's confirmation, were not started by an earlier attempt and
        are not refused by a call limit."""
        batch = []
        for call in self.state.pending:
            if self._reads_stored(call) and call.id not in self.state.started:
                batch.append(call)
                continue
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
            await self._observe(call, content, is_error)
        await self.checkpoint()

    def _reads_stored(self, call: ToolCall) -> bool:
        """A call of the context policy's own read tool (not a tool of the bag)."""
        return self.setup.context is not None and call.name == ctx.READ_TOOL

    def _idempotent(self, call: ToolCall) -> bool:
        """Tools that make a repeat harmless (same call id, same effect) are simply run again."""
        if self._reads_stored(call):
            return True
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
        entry = self.setup.bag.entry(call.name)
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
            tool_class=entry.tool.tool_class.value if entry is not None else "",
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
        if self._reads_stored(call):
            assert self.setup.context is not None
            return await ctx.read_stored(
                self.setup.context.store, self.state.stored, call.arguments
            )
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
