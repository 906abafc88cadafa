"""Retrying failed model calls: the real litellm adapter against the fake OpenAI server over a
socket, the policy's arithmetic, and the loop's events when a call is retried or cannot be."""

from __future__ import annotations

import asyncio
import random
import re
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from registry.errors import UserError
from registry.policy import ToolBag
from registry.settings import Settings
from registry.tools import ToolContext
from workers._litellm import LitellmModel
from workers.loop import LoopSetup, LoopState, run_loop
from workers.messages import Event, Message, TextDelta
from workers.model import (
    Model,
    ModelError,
    ModelReply,
    ModelRequest,
    RetryAbandoned,
    RetryingModel,
    RetryPolicy,
    ToolSpec,
)
from workers.testing.aio import collect
from workers.testing.fake_openai import FakeOpenAI
from workers.testing.scripted_model import ScriptedModel, fail, text

MODEL = "openai/gpt-4o-mini"
ANSWER = "The disk on db-1 is full: /var is at 100%."
#: Waits of a millisecond or so: the tests exercise real waits without being slow.
QUICK = RetryPolicy(retries=4, base_seconds=0.001, max_seconds=0.01)


class Waits(threading.Event):
    """A stop event that records each wait the retrying model asks of it and does not wait."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[float | None] = []

    async def pause(self, stop: threading.Event, seconds: float) -> bool:
        self.asked.append(seconds)
        return stop.is_set()


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


def adapter(server: FakeOpenAI, **options: Any) -> LitellmModel:
    return LitellmModel(api_base=server.base_url, api_key="sk-test", **options)


def ask(text: str = "why is db-1 slow?", tools: list[ToolSpec] | None = None) -> ModelRequest:
    return ModelRequest(MODEL, [Message(role="user", content=text)], tools or [])


def answered(*failures: dict[str, Any], times: int = 1) -> list[dict[str, Any]]:
    """Rules: each failure once (``times``), then the answer."""
    return [{"times": times, "fail": f} for f in failures] + [{"reply": {"content": ANSWER}}]


def split(items: list[str | ModelReply]) -> tuple[list[str], ModelReply]:
    *deltas, reply = items
    assert isinstance(reply, ModelReply)
    return [d for d in deltas if isinstance(d, str)], reply


# --- through the real adapter ------------------------------------------------------------------


def test_rate_limited_twice_then_answered(fake: FakeOpenAI) -> None:
    fake.set_script(answered({"status": 429, "retry_after": 0}, times=2))
    deltas, reply = split(collect(RetryingModel(adapter(fake), QUICK).stream(ask())))
    assert reply.message.content == ANSWER
    assert "".join(deltas) == ANSWER  # streamed once: the failed attempts streamed nothing
    assert len(fake.requests()) == 3


@pytest.mark.parametrize(
    ("failure", "cause"),
    [
        ({"status": 401}, "401 unauthorized"),
        ({"status": 400}, "400 bad request"),
        (
            {"status": 400, "message": "This model's maximum context length is 8192 tokens."},
            "context length exceeded",
        ),
    ],
)
def test_a_non_retryable_error_is_not_retried(
    fake: FakeOpenAI, failure: dict[str, Any], cause: str
) -> None:
    fake.set_script(answered(failure))
    waits = Waits()
    with pytest.raises(ModelError) as caught:
        collect(RetryingModel(adapter(fake), QUICK, stop=waits, pause=waits.pause).stream(ask()))
    error = caught.value
    assert not error.retryable and error.status == failure["status"]
    assert error.cause == cause
    assert "attempt" not in str(error)  # the provider's own error, unwrapped
    assert len(fake.requests()) == 1 and waits.asked == []


def test_exhausted_retries_name_every_attempt(fake: FakeOpenAI) -> None:
    fake.set_script(
        [
            {"times": 2, "fail": {"status": 429, "retry_after": 0}},
            {"times": 1, "fail": {"status": 503}},
            {"times": 1, "reply": {"content": "too late"}, "hold": "never"},  # a timeout
            {"times": 1, "fail": {"drop": "reset"}},
            {"reply": {"content": "never reached"}},
        ]
    )
    try:
        with pytest.raises(ModelError) as caught:
            collect(RetryingModel(adapter(fake, timeout=0.5), QUICK).stream(ask()))
    finally:
        fake.release("never")
    message = str(caught.value)
    assert re.search(
        r"call failed after 5 attempts over \d+\.\d s: 429 rate limited ×2, "
        r"503 service unavailable, timeout after 0\.5 s, connection reset; last error: ",
        message,
    ), message
    assert caught.value.retryable and caught.value.cause == "connection reset"
    assert len(fake.requests()) == 5


@pytest.mark.parametrize(
    ("how", "cause"), [("reset", "connection reset"), ("close", "connection closed")]
)
def test_a_dropped_connection_is_retried(fake: FakeOpenAI, how: str, cause: str) -> None:
    fake.set_script(answered({"drop": how}))
    _, reply = split(collect(RetryingModel(adapter(fake), QUICK).stream(ask())))
    assert reply.message.content == ANSWER
    assert len(fake.requests()) == 2
    # What the failed attempt was, as the adapter reports it.
    fake.set_script(answered({"drop": how}))
    with pytest.raises(ModelError) as caught:
        collect(adapter(fake).stream(ask()))
    assert caught.value.retryable and caught.value.cause.startswith(cause)


def test_retry_after_is_honoured_within_the_bound(fake: FakeOpenAI) -> None:
    fake.set_script(
        answered(
            {"status": 429, "retry_after": 7}, {"status": 503, "retry_after": 90}, {"status": 502}
        )
    )
    waits = Waits()
    policy = RetryPolicy(retries=4, base_seconds=0.5, max_seconds=30.0)
    _, reply = split(
        collect(RetryingModel(adapter(fake), policy, stop=waits, pause=waits.pause).stream(ask()))
    )
    assert reply.message.content == ANSWER
    first, second, third = waits.asked
    assert (first, second) == (7.0, 30.0)  # as asked; then capped at max_seconds
    assert third is not None and 0.0 <= third <= 0.5 * 2**2  # no Retry-After: the jittered draw
    assert len(fake.requests()) == 4


def test_stop_abandons_the_wait(fake: FakeOpenAI) -> None:
    fake.set_script([{"fail": {"status": 503}}])
    stop = threading.Event()
    stop.set()
    slow = RetryPolicy(retries=4, base_seconds=600.0, max_seconds=600.0)
    with pytest.raises(RetryAbandoned) as caught:
        collect(RetryingModel(adapter(fake), slow, stop=stop).stream(ask()))
    assert "after 1 attempt over" in str(caught.value)
    assert "503 service unavailable; retry abandoned: stop requested" in str(caught.value)
    assert len(fake.requests()) == 1


# --- streaming: never show a reply twice -------------------------------------------------------


def loop_setup() -> LoopSetup:
    return LoopSetup(
        session_id="s1",
        spawn_id="w1",
        model_id=MODEL,
        max_turns=3,
        reminder="Answer in en.",
        bag=ToolBag(entries=()),
        tool_context=ToolContext(session_id="s1", spawn_id="w1"),
    )


def run(model: Model) -> tuple[list[tuple[Event, int]], LoopState]:
    events: list[tuple[Event, int]] = []
    state = LoopState(messages=[Message(role="user", content="why is db-1 slow?")])
    asyncio.run(run_loop(loop_setup(), state, model, lambda e, i: events.append((e, i)), _ignore))
    return events, state


async def _ignore(state: LoopState) -> None:
    """A checkpoint that keeps nothing."""


def texts(events: list[tuple[Event, int]]) -> list[tuple[str, int]]:
    return [(e.text, i) for e, i in events if isinstance(e, TextDelta)]


def test_a_stream_cut_after_text_is_not_retried(fake: FakeOpenAI) -> None:
    fake.set_script(
        [
            {
                "times": 1,
                "reply": {"content": ANSWER},
                "fail": {"drop": "reset", "after_chunks": 3},
            },
            {"reply": {"content": "A second, different answer."}},
        ]
    )
    events: list[tuple[Event, int]] = []
    state = LoopState(messages=[Message(role="user", content="why is db-1 slow?")])
    model = RetryingModel(adapter(fake), QUICK)
    with pytest.raises(ModelError) as caught:
        asyncio.run(
            run_loop(loop_setup(), state, model, lambda e, i: events.append((e, i)), _ignore)
        )
    assert "not retried: part of the reply had already been streamed" in str(caught.value)
    # Cut mid-reply, a reset and a close look the same through litellm's aiohttp transport.
    assert caught.value.cause == "connection closed mid-reply"
    assert texts(events) == [("The ", 0), ("disk ", 1)]  # shown once, nothing after it
    assert len(fake.requests()) == 1


def test_a_stream_cut_before_any_text_is_retried(fake: FakeOpenAI) -> None:
    probe = {"name": "host_probe", "arguments": {"section": "disk"}}
    cut = {"drop": "close", "after_chunks": 2}  # the role chunk and the call's head
    fake.set_script(
        [
            {"times": 1, "reply": {"tool_calls": [probe]}, "fail": cut},
            {"reply": {"tool_calls": [probe]}},
        ]
    )
    tool = ToolSpec("host_probe", "Probe a host.", {"type": "object", "properties": {}})
    deltas, reply = split(collect(RetryingModel(adapter(fake), QUICK).stream(ask(tools=[tool]))))
    assert deltas == []
    assert [c.name for c in reply.message.tool_calls] == ["host_probe"]
    assert len(fake.requests()) == 2


def test_the_loop_sees_one_clean_stream_after_a_retry() -> None:
    error = ModelError(MODEL, "overloaded", status=529, retryable=True)
    inner = ScriptedModel([fail(error), text("All ", "good.")])
    waits = Waits()
    events, state = run(RetryingModel(inner, QUICK, stop=waits, pause=waits.pause))
    inner.assert_done()
    assert state.final == "All good."
    assert texts(events) == [("All ", 0), ("good.", 1)]
    assert len(inner.requests) == 2 and len(waits.asked) == 1


def test_a_scripted_failure_after_text_is_not_retried() -> None:
    error = ModelError(MODEL, "connection lost", retryable=True, cause="connection reset")
    inner = ScriptedModel([fail(error, after=("Half ",)), text("never used")])
    with pytest.raises(ModelError, match="after 1 attempt over .*: connection reset; not retried"):
        run(RetryingModel(inner, QUICK, stop=(w := Waits()), pause=w.pause))
    assert len(inner.remaining) == 1


def test_an_unchanged_error_when_nothing_was_retried() -> None:
    error = ModelError(MODEL, "bad request", status=400, retryable=False)
    with pytest.raises(ModelError) as caught:
        run(RetryingModel(ScriptedModel([fail(error)]), QUICK, stop=(w := Waits()), pause=w.pause))
    assert caught.value is error
    busy = ModelError(MODEL, "busy", status=503, retryable=True)
    off = RetryPolicy(retries=0)
    with pytest.raises(ModelError) as caught:
        run(RetryingModel(ScriptedModel([fail(busy)]), off, stop=(w := Waits()), pause=w.pause))
    assert caught.value is busy


def test_other_exceptions_pass_through_without_a_retry() -> None:
    inner = ScriptedModel([fail(RuntimeError("adapter bug")), text("never used")])
    with pytest.raises(RuntimeError, match="adapter bug"):
        run(RetryingModel(inner, QUICK, stop=(w := Waits()), pause=w.pause))
    assert len(inner.requests) == 1


# --- the policy ----------------------------------------------------------------------------------


def test_full_jitter_stays_within_its_ceiling() -> None:
    policy = RetryPolicy(retries=10, base_seconds=1.0, max_seconds=30.0)
    rng = random.Random(7)
    for retry in range(1, 9):
        ceiling = min(30.0, 2.0 ** (retry - 1))
        draws = [policy.delay(retry, None, rng) for _ in range(200)]
        assert all(0.0 <= d <= ceiling for d in draws), retry
        assert max(draws) > ceiling / 2 and min(draws) < ceiling / 2  # spread, not constant
    assert policy.delay(100_000, None, rng) <= 30.0  # no overflow for a huge retry number


def test_retry_after_replaces_the_draw_within_the_bound() -> None:
    policy = RetryPolicy(base_seconds=1.0, max_seconds=30.0)
    rng = random.Random(1)
    assert policy.delay(3, 12.5, rng) == 12.5
    assert policy.delay(1, 99.0, rng) == 30.0
    assert policy.delay(1, -5.0, rng) == 0.0


def test_the_policy_comes_from_the_settings() -> None:
    assert RetryPolicy.from_settings(Settings()) == RetryPolicy(4, 1.0, 30.0)
    env = {
        "ONGRID_MODEL_RETRIES": "2",
        "ONGRID_MODEL_RETRY_BASE_SECONDS": "0.25",
        "ONGRID_MODEL_RETRY_MAX_SECONDS": "5",
    }
    assert RetryPolicy.from_settings(Settings.load(environ=env)) == RetryPolicy(2, 0.25, 5.0)


@pytest.mark.parametrize(
    ("variable", "value", "field"),
    [
        ("ONGRID_MODEL_RETRIES", "-1", "model_retries"),
        ("ONGRID_MODEL_RETRIES", "many", "model_retries"),
        ("ONGRID_MODEL_RETRY_BASE_SECONDS", "-0.5", "model_retry_base_seconds"),
        ("ONGRID_MODEL_RETRY_MAX_SECONDS", "soon", "model_retry_max_seconds"),
    ],
)
def test_bad_retry_settings_name_the_field(variable: str, value: str, field: str) -> None:
    with pytest.raises(UserError, match=f"invalid settings: {field}: "):
        Settings.load(environ={variable: value})


def test_a_model_that_fails_before_streaming_is_retried_too() -> None:
    """An adapter may raise from ``stream`` itself rather than from the stream it returns."""

    class Eager:
        def __init__(self) -> None:
            self.inner = ScriptedModel(["fine"])
            self.calls = 0

        def stream(self, request: ModelRequest) -> AsyncIterator[str | ModelReply]:
            self.calls += 1
            if self.calls == 1:
                raise ModelError(MODEL, "busy", status=503, retryable=True)
            return self.inner.stream(request)

    eager = Eager()
    _, state = run(RetryingModel(eager, QUICK, stop=(w := Waits()), pause=w.pause))
    assert state.final == "fine" and eager.calls == 2
