"""The context policy in the run loop: a long investigation kept inside its model's window.

The model here is an in-process investigator that reads a log window by window, counts its
prompt as the fake provider servers do, and refuses a prompt over its window with the
provider's "prompt is too long" error; it is the loop, the policy and the stored results under
test. The same investigation runs through litellm's real adapters against the fake Anthropic
server in ``tests/integration/test_long_investigation.py``.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from registry.persona import PermissionMode, Persona
from registry.policy import ToolBag, resolve_bag
from registry.tools import ToolCatalog, ToolClass, ToolContext, function_tool
from workers import context as ctx
from workers.context import ContextExhausted, ContextPolicy, MemoryResults, StoredResult, Window
from workers.loop import LoopSetup, LoopState, Outcome, run_loop
from workers.messages import (
    ContextCompacted,
    Event,
    Message,
    ToolCall,
    ToolResultEvent,
    Usage,
)
from workers.model import ModelError, ModelReply, ModelRequest

SYSTEM = "You are a log investigator. " * 20
QUESTION = "Find when the disk of db-1 started to fill, window by window."
REMINDER = "Answer in en-GB."
WINDOW_CHARS = 16_000


def log_window(n: int) -> str:
    """About 16 KB of log lines for window ``n``; window 17 holds the culprit."""
    lines = []
    for i in range(WINDOW_CHARS // 80):
        event = "ERROR disk /var 100% full" if n == 17 and i == 100 else "INFO request ok"
        line = f"2026-12-01T{n:02d}:{i % 60:02d}:00Z db-1 pid={1000 + i} {event} {i:05d}"
        lines.append(line.ljust(79, "."))
    return "\n".join(lines)[:WINDOW_CHARS]


@dataclass
class Tools:
    read: list[int] = field(default_factory=list)

    def bag(self) -> ToolBag:
        log = self.read

        @function_tool(ToolClass.READ)
        def read_log(window: int) -> str:
            """Read one window of the db-1 log."""
            log.append(window)
            return log_window(window)

        persona = Persona(
            name="investigator",
            description="Reads logs.",
            when_to_use="In tests.",
            permission_mode=PermissionMode.READ_ONLY,
        )
        return resolve_bag(persona, ToolCatalog([read_log]), ["*"])


def prompt_tokens(request: ModelRequest) -> int:
    """Counted as the fake provider servers count: a quarter of the characters."""
    chars = sum(
        len(m.content) + sum(len(c.arguments) for c in m.tool_calls) for m in request.messages
    )
    chars += sum(len(t.description) + len(json.dumps(t.parameters)) for t in request.tools)
    return math.ceil(chars / 4)


_LAST = re.compile(r"last window read: (\d+)")


@dataclass
class Investigator:
    """Asks for window 1, 2, … ``windows`` (one call a turn), then answers; writes a ledger
    when asked for one; refuses a prompt over ``window_tokens`` as Anthropic does."""

    windows: int
    window_tokens: int
    requests: list[ModelRequest] = field(default_factory=list)
    ledgers: int = 0
    crash_on_ledger: bool = False

    def _read_so_far(self, request: ModelRequest) -> int:
        seen = [0]
        for message in request.messages:
            for call in message.tool_calls:
                if call.name == "read_log":
                    seen.append(json.loads(call.arguments)["window"])
            seen += [int(n) for n in _LAST.findall(message.content)]
        return max(seen)

    async def stream(self, request: ModelRequest) -> AsyncIterator[str | ModelReply]:
        tokens = prompt_tokens(request)
        self.requests.append(request)
        if tokens + (request.max_tokens or 0) > self.window_tokens:
            error = ModelError(
                request.model,
                f"prompt is too long: {tokens} tokens > {self.window_tokens} maximum",
                status=400,
                retryable=False,
                cause="context length exceeded",
            )
            error.context_exceeded = True  # type: ignore[attr-defined]
            raise error
        usage = Usage(
            prompt_tokens=tokens, completion_tokens=50, total_tokens=tokens + 50, model_calls=1
        )
        last = request.messages[-1].content
        done = self._read_so_far(request)
        if "investigation ledger" in last:
            if self.crash_on_ledger:
                self.crash_on_ledger = False
                raise RuntimeError("worker killed during the compaction")
            self.ledgers += 1
            text = (
                f"## Question\n{QUESTION}\n## Evidence\n- read_log(window=17): ERROR disk /var "
                f"100% full\n## Next steps\nread the next window\nlast window read: {done}"
            )
            yield ModelReply(message=Message(role="assistant", content=text), usage=usage)
            return
        if done >= self.windows:
            text = f"Read {done} windows: /var on db-1 filled in window 17."
            yield text
            yield ModelReply(message=Message(role="assistant", content=text), usage=usage)
            return
        call = ToolCall(
            id=f"call_{done + 1}", name="read_log", arguments=json.dumps({"window": done + 1})
        )
        message = Message(role="assistant", content="", tool_calls=[call])
        yield ModelReply(message=message, usage=usage, finish_reason="tool_calls")


@dataclass
class Run:
    tools: Tools = field(default_factory=Tools)
    window: Window = field(default_factory=lambda: Window(60_000, 8_192))
    reply_tokens: int = 4_096
    results: MemoryResults = field(default_factory=MemoryResults)
    events: list[tuple[Event, int]] = field(default_factory=list)
    saved: list[LoopState] = field(default_factory=list)
    max_turns: int = 100

    def policy(self) -> ContextPolicy:
        return ContextPolicy(window=self.window, store=self.results, reply_tokens=self.reply_tokens)

    def setup(self) -> LoopSetup:
        return LoopSetup(
            session_id="s1",
            spawn_id="w1",
            model_id="anthropic/claude-test",
            max_turns=self.max_turns,
            reminder=REMINDER,
            bag=self.tools.bag(),
            tool_context=ToolContext(session_id="s1", spawn_id="w1", user="bob", role="admin"),
            context=self.policy(),
        )

    def __call__(self, model: Any, state: LoopState | None = None) -> tuple[Outcome, LoopState]:
        state = state or LoopState(
            messages=[
                Message(role="system", content=SYSTEM),
                Message(role="user", content=QUESTION),
            ]
        )

        async def save(saved: LoopState) -> None:
            self.saved.append(saved.model_copy(deep=True))

        outcome = asyncio.run(
            run_loop(self.setup(), state, model, lambda e, i: self.events.append((e, i)), save)
        )
        return outcome, state

    def of(self, kind: type) -> list[Any]:
        return [e for e, _ in self.events if isinstance(e, kind)]


def test_a_thirty_window_investigation_finishes_inside_a_60k_window() -> None:
    run = Run()
    model = Investigator(windows=30, window_tokens=60_000)
    outcome, state = run(model)
    assert outcome == Outcome("final", "Read 30 windows: /var on db-1 filled in window 17.")
    assert run.tools.read == list(range(1, 31))  # each window read once, in order
    for request in model.requests:
        assert request.max_tokens is not None
        assert prompt_tokens(request) + request.max_tokens <= 60_000
    # Every result is stored whole and the transcript has each whole too.
    assert set(run.results.results) == {f"call_{n}" for n in range(1, 31)}
    assert run.results.results["call_17"] == log_window(17)
    assert [e.content for e in run.of(ToolResultEvent)] == [log_window(n) for n in range(1, 31)]
    # The turns are the investigation's model calls; a ledger call is not one.
    assert state.turns == 31
    assert state.usage.model_calls == 31 + model.ledgers


def test_older_results_shrink_to_a_preview_the_model_can_read_back() -> None:
    run = Run()
    outcome, state = run(Investigator(windows=12, window_tokens=60_000))
    assert outcome.kind == "final"
    tool_messages = [m for m in state.messages if m.role == "tool"]
    shrunk = [m for m in tool_messages if m.content.startswith("[stored result")]
    whole = [m for m in tool_messages if m.content == log_window(int(m.tool_call_id[5:]))]
    assert shrunk and whole
    # The older results shrank, the latest are whole.
    assert tool_messages[-len(whole) :] == whole
    first = shrunk[0]
    assert first.content.endswith(log_window(int(first.tool_call_id[5:]))[-500:])
    assert state.stored[first.tool_call_id].chars == len(log_window(3)) > 15_000

    async def read(arguments: dict[str, Any]) -> tuple[str, bool]:
        return await ctx.read_stored(run.results, state.stored, json.dumps(arguments))

    content, error = asyncio.run(read({"ref": "call_3", "offset": 8000, "length": 100}))
    assert not error and content.endswith(log_window(3)[8000:8100])
    content, error = asyncio.run(read({"ref": "call_3", "grep": "pid=1042 "}))
    assert not error and content.splitlines()[1].startswith("43: 2026-12-01T03")
    content, error = asyncio.run(read({"ref": "call_99"}))
    assert error and "no stored result 'call_99'" in content


def test_compaction_replaces_old_turns_with_a_ledger_and_keeps_the_opening() -> None:
    run = Run(window=Window(20_000, 8_192), reply_tokens=2_048)
    model = Investigator(windows=30, window_tokens=20_000)
    outcome, state = run(model)
    assert outcome.kind == "final"
    assert run.tools.read == list(range(1, 31))
    compactions = run.of(ContextCompacted)
    assert compactions and model.ledgers == len(compactions) == len(state.compactions)
    assert [c.number for c in compactions] == list(range(1, len(compactions) + 1))
    assert all(c.tokens_after < c.tokens_before for c in compactions)
    after = [r for r in model.requests if "<investigation-ledger" in r.messages[2].content]
    assert after
    for request in after:
        assert request.messages[0].content == SYSTEM
        assert request.messages[1].content == QUESTION
        assert "<system-reminder>" in request.messages[-1].content or (
            "investigation ledger" in request.messages[-1].content
        )
        assert prompt_tokens(request) + (request.max_tokens or 0) <= 20_000
    assert ctx.last_ledger(state.messages).startswith("## Question")
    assert state.turns == 31


def test_a_refusal_as_too_long_compacts_and_retries_once() -> None:
    # The policy believes the window is 60k; the provider's is 25k.
    run = Run(window=Window(60_000, 8_192), reply_tokens=2_048)
    model = Investigator(windows=10, window_tokens=25_000)
    outcome, state = run(model)
    assert outcome.kind == "final"
    assert run.tools.read == list(range(1, 11))
    refused = [r for r in model.requests if prompt_tokens(r) + (r.max_tokens or 0) > 25_000]
    assert refused  # the provider did refuse, and the loop did not fail on it
    compactions = run.of(ContextCompacted)
    assert any("refused" in c.reason for c in compactions)
    assert state.chars_per_token > 0


def test_a_conversation_that_cannot_fit_ends_like_a_reached_budget() -> None:
    run = Run(window=Window(4_000, 1_024), reply_tokens=1_024)
    state = LoopState(
        messages=[
            Message(role="system", content="x" * 40_000),
            Message(role="user", content=QUESTION),
        ]
    )
    with pytest.raises(ContextExhausted) as caught:
        run(Investigator(windows=3, window_tokens=4_000), state)
    assert caught.value.window == 4_000 and caught.value.tokens > 4_000


def test_a_crash_during_compaction_resumes_without_losing_or_redoing_work() -> None:
    run = Run(window=Window(20_000, 8_192), reply_tokens=2_048)
    model = Investigator(windows=20, window_tokens=20_000, crash_on_ledger=True)
    with pytest.raises(RuntimeError, match="killed during the compaction"):
        run(model)
    before = run.saved[-1].model_copy(deep=True)
    assert not before.compactions and not run.of(ContextCompacted)
    read_before = list(run.tools.read)
    # A new attempt resumes from the last checkpoint, as a worker does after a crash.
    outcome, state = run(model, before)
    assert outcome.kind == "final"
    assert run.tools.read == read_before + list(range(len(read_before) + 1, 21))
    assert len(run.of(ContextCompacted)) == len(state.compactions) >= 1
    assert state.turns == 21  # the guards counted across the crash and the compaction


def test_requests_carry_the_reply_limit_the_cache_key_and_the_stable_prefix() -> None:
    run = Run()
    model = Investigator(windows=2, window_tokens=60_000)
    run(model)
    first, second = model.requests[:2]
    assert first.max_tokens == second.max_tokens == 4_096
    assert first.cache_key == "w1"
    # Everything but the trailing reminder is sent again by the next call.
    assert first.stable == len(first.messages) - 1
    assert second.messages[: first.stable] == first.messages[: first.stable]
    assert "<system-reminder>" in first.messages[-1].content


def test_estimates_are_calibrated_by_the_providers_counts() -> None:
    run = Run()
    _, state = run(Investigator(windows=3, window_tokens=60_000))
    assert 3.5 < state.chars_per_token < 4.5  # the investigator counts 4 characters a token


def test_preview_and_figures() -> None:
    text = "a" * 5000 + "b" * 5000
    short = ctx.preview(text, "call_1", 100, 50)
    assert short.startswith("[stored result call_1: 10,000 characters, 1 lines.")
    assert "a" * 100 + "\n[… 9,850 characters not shown …]\n" + "b" * 50 in short
    assert ctx.preview("small", "call_1", 100, 50) == "small"
    assert ctx.exceeded_figures("prompt is too long: 60,396 tokens > 60000 maximum") == (
        60_396,
        60_000,
    )
    openai = (
        "This model's maximum context length is 128000 tokens. However, your messages "
        "resulted in 130532 tokens. Please reduce the length of the messages."
    )
    assert ctx.exceeded_figures(openai) == (130_532, 128_000)
    with_reply = (
        "This model's maximum context length is 50 tokens. However, you requested 72 tokens "
        "(62 in the messages, 10 in the completion)."
    )
    assert ctx.exceeded_figures(with_reply) == (62, 50)
    anthropic_sum = (
        "input length and `max_tokens` exceed context limit: 188240 + 21333 > 200000, "
        "decrease input length or `max_tokens` and try again"
    )
    assert ctx.exceeded_figures(anthropic_sum) == (188_240, 200_000)
    assert ctx.exceeded_figures("bad request") is None


def test_the_first_shrinkable_message_is_the_first_stored_result_not_yet_shrunk() -> None:
    messages = [
        Message(role="system", content="s"),
        Message(role="user", content="u"),
        Message(role="assistant", content=""),
        Message(role="tool", content="small", tool_call_id="a"),
        Message(role="assistant", content=""),
        Message(role="tool", content="big", tool_call_id="b"),
        Message(role="assistant", content=""),
        Message(role="tool", content="big", tool_call_id="c"),
    ]
    stored = {"b": StoredResult(chars=9, lines=1, shrunk=True), "c": StoredResult(chars=9, lines=1)}
    assert ctx.first_shrinkable(messages, stored) == 7
    stored["c"].shrunk = True
    assert ctx.first_shrinkable(messages, stored) == 0
