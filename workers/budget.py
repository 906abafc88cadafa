"""Per-spawn budgets: resolving the limits a spawn runs within, counting what it spends, and
stopping it with its best partial answer once it reaches one.

**Resolution.** A spawn's limits are the tightest of the organisation's budget
(``Settings.budget``, finite by default: :class:`~registry.budget.OrgBudget`), its persona's
``metadata.ongrid.budget``, the request's budget, and, for a specialist a coordinator
dispatched, what the coordinator had left at the dispatch (:func:`effective`). Every spawn goes
through it: a direct spawn, a coordinator turn, each specialist it dispatches (background ones
included). They are resolved once, at the first attempt, and kept on the spawn's record
(:class:`SpawnBudget`), so a resumed attempt runs within the same limits; only a limit the first
attempt left unset is taken from the organisation's at a resume (:meth:`SpawnBudget.resolve`).

**Spending.** What a spawn has spent (:class:`Spent`) is its model usage (tokens, cost), the
tool calls it ran, and its running seconds, plus the tokens, cost and tool calls of the
specialists it dispatched and waited for, added when each of them returns. Seconds are counted
while an attempt runs and saved with each checkpoint, so a resumed attempt goes on from there;
time spent queued, or parked waiting for a person's decision, does not count. A child's seconds
are not added to its coordinator's: the coordinator's own clock runs while it waits. A
background child reports later, on its own: its spend is not added.

**Enforcement** (:class:`BudgetGuard`, wrapped by the worker runtime around the model and the
tool calls, so the loop itself knows nothing of budgets). Before every model call and every tool
call the spent is compared with the limits; a limit is reached once the spent is at it
(``tool_calls``: the calls made so far, so ``max_tool_calls: 3`` runs three). Time is also
enforced during a call: a model call or a tool call still running when the seconds run out is
cut off. The timeout is around each call, not around the whole attempt: cancelling the attempt
could cut a checkpoint's write in half. A tool that spawns a child within the budget it was
handed (``spawn_agent``) is waited for to its end instead: the child stops at the same limit
with its own partial answer, which the coordinator then has.

**Reaching a limit** raises :class:`BudgetReached` out of the loop. The runtime then makes one
last model call, without tools: the conversation so far (calls that did not run are answered
"not run"), then a message asking for what was found, what is unfinished, and why
(:func:`partial_answer`). Its text is the spawn's result and the spawn ends ``ok``: a spawn
that reaches a limit stops with its best partial answer. Its
``task_notification`` says which limit stopped it (``budget_reached``) and its message says
so before the answer. That last call is spent beyond the limit (it is counted). If it fails
the spawn ends ``failed``, the error naming the limit and why the answer could not be written.

**Children.** A coordinator's budget covers its specialists: each tool call gets an
:class:`Allowance` (what the spawn has left) in its context; ``spawn_agent`` caps the child's
budget with it (:meth:`Allowance.for_child`), split evenly between the children dispatched
together, and refuses to dispatch when nothing is left (the coordinator has then reached its
limit). When the child returns, the tool reports what it spent (:func:`report_spent`) and the
guard adds it to the coordinator's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field

from registry.budget import Budget
from registry.errors import RunError
from registry.tools import BaseTool, ToolContext, ToolResult
from workers.loop import (
    EventSink,
    LoopSetup,
    LoopState,
    RunTool,
    ask_model,
)
from workers.messages import Message, TextDelta, ToolResultEvent, Usage
from workers.model import Model, ModelError, ModelReply, ModelRequest

__all__ = [
    "ALLOWANCE_KEY",
    "Allowance",
    "Budget",
    "BudgetGuard",
    "BudgetReached",
    "Limit",
    "Reached",
    "SpawnBudget",
    "Spent",
    "effective",
    "exceeded",
    "partial_answer",
    "remaining",
    "report_spent",
    "reported_spent",
    "tightest",
]

T = TypeVar("T")

#: ``context``: not a budget of the spawn's but its model's window, which the conversation could
#: not be made to fit (:class:`~workers.context.ContextExhausted`); it ends the same way.
Limit = Literal["tokens", "cost", "time", "tool_calls", "context"]
#: Each limit: its :class:`Budget` field and its :class:`Spent` field, in the order checked.
_LIMITS: tuple[tuple[Limit, str, str], ...] = (
    ("tokens", "max_tokens", "tokens"),
    ("cost", "max_cost_usd", "cost_usd"),
    ("time", "max_seconds", "seconds"),
    ("tool_calls", "max_tool_calls", "tool_calls"),
)
#: Limits shared out between children dispatched together (time is not: they run at once).
_SHARED = ("max_tokens", "max_cost_usd", "max_tool_calls")
#: Key of :attr:`ToolContext.extras` holding the spawn's :class:`Allowance`.
ALLOWANCE_KEY = "budget_allowance"
#: Key of a :class:`ToolResult`'s ``data`` under which a tool reports what a child spent.
SPENT_KEY = "budget_spent"


class Spent(BaseModel):
    """What a spawn (or a sum of spawns) has spent, in the units of its limits."""

    tokens: int = 0
    cost_usd: float = 0.0
    seconds: float = 0.0
    tool_calls: int = 0

    def __add__(self, other: Spent) -> Spent:
        return Spent(
            tokens=self.tokens + other.tokens,
            cost_usd=self.cost_usd + other.cost_usd,
            seconds=self.seconds + other.seconds,
            tool_calls=self.tool_calls + other.tool_calls,
        )


class Reached(BaseModel):
    """The limit a spawn reached, with the figures."""

    limit: Limit
    spent: float
    maximum: float

    def figures(self) -> str:
        """``3 tool calls of max_tool_calls=3``: what was spent against which setting."""
        if self.limit == "tokens":
            return f"{self.spent:.0f} tokens of max_tokens={self.maximum:.0f}"
        if self.limit == "cost":
            return f"{self.spent:.6g} USD of max_cost_usd={self.maximum:g}"
        if self.limit == "time":
            return f"{self.spent:.1f} s of max_seconds={self.maximum:g}"
        if self.limit == "context":
            return f"about {self.spent:.0f} tokens needed, the model's window is {self.maximum:.0f}"
        return f"{self.spent:.0f} tool calls of max_tool_calls={self.maximum:.0f}"

    def __str__(self) -> str:
        if self.limit == "context":
            return f"outgrew its model's context window ({self.figures()})"
        return f"reached its {self.limit} budget ({self.figures()})"


class SpawnBudget(BaseModel):
    """A spawn's budget on its record: what was asked, the limits resolved, what was spent."""

    #: The request's budget (API body, ``SpawnClient.spawn(budget=...)``).
    requested: Budget = Field(default_factory=Budget)
    #: What the dispatching coordinator had left for this child (unset: not a child).
    inherited: Budget = Field(default_factory=Budget)
    #: The limits the spawn runs within; resolved at its first attempt (``None`` before).
    limits: Budget | None = None
    #: Running seconds of its attempts, as of the last checkpoint.
    seconds: float = 0.0
    #: Tool calls it ran.
    tool_calls: int = 0
    #: What the children it waited for spent (their seconds are not counted: see the module).
    children: Spent = Field(default_factory=Spent)
    #: The limit that stopped it, if one did.
    reached: Reached | None = None

    def resolve(self, org: Budget, persona: Budget | None) -> Budget:
        """The limits, resolved now if this is the spawn's first attempt.

        A resumed attempt keeps the limits of the first, except that a limit left unset there
        takes the organisation's now: a spawn resolved before the organisation had a default
        (a record from an earlier version, parked for a person's decision) does not resume
        unbounded.
        """
        if self.limits is None:
            self.limits = effective(org, persona, self.requested, self.inherited)
        else:
            unset = {name for name in Budget.model_fields if getattr(self.limits, name) is None}
            if any(getattr(org, name) is not None for name in unset):
                fill = Budget(**{name: getattr(org, name) for name in unset})
                self.limits = tightest(self.limits, fill)
        return self.limits

    def total(self, usage: Usage, seconds: float | None = None) -> Spent:
        """Everything spent: the spawn's ``usage`` and counts, plus its children's."""
        own = Spent(
            tokens=usage.total_tokens,
            cost_usd=usage.cost,
            seconds=self.seconds if seconds is None else seconds,
            tool_calls=self.tool_calls,
        )
        return own + self.children


