"""The AgentTool (``spawn_agent``): how the coordinator dispatches a specialist.

A non-background specialist is awaited and its final answer becomes the tool result; a background
one returns at once and reports later with its own ``task_notification``. The child's spawn id is
derived from the coordinator's spawn and the call id, so a coordinator resumed on another worker
re-attaches to the specialist it already started instead of starting a second one: the tool is
idempotent, and the loop may run it again after a crash.

The child's context is the parent spawn's context (a chat turn's ``incident_id``, ``device_id``,
…) with the model's ``context`` argument laid over it: the model need not repeat what the turn
already carries, and a key it does pass wins, so one turn may dispatch a specialist per device it
names. The merged context travels on to whatever the child spawns in turn.

The coordinator's budget covers its children (:mod:`workers.budget`): a child's budget is
capped by what the coordinator has left when it is dispatched (nothing left: the dispatch is
refused and the coordinator stops with its partial answer), and what an awaited child spent is
reported back with its result, to count in the coordinator's.

How many specialists a coordinator dispatches is bounded (:attr:`BaseTool.call_limits`, enforced
by the loop before any call of a reply runs): ``max_dispatches_per_reply`` calls of one model
reply, ``max_dispatches_per_turn`` over the coordinator's turn; the calls beyond are answered with
an error that says the bound and to dispatch fewer specialists at once.

While it waits for a non-background child, a worker that shuts down makes the wait stop with
:class:`~registry.errors.WorkerDraining`; the runtime then hands the coordinator back to its queue
with this call still pending, and the next attempt re-attaches to the same child.
"""

from __future__ import annotations

import hashlib
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from registry.budget import CallLimits
from registry.errors import OngridError
from registry.settings import Settings
from registry.tools import AGENT_TOOL_NAME, BaseTool, ToolClass, ToolContext, ToolResult
from workers.budget import allowance_of, report_spent
from workers.messages import Usage

__all__ = ["SpawnAgentTool", "dispatch_limits"]

#: How long the coordinator waits for a non-background specialist.
WAIT_SECONDS = 3600.0
#: What the coordinator is told to do instead of the dispatches a bound refused.
DISPATCH_ADVICE = (
    "Dispatch fewer specialists at once: wait for the ones already dispatched to report, then "
    "dispatch another only if the question still needs it."
)


def dispatch_limits(settings: Settings) -> CallLimits:
    """The bounds on ``spawn_agent`` calls: per model reply and per coordinator turn."""
    return CallLimits(
        per_reply=settings.max_dispatches_per_reply,
        per_spawn=settings.max_dispatches_per_turn,
        advice=DISPATCH_ADVICE,
    )


class SpawnAgentArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent: Annotated[str, Field(description="Name of the specialist, from the catalog.")]
    prompt: Annotated[str, Field(description="The task, with every detail the specialist needs.")]
    context: Annotated[
        dict[str, Any],
        Field(
            description="Identifiers for the specialist's initial prompt (incident_id, …); the "
            "turn's own context is passed on already, so give only keys to add or replace."
        ),
    ] = Field(default_factory=dict)
    reason: Annotated[str, Field(description="Which trigger of the specialist matched.")] = ""


def child_spawn_id(parent: str, call_id: str) -> str:
    return hashlib.sha256(f"{parent}\0{call_id}".encode()).hexdigest()[:32]


class SpawnAgentTool(BaseTool):
    name = AGENT_TOOL_NAME
    description = (
        "Dispatch a specialist persona. Non-background specialists are awaited and their final "
        "answer is returned; background ones report later."
    )
    tool_class = ToolClass.READ
    args_model = SpawnAgentArgs
    idempotent = True

    def __init__(self, client_factory: Any, limits: CallLimits | None = None) -> None:
        """``client_factory(context) -> SpawnClient`` for the process the tool runs in;
        ``limits``: the dispatch bounds (default: those of the default settings)."""
        self._client_for = client_factory
        self.call_limits = limits if limits is not None else dispatch_limits(Settings())

    def run(self, arguments: BaseModel, context: ToolContext) -> ToolResult:
        args = SpawnAgentArgs.model_validate(arguments.model_dump())
        client = self._client_for(context)
        allowance = allowance_of(context)
        # Nothing left for a child: BudgetReached, which stops the coordinator (not caught below).
        cap = allowance.for_child() if allowance is not None else None
        try:
            record = client.spawn(
                args.agent,
                args.prompt,
                context={**context.context, **args.context},
                role=context.role,
                user=context.user,
                session_id=context.session_id,
                spawn_id=child_spawn_id(context.spawn_id, context.call_id),
                reason=args.reason,
                budget_cap=cap,
                parent_spawn_id=context.spawn_id,
            )
        except OngridError as exc:
            return ToolResult(content=str(exc), is_error=True)
        if record.background:
            return ToolResult(
                content=f"{args.agent} runs in the background (spawn {record.spawn_id}); its "
                "result will arrive as a task notification.",
                data={"spawn_id": record.spawn_id, "background": True},
            )
        try:
            done = client.wait(
                record.spawn_id, timeout=WAIT_SECONDS, stop=context.stopping, stranded=True
            )
        except TimeoutError as exc:
            return ToolResult(content=str(exc), is_error=True)
        if done.status == "waiting":
            return ToolResult(
                content=f"{args.agent} is waiting for a person to confirm a tool call (spawn "
                f"{done.spawn_id}); it will report with a task notification once decided.",
                data={"spawn_id": done.spawn_id, "waiting": True},
            )
        spent = done.budget.total(done.state.usage if done.state else Usage())
        data = report_spent({"spawn_id": done.spawn_id}, spent)
        reached = done.budget.reached
        if done.status == "ok" and reached is not None:
            return ToolResult(
                content=f"{args.agent} stopped early: it {reached}. Its partial answer:\n\n"
                f"{done.result}",
                data=data,
            )
        if done.status == "ok":
            return ToolResult(content=done.result, data=data)
        return ToolResult(
            content=f"{args.agent} ended {done.status}: {done.error or done.result}",
            is_error=True,
            data=data,
        )
