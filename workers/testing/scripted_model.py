"""A scripted :class:`~workers.model.Model` for unit tests of the run loop (STYLE.md item 13).

It answers each call with the next queued step and records every request it received::

    model = ScriptedModel([tool_call("host_probe", section="disk"), text("The disk ", "is full.")])
    outcome = run_loop(setup, state, model, sink, checkpoint)
    model.assert_done()
    assert model.requests[1].messages[-2].role == "tool"

A step is a text reply (streamed as the deltas given), tool calls (with optional text), or an
exception to raise (optionally after streaming some text, as a connection lost mid-reply). A call
with no step left fails with an :class:`AssertionError` that describes the request;
:meth:`ScriptedModel.assert_done` fails when steps were left unused.
"""

from __future__ import annotations

import copy
import json
from collections import deque
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any

from workers.messages import Message, ToolCall, Usage
from workers.model import ModelReply, ModelRequest

__all__ = ["ScriptedModel", "Step", "call", "fail", "text", "tool_call", "tool_calls"]


@dataclass(frozen=True)
class Step:
    """One scripted model reply: text streamed as ``deltas``, then ``calls``; or ``error``."""

    deltas: tuple[str, ...] = ()
    calls: tuple[ToolCall, ...] = ()
    usage: Usage | None = None
    """Reported usage; ``None`` means ``Usage(model_calls=1)``."""
    error: BaseException | None = None
    """Raised instead of replying (e.g. a :class:`~workers.model.ModelError`), after streaming
    ``deltas``."""

    @property
    def content(self) -> str:
        return "".join(self.deltas)

    def describe(self) -> str:
        if self.error is not None:
            streamed = f"text {self.content!r}, then " if self.deltas else ""
            return f"{streamed}raise {self.error!r}"
        parts = [f"text {self.content!r}"] if self.deltas else []
        parts += [f"call {c.name}({c.arguments})" for c in self.calls]
        return ", ".join(parts) or "empty reply"


def text(*deltas: str, usage: Usage | None = None) -> Step:
    """A final text reply, streamed as the given deltas (their concatenation is the content)."""
    return Step(deltas=tuple(deltas), usage=usage)


def call(
    name: str, /, *, raw_arguments: str | None = None, call_id: str = "", **arguments: Any
) -> ToolCall:
    """One tool call: ``arguments`` as keywords, or ``raw_arguments`` sent verbatim (bad JSON…).

    Without ``call_id`` the model assigns ``call_<model call number>_<position>``.
    """
    args = raw_arguments if raw_arguments is not None else json.dumps(arguments)
    return ToolCall(id=call_id, name=name, arguments=args)


def tool_calls(*calls: ToolCall, text: str = "", usage: Usage | None = None) -> Step:
    """A reply that calls the given tools (made with :func:`call`), with optional text."""
    return Step(deltas=(text,) if text else (), calls=calls, usage=usage)


def tool_call(name: str, /, **arguments: Any) -> Step:
    """A reply with a single tool call: ``tool_call("host_probe", section="disk")``."""
    return tool_calls(call(name, **arguments))


def fail(error: BaseException, *, after: Iterable[str] = ()) -> Step:
    """A call that raises ``error``; with ``after``, once it has streamed those text deltas."""
    return Step(deltas=tuple(after), error=error)


def _describe(request: ModelRequest) -> str:
    last = request.messages[-1] if request.messages else None
    tail = f"last {last.role} message {last.content[:200]!r}" if last else "no messages"
    tools = ", ".join(t.name for t in request.tools) or "no tools"
    return f"model={request.model!r}, {len(request.messages)} messages, {tail}, tools: {tools}"


class ScriptedModel:
    """A :class:`~workers.model.Model` that replays queued steps and records its requests."""

    def __init__(self, steps: Iterable[Step | str] = ()) -> None:
        self._steps: deque[Step] = deque()
        self.requests: list[ModelRequest] = []
        """Every request received, in order (messages deep-copied at call time)."""
        self.add(*steps)

    def add(self, *steps: Step | str) -> None:
        """Queue more steps; a plain string is a one-delta text reply."""
        self._steps.extend(text(s) if isinstance(s, str) else s for s in steps)

    @property
    def remaining(self) -> list[Step]:
        return list(self._steps)

    def assert_done(self) -> None:
        """Fail when queued steps were never used."""
        if self._steps:
            left = "; ".join(s.describe() for s in self._steps)
            raise AssertionError(
                f"ScriptedModel: {len(self._steps)} step(s) never used after "
                f"{len(self.requests)} call(s): {left}"
            )

    def stream(self, request: ModelRequest) -> AsyncIterator[str | ModelReply]:
        snapshot = ModelRequest(
            model=request.model,
            messages=[m.model_copy(deep=True) for m in request.messages],
            tools=copy.deepcopy(request.tools),
            stream=request.stream,
        )
        self.requests.append(snapshot)
        number = len(self.requests)
        if not self._steps:
            raise AssertionError(
                f"ScriptedModel: unexpected call #{number}, no step left: {_describe(request)}"
            )
        step = self._steps.popleft()
        return self._reply(step, number)

    @staticmethod
    async def _reply(step: Step, number: int) -> AsyncIterator[str | ModelReply]:
        for delta in step.deltas:
            if delta:
                yield delta
        if step.error is not None:
            raise step.error
        calls = [
            c if c.id else c.model_copy(update={"id": f"call_{number}_{i}"})
            for i, c in enumerate(step.calls)
        ]
        message = Message(role="assistant", content=step.content, tool_calls=calls)
        yield ModelReply(
            message=message,
            usage=step.usage if step.usage is not None else Usage(model_calls=1),
            finish_reason="tool_calls" if calls else "stop",
        )