# -- resolution and comparison ----------------------------------------------------------------


def tightest(*budgets: Budget | None) -> Budget:
    """Each limit at the lowest any of ``budgets`` sets (unset everywhere: no limit)."""
    limits: dict[str, Any] = {}
    for name in Budget.model_fields:
        values = [getattr(b, name) for b in budgets if b is not None]
        values = [v for v in values if v is not None]
        if values:
            limits[name] = min(values)
    return Budget(**limits)


def effective(
    org: Budget, persona: Budget | None, request: Budget | None, parent_remaining: Budget | None
) -> Budget:
    """The limits a spawn runs within: the tightest of each source's."""
    return tightest(org, persona, request, parent_remaining)


def exceeded(budget: Budget, spent: Spent) -> Reached | None:
    """The first limit of ``budget`` that ``spent`` has reached, or ``None``."""
    for limit, field, spent_field in _LIMITS:
        maximum = getattr(budget, field)
        value = getattr(spent, spent_field)
        if maximum is not None and value >= maximum:
            return Reached(limit=limit, spent=value, maximum=maximum)
    return None


def remaining(budget: Budget, spent: Spent, share: int = 1) -> Budget:
    """What is left of each limit of ``budget`` after ``spent``; tokens, cost and tool calls
    shared between ``share`` children (each gets at least one token or call).
    :class:`BudgetReached` when a limit has nothing left."""
    reached = exceeded(budget, spent)
    if reached is not None:
        raise BudgetReached(reached)
    left: dict[str, Any] = {}
    for _limit, field, spent_field in _LIMITS:
        maximum = getattr(budget, field)
        if maximum is None:
            continue
        value = maximum - getattr(spent, spent_field)
        if field in _SHARED and share > 1:
            value = value / share if isinstance(value, float) else max(1, value // share)
        left[field] = value
    return Budget(**left)


class BudgetReached(RunError):
    """A spawn reached a limit of its budget: it stops with a partial answer."""

    def __init__(self, reached: Reached) -> None:
        self.reached = reached
        super().__init__(str(reached))


# -- children ---------------------------------------------------------------------------------


class Allowance:
    """What a spawn has left, handed to each of its tool calls (``context.extras``).

    A tool that spawns a child caps the child's budget with :meth:`for_child`; that it did is
    remembered (``granted``), so the guard waits for the child rather than cut it off.
    """

    def __init__(self, limits: Budget, spent: Spent, share: int = 1) -> None:
        self.limits, self.spent, self.share = limits, spent, share
        self.granted = False

    def for_child(self) -> Budget:
        """The cap of a child's budget; :class:`BudgetReached` when nothing is left to give."""
        cap = remaining(self.limits, self.spent, self.share)
        self.granted = True
        return cap


def allowance_of(context: ToolContext) -> Allowance | None:
    """The allowance of the spawn a tool call serves (``None``: its budget has no limits)."""
    found = context.extras.get(ALLOWANCE_KEY)
    return found if isinstance(found, Allowance) else None


def report_spent(data: dict[str, Any], spent: Spent) -> dict[str, Any]:
    """``data`` of a tool result, saying the child it ran spent ``spent``."""
    return {**data, SPENT_KEY: spent}


def reported_spent(result: ToolResult) -> Spent | None:
    """What the child a tool call ran spent, if the tool reported it."""
    data = result.data
    found = data.get(SPENT_KEY) if isinstance(data, dict) else None
    return found if isinstance(found, Spent) else None


# -- enforcement ------------------------------------------------------------------------------


class BudgetGuard:
    """One attempt's enforcement of a spawn's budget (see the module docstring).

    ``budget`` is the record's (its counts are updated in place, and saved with the record);
    ``state`` the loop state the attempt runs, whose usage is the spawn's own.
    """

    def __init__(
        self,
        budget: SpawnBudget,
        state: LoopState,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.budget, self.state, self._clock = budget, state, clock
        self.limits = budget.limits if budget.limits is not None else Budget()
        self._since, self._before = clock(), budget.seconds
        #: Results of calls this attempt ran that the loop may not have reported yet (calls run
        #: together all end before the loop stops): the partial answer reports them.
        self.completed: dict[str, tuple[str, bool]] = {}

    def running(self) -> float:
        """Running seconds of the spawn, this attempt's included."""
        return self._before + self._clock() - self._since

    def tick(self) -> None:
        """Bring the record's seconds up to now (before each save)."""
        self.budget.seconds = self.running()

    def spent(self) -> Spent:
        return self.budget.total(self.state.usage, self.running())

    def check(self) -> None:
        """:class:`BudgetReached` if the spawn has reached a limit."""
        reached = exceeded(self.limits, self.spent())
        if reached is not None:
            raise BudgetReached(reached)

    def _out_of_time(self) -> BudgetReached:
        assert self.limits.max_seconds is not None
        return BudgetReached(
            Reached(limit="time", spent=self.running(), maximum=self.limits.max_seconds)
        )

    def _seconds_left(self) -> float | None:
        if self.limits.max_seconds is None:
            return None
        return max(0.0, self.limits.max_seconds - self.running())

    async def _in_time(self, awaitable: Awaitable[T]) -> T:
        """``await awaitable``, cut off when the spawn's seconds run out."""
        left = self._seconds_left()
        if left is None:
            return await awaitable
        timeout = asyncio.timeout(left)
        try:
            async with timeout:
                return await awaitable
        except TimeoutError:
            if not timeout.expired():
                raise
            raise self._out_of_time() from None

    # -- the model --------------------------------------------------------------------------

    def model(self, inner: Model) -> Model:
        """``inner``, checked before each call and cut off when the seconds run out."""
        return _GuardedModel(inner, self)

    # -- tool calls ---------------------------------------------------------------------------

    def run_tool(self, inner: RunTool) -> RunTool:
        """``inner``, checked and counted before each call; children's spend added after."""

        async def run(tool: BaseTool, arguments: BaseModel, context: ToolContext) -> ToolResult:
            pending = {c.id for c in self.state.pending}
            self.completed = {k: v for k, v in self.completed.items() if k in pending}
            call_id = context.call_id
            try:
                self.check()
            except BudgetReached as exc:
                self.completed[call_id] = (_not_run(exc.reached), True)
                raise
            self.budget.tool_calls += 1
            allowance = None
            if not self.limits.unlimited:
                allowance = Allowance(self.limits, self.spent(), self._together(tool.name))
                context = replace(context, extras={**context.extras, ALLOWANCE_KEY: allowance})

            async def attempt() -> ToolResult:
                try:
                    return await inner(tool, arguments, context)
                except BudgetReached as exc:  # the tool refused (no budget left for a child)
                    self.completed[call_id] = (_not_run(exc.reached), True)
                    raise
                except RunError:
                    raise
                except Exception as exc:
                    self.completed[call_id] = (
                        f"{tool.name} failed: {type(exc).__name__}: {exc}",
                        True,
                    )
                    raise

            result = await self._until_done(attempt(), allowance)
            self.completed[call_id] = (result.content, result.is_error)
            reported = reported_spent(result)
            if reported is not None:
                self.budget.children += reported.model_copy(update={"seconds": 0.0})
            return result

        return run

    def _together(self, name: str) -> int:
        """Calls of tool ``name`` running now in this spawn (started, not ended): the children
        dispatched together share what is left."""
        state = self.state
        running = [
            c
            for c in state.pending
            if c.name == name and c.id in state.started and c.id not in self.completed
        ]
        return max(1, len(running))

    async def _until_done(
        self, call: Awaitable[ToolResult], allowance: Allowance | None
    ) -> ToolResult:
        """The tool call, cut off when the seconds run out, unless it runs a child within the
        spawn's allowance: then it is waited for (the child stops at the same limit)."""
        left = self._seconds_left()
        if left is None:
            return await call
        task = asyncio.ensure_future(call)
        try:
            done, _ = await asyncio.wait({task}, timeout=left)
            if done or (allowance is not None and allowance.granted):
                return await task
            raise self._out_of_time()
        finally:
            if not task.done():
                task.cancel()


class _GuardedModel:
    def __init__(self, inner: Model, guard: BudgetGuard) -> None:
        self.inner, self.guard = inner, guard

    async def stream(self, request: ModelRequest) -> AsyncIterator[str | ModelReply]:
        self.guard.check()
        items = aiter(self.inner.stream(request))
        try:
            while True:
                try:
                    # The timeout is around each wait for the next item, never around a
                    # ``yield``: the consumer's code runs outside it.
                    item = await self.guard._in_time(anext(items))
                except StopAsyncIteration:
                    return
                yield item
        finally:
            close = getattr(items, "aclose", None)
            if callable(close):
                await close()


# -- the partial answer -----------------------------------------------------------------------


def summary_request(reached: Reached) -> str:
    """The last user message of a spawn that reached a limit."""
    if reached.limit == "context":
        return (
            f"This task's conversation no longer fits the model's context window "
            f"({reached.figures()}) and stops now: no more tool calls. Write your best partial "
            "answer: what you found, with the evidence the tools returned; what is still "
            "unfinished; and that it is unfinished because the context window ran out."
        )
    return (
        f"This task has reached its {reached.limit} budget ({reached.figures()}) and stops now: "
        "no more tool calls. Write your best partial answer: what you found, with the evidence "
        "the tools returned; what is still unfinished; and that it is unfinished because the "
        f"{reached.limit} budget ran out."
    )


def notification_text(reached: Reached, answer: str) -> str:
    """The ``task_notification`` message of a spawn stopped by its budget."""
    return f"Stopped: {reached}. Partial answer:\n\n{answer}"


async def partial_answer(
    model: Model,
    setup: LoopSetup,
    state: LoopState,
    reached: Reached,
    sink: EventSink,
    completed: dict[str, tuple[str, bool]],
) -> str:
    """One last model call, without tools, for the best partial answer; its text.

    ``state`` becomes the spawn's final state: the calls it left pending are answered (with
    their result when they ran, ``completed``), then come the request and the answer.
    ``setup.reminder`` should name no tools. A call that fails raises its :class:`ModelError`.
    """

    def emit(event: Any) -> None:
        sink(event, state.event_index)
        state.event_index += 1

    session_id, spawn_id = setup.session_id, setup.spawn_id
    for call in state.pending:
        content, is_error = completed.get(call.id) or (_unsettled(call.id, state, reached), True)
        emit(
            ToolResultEvent(
                session_id=session_id,
                spawn_id=spawn_id,
                call_id=call.id,
                name=call.name,
                content=content,
                is_error=is_error,
            )
        )
        state.messages.append(
            Message(role="tool", content=content, tool_call_id=call.id, name=call.name)
        )
        if is_error:
            state.failed_calls.append(call.id)
    state.pending = []
    ask = Message(role="user", content=summary_request(reached))
    reply = await ask_model(
        model,
        setup,
        state,
        [],
        lambda text: emit(TextDelta(session_id=session_id, spawn_id=spawn_id, text=text)),
        then=ask,
    )
    text = reply.message.content
    state.messages += [ask, Message(role="assistant", content=text)]
    if not text.strip():
        raise ModelError(setup.model_id, "the partial answer came back empty", retryable=False)
    state.final = text
    return text


def _not_run(reached: Reached) -> str:
    return f"not run: the task {reached} first."


def _unsettled(call_id: str, state: LoopState, reached: Reached) -> str:
    """The result of a call the loop left pending with no result of this attempt's."""
    if call_id in state.started:
        return (
            f"stopped: the task {reached} while this call ran; its outcome is unknown. "
            "Do not report its effect as known."
        )
    return _not_run(reached)
