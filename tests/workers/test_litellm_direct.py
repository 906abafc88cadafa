"""The direct path of a reply asked for in one piece (workers._litellm_direct) against litellm's
full ``acompletion``: the same request on the wire, the same reply, the same failures.

Both run over a socket against the fake OpenAI server through litellm's real OpenAI adapter; the
full path is taken by switching the direct route off.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from workers import _litellm_direct as direct
from workers._litellm import _CALLBACK_LISTS, LitellmModel, load
from workers.messages import Message, ToolCall
from workers.model import ModelError, ModelReply, ModelRequest, ToolSpec
from workers.testing.aio import collect
from workers.testing.fake_openai import FakeOpenAI

litellm = load()

MODEL = "openai/gpt-4o-mini"
PROBE = ToolSpec(
    "host_probe",
    "Probe a host.",
    {"type": "object", "properties": {"host": {"type": "string"}}, "required": ["host"]},
)
RULES: list[dict[str, Any]] = [
    {"match": "rate me", "fail": {"status": 429, "retry_after": 7}},
    {"match": "too long", "fail": {"status": 400}},
    {
        "match": "check db-1",
        "where": "last_user",
        "reply": {
            "content": "Probing.",
            "tool_calls": [
                {"name": "host_probe", "arguments": {"host": "db-1"}},
                {"name": "host_probe", "arguments": {"host": "db-2"}},
            ],
        },
    },
    {"match": "", "reply": {"content": "db-1's /var is full."}},
]
SYSTEM = Message(role="system", content="You investigate hosts.")
ASKED = Message(role="user", content="check db-1")
CALLED = Message(
    role="assistant",
    content="Probing.",
    tool_calls=[ToolCall(id="call_1", name="host_probe", arguments='{"host": "db-1"}')],
)
ANSWERED = Message(role="tool", content="disk 100%", tool_call_id="call_1", name="host_probe")

#: The requests compared: text only; tools offered; a tool call and its result in the history;
#: a reply limit and OpenAI's cache key.
REQUESTS = {
    "text": ModelRequest(MODEL, [SYSTEM, Message(role="user", content="hello")], stream=False),
    "tools": ModelRequest(MODEL, [SYSTEM, ASKED], tools=[PROBE], stream=False),
    "history": ModelRequest(MODEL, [SYSTEM, ASKED, CALLED, ANSWERED], [PROBE], stream=False),
    "limit_and_key": ModelRequest(
        MODEL,
        [SYSTEM, ASKED],
        [PROBE],
        max_tokens=321,
        cache_key="spawn-1",
        stable=2,
        stream=False,
    ),
}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAI]:
    with FakeOpenAI(RULES) as server:
        monkeypatch.setenv("OPENAI_API_BASE", server.base_url)
        monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
        yield server


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The models each direct call was made for (the full path adds nothing)."""
    calls: list[str] = []
    complete = direct.complete

    async def counted(litellm: Any, chosen: direct.DirectRoute, **kwargs: Any) -> Any:
        calls.append(chosen.model)
        return await complete(litellm, chosen, **kwargs)

    monkeypatch.setattr(direct, "complete", counted)
    return calls


def full_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(direct, "route", lambda *args: None)


def reply_to(request: ModelRequest, key: str = "sk-direct") -> ModelReply:
    item = collect(LitellmModel(api_key=key).stream(request))[-1]
    assert isinstance(item, ModelReply)
    return item


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_the_same_request_and_the_same_reply_either_way(
    fake: FakeOpenAI, taken: list[str], monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    request = REQUESTS[name]
    quick = reply_to(request)
    assert taken == ["gpt-4o-mini"]
    with monkeypatch.context() as patched:
        full_path(patched)
        slow = reply_to(request)
    assert taken == ["gpt-4o-mini"]  # the second call did not go the direct way
    sent_direct, sent_full = fake.requests()
    assert sent_direct == sent_full
    assert "stream" not in sent_direct or sent_direct["stream"] is False
    assert quick == slow
    assert quick.usage.total_tokens > 0 and quick.usage.cost > 0
    if name == "tools":
        assert [c.name for c in quick.message.tool_calls] == ["host_probe", "host_probe"]
        assert json.loads(quick.message.tool_calls[1].arguments) == {"host": "db-2"}


def test_the_key_reaches_the_provider(fake: FakeOpenAI, taken: list[str]) -> None:
    import hashlib

    reply_to(REQUESTS["text"], key="sk-secret-1")
    assert taken and fake.key_digests() == [hashlib.sha256(b"sk-secret-1").hexdigest()]


def failure(request: ModelRequest) -> ModelError:
    with pytest.raises(ModelError) as caught:
        reply_to(request)
    return caught.value


def asking(text: str) -> ModelRequest:
    return ModelRequest(MODEL, [SYSTEM, Message(role="user", content=text)], stream=False)


def failures_either_way(
    text: str, taken: list[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[ModelError, ModelError]:
    """The failure of asking ``text`` the direct way, then the full way."""
    quick = failure(asking(text))
    assert taken
    full_path(monkeypatch)
    return quick, failure(asking(text))


def test_a_rate_limit_says_how_long_to_wait_either_way(
    fake: FakeOpenAI, taken: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    quick, slow = failures_either_way("rate me", taken, monkeypatch)
    for error in (quick, slow):
        assert (error.status, error.retryable, error.retry_after) == (429, True, 7.0)
    assert str(quick) == str(slow)


def test_a_refusal_is_the_same_error_either_way(
    fake: FakeOpenAI, taken: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    quick, slow = failures_either_way("too long", taken, monkeypatch)
    assert (quick.status, quick.retryable, quick.cause) == (400, False, "400 bad request")
    assert str(quick) == str(slow)


def test_a_registered_callback_or_sdk_retries_take_the_full_path(
    fake: FakeOpenAI, taken: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from litellm.integrations.custom_logger import CustomLogger

    class Recorder(CustomLogger):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.logged = threading.Event()

        async def async_log_success_event(self, *_: Any, **__: Any) -> None:
            self.logged.set()

    reply = collect(LitellmModel(api_key="k", max_retries=2).stream(asking("hi")))[-1]
    assert isinstance(reply, ModelReply) and taken == []
    # litellm files a callback into its other lists in place: it gets copies of them, and the
    # lists it had come back untouched after the test.
    for name in _CALLBACK_LISTS:
        monkeypatch.setattr(litellm, name, list(getattr(litellm, name)))
    recorder = Recorder()
    litellm.callbacks.append(recorder)

    async def logged_call() -> None:
        items = [item async for item in LitellmModel(api_key="k").stream(asking("hi"))]
        assert isinstance(items[-1], ModelReply)
        # litellm logs on a task of its own after the call returns: the callback hears of it
        # (bounded), and nothing of this call is left to log once the callback is gone.
        for _ in range(400):
            if recorder.logged.is_set():
                return
            await asyncio.sleep(0.025)

    asyncio.run(logged_call())
    assert taken == [] and recorder.logged.is_set()


def test_other_providers_take_the_full_path() -> None:
    assert direct.route(litellm, "anthropic/claude-sonnet-4-5", None) is None
    assert direct.route(litellm, "nobody/knows-this", None) is None
    chosen = direct.route(litellm, MODEL, None)
    assert chosen is not None and (chosen.provider, chosen.model) == ("openai", "gpt-4o-mini")
