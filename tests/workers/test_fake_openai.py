"""The fake OpenAI server, driven for real through litellm over a socket."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

# Before importing litellm: otherwise it fetches its model cost map from the network on import.
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"

import litellm  # noqa: E402

from workers.testing.fake_openai import DEFAULT_REPLY, FakeOpenAI, start_subprocess  # noqa: E402

# Warnings litellm itself triggers (filterwarnings=error is on), filtered here only:
# - its lazily imported TypedDicts (github_copilot auth, ChatCompletionThinkingBlock, ...) use
#   `ReadOnly`, and building pydantic TypeAdapters over them warns; pydantic raises it, so it can
#   only be matched by message;
# - with stream_options.include_usage, its usage-chunk emptiness check reads `model_fields` on an
#   instance (litellm/litellm_core_utils/model_response_utils.py).
pytestmark = [
    pytest.mark.filterwarnings(
        "ignore:Items? .* on TypedDict class .* (is|are) using the `ReadOnly` qualifier:UserWarning"
    ),
    pytest.mark.filterwarnings(
        "ignore:Accessing the 'model_(computed_)?fields' attribute on the instance is deprecated"
        ":pydantic.warnings.PydanticDeprecatedSince211:litellm.litellm_core_utils.model_response_utils"
    ),
]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "host_probe",
            "description": "Probe a host.",
            "parameters": {
                "type": "object",
                "properties": {"host": {"type": "string"}, "checks": {"type": "array"}},
                "required": ["host"],
            },
        },
    }
]
POEM = "roses are red, db is dead"
PROBE_ARGS = {"host": "db-1.prod", "checks": ["disk", "memory", "load"]}
RULES: list[dict[str, Any]] = [
    {"match": "tool result", "turn": 1, "reply": {"content": "The disk on db-1 is full."}},
    {
        "match": "check the disk",
        "where": "last_user",
        "reply": {"tool_calls": [{"name": "host_probe", "arguments": PROBE_ARGS}]},
    },
    {"match": "you are a poet", "where": "system", "reply": {"content": POEM}},
    {"match": "repeat after me", "reply": {"echo": True}},
]


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(RULES) as server:
        yield server


def complete(server_url: str, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
    return litellm.completion(
        model="openai/fake",
        api_base=server_url,
        api_key="sk-test",
        messages=messages,
        tools=TOOLS,
        **kwargs,
    )


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "You investigate."}, {"role": "user", "content": text}]


def test_plain_reply_with_usage(fake: FakeOpenAI) -> None:
    messages = [{"role": "system", "content": "you are a poet"}, {"role": "user", "content": "hi"}]
    response = complete(fake.base_url, messages, stream=False)
    choice = response.choices[0]
    assert choice.message.content == POEM
    assert choice.finish_reason == "stop"
    assert not choice.message.tool_calls
    assert response.usage.prompt_tokens == 5
    assert response.usage.completion_tokens == 6
    assert response.usage.total_tokens == 11
    assert response.model.endswith("fake")


def test_tool_call(fake: FakeOpenAI) -> None:
    response = complete(fake.base_url, user("please check the disk on db-1"), stream=False)
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.id == "call_0_0"
    assert call.function.name == "host_probe"
    assert json.loads(call.function.arguments) == PROBE_ARGS


def test_streamed_text_arrives_in_several_deltas(fake: FakeOpenAI) -> None:
    messages = [{"role": "system", "content": "you are a poet"}, {"role": "user", "content": "hi"}]
    chunks = list(complete(fake.base_url, messages, stream=True))
    deltas = [c.choices[0].delta.content for c in chunks if c.choices]
    deltas = [d for d in deltas if d]
    assert len(deltas) > 3
    assert "".join(deltas) == POEM
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


def test_streamed_tool_call_reassembles(fake: FakeOpenAI) -> None:
    stream = complete(
        fake.base_url,
        user("check the disk"),
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    fragments = [
        call.function.arguments
        for c in chunks
        if c.choices and c.choices[0].delta.tool_calls
        for call in c.choices[0].delta.tool_calls
        if call.function.arguments
    ]
    assert len(fragments) > 1  # the arguments really were streamed in pieces

    built: Any = litellm.stream_chunk_builder(chunks)  # its union return type is not narrowable
    assert built is not None
    choice = built.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert (call.id, call.function.name) == ("call_0_0", "host_probe")
    assert json.loads(call.function.arguments) == PROBE_ARGS
    assert built.usage.prompt_tokens == 5  # "You investigate." + "check the disk"


def test_rule_matched_by_turn(fake: FakeOpenAI) -> None:
    conversation = user("check the disk") + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_0_0",
                    "type": "function",
                    "function": {"name": "host_probe", "arguments": json.dumps(PROBE_ARGS)},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_0_0", "content": "tool result: /var 100% full"},
    ]
    response = complete(fake.base_url, conversation, stream=False)
    assert response.choices[0].message.content == "The disk on db-1 is full."
    # The same text on turn 0 does not match the turn-1 rule.
    response = complete(fake.base_url, user("tool result"), stream=False)
    assert response.choices[0].message.content == DEFAULT_REPLY


def test_echo_default_and_request_record(fake: FakeOpenAI) -> None:
    echoed = complete(fake.base_url, user("repeat after me: sudo df -h"), stream=False)
    assert echoed.choices[0].message.content == "repeat after me: sudo df -h"
    fallback = complete(fake.base_url, user("what is the weather"), stream=False)
    assert fallback.choices[0].message.content == DEFAULT_REPLY

    recorded = fake.requests()
    assert [r["messages"][-1]["content"] for r in recorded] == [
        "repeat after me: sudo df -h",
        "what is the weather",
    ]
    assert recorded[0]["model"] == "fake"
    assert recorded[0]["tools"][0]["function"]["name"] == "host_probe"

    root = fake.base_url.removesuffix("/v1")
    assert httpx.get(f"{root}/_requests").json() == recorded
    httpx.post(f"{root}/_script", json=[{"reply": {"content": "scripted over HTTP"}}])
    again = complete(fake.base_url, user("anything"), stream=False)
    assert again.choices[0].message.content == "scripted over HTTP"
    assert httpx.post(f"{root}/_reset").status_code == 200
    assert fake.requests() == []
    assert httpx.get(f"{fake.base_url}/models").json()["data"][0]["id"] == "fake"
    unversioned = httpx.post(f"{root}/chat/completions", json={"messages": user("x")}).json()
    assert unversioned["choices"][0]["message"]["content"] == DEFAULT_REPLY


def test_subprocess_reloads_a_rewritten_script(tmp_path: Path) -> None:
    script = tmp_path / "script.yaml"
    script.write_text("- match: ping\n  reply: {content: first}\n")
    proc, base_url = start_subprocess(script)
    try:
        assert complete(base_url, user("ping"), stream=False).choices[0].message.content == "first"
        script.write_text(json.dumps([{"match": "ping", "reply": {"content": "second, longer"}}]))
        second = complete(base_url, user("ping"), stream=False)
        assert second.choices[0].message.content == "second, longer"
        recorded = httpx.get(f"{base_url.removesuffix('/v1')}/_requests").json()
        assert len(recorded) == 2
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_holds_many_slow_requests_at_once() -> None:
    """50 requests are all in the server at the same time: each is held until the test has seen
    all 50 arrive, which a server answering one at a time would never let happen."""
    rules = [{"match": "", "reply": {"content": "done"}, "hold": "gate"}]
    with FakeOpenAI(rules) as server, ThreadPoolExecutor(max_workers=50) as pool:
        replies = pool.map(
            lambda i: complete(server.base_url, user(f"request {i}"), stream=False), range(50)
        )
        deadline = time.monotonic() + 60
        while len(server.requests()) < 50:
            assert time.monotonic() < deadline, (
                f"only {len(server.requests())} of 50 requests reached the server at once"
            )
            time.sleep(0.02)
        server.release("gate")
        answers = [r.choices[0].message.content for r in replies]
    assert answers == ["done"] * 50


# --- scripted failures ---------------------------------------------------------------------------


def chat(server: FakeOpenAI, text: str = "hi", **body: Any) -> httpx.Response:
    payload = {"model": "fake", "messages": user(text), **body}
    return httpx.post(f"{server.base_url}/chat/completions", json=payload, timeout=30)


def test_times_answers_that_many_requests_then_falls_through() -> None:
    rules = [
        {"match": "disk", "times": 2, "reply": {"content": "first two"}},
        {"match": "disk", "reply": {"content": "the rest"}},
    ]
    with FakeOpenAI(rules) as server:
        answers = [chat(server, "disk?").json()["choices"][0]["message"]["content"] for _ in "abc"]
        assert answers == ["first two", "first two", "the rest"]
        # A request the rule does not match does not use it up; new rules start afresh.
        server.set_script(rules)
        assert chat(server, "cpu?").json()["choices"][0]["message"]["content"] == DEFAULT_REPLY
        assert chat(server, "disk?").json()["choices"][0]["message"]["content"] == "first two"


def test_an_error_status_with_retry_after_then_an_answer() -> None:
    rules = [
        {"times": 2, "fail": {"status": 429, "retry_after": 7}},
        {"times": 1, "fail": {"status": 503, "message": "overloaded, try later"}},
        {"reply": {"content": "finally"}},
    ]
    with FakeOpenAI(rules) as server:
        first, second, third = (chat(server) for _ in range(3))
        assert first.status_code == second.status_code == 429
        assert first.headers["retry-after"] == "7"
        assert first.json()["error"]["message"] == "rate limit exceeded"
        assert third.status_code == 503 and "retry-after" not in third.headers
        assert third.json()["error"]["message"] == "overloaded, try later"
        # litellm reads the error as the provider's: a rate limit, then the answer.
        answer = complete(server.base_url, user("hi"), stream=False)
        assert answer.choices[0].message.content == "finally"
        assert len(server.requests()) == 4


def test_error_status_of_a_streamed_request() -> None:
    rules = [{"fail": {"status": 500}}]
    with FakeOpenAI(rules) as server, pytest.raises(litellm.exceptions.InternalServerError):
        list(complete(server.base_url, user("hi"), stream=True, max_retries=0))


@pytest.mark.parametrize(
    ("how", "error"), [("close", httpx.RemoteProtocolError), ("reset", httpx.ReadError)]
)
def test_drop_closes_the_connection_without_a_response(how: str, error: type) -> None:
    rules = [{"times": 1, "fail": {"drop": how}}, {"reply": {"content": "back"}}]
    with FakeOpenAI(rules) as server:
        with pytest.raises(error) as caught:
            chat(server)
        if how == "reset":
            assert "reset" in str(caught.value).lower()
        assert chat(server).json()["choices"][0]["message"]["content"] == "back"
        assert len(server.requests()) == 2


def streamed_words(server: FakeOpenAI, seen: list[str]) -> None:
    """Read a streamed reply's text deltas into ``seen`` as they arrive."""
    payload = {"model": "fake", "messages": user("hi"), "stream": True}
    with httpx.stream("POST", f"{server.base_url}/chat/completions", json=payload) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line.removeprefix("data: "))["choices"]:
                    if choice["delta"].get("content"):
                        seen.append(choice["delta"]["content"])


@pytest.mark.parametrize(
    ("how", "error"), [("close", httpx.RemoteProtocolError), ("reset", httpx.ReadError)]
)
def test_drop_after_chunks_cuts_a_stream_short(how: str, error: type) -> None:
    rules = [
        {"times": 1, "reply": {"content": POEM}, "fail": {"drop": how, "after_chunks": 3}},
        {"reply": {"content": POEM}},
    ]
    with FakeOpenAI(rules) as server:
        seen: list[str] = []
        with pytest.raises(error):
            streamed_words(server, seen)
        assert seen == ["roses ", "are "]  # the role chunk, then two words, then the drop
        whole: list[str] = []
        streamed_words(server, whole)
        assert "".join(whole) == POEM


def test_a_non_streamed_request_is_dropped_before_the_reply() -> None:
    rules = [{"reply": {"content": POEM}, "fail": {"drop": "close", "after_chunks": 3}}]
    with FakeOpenAI(rules) as server, pytest.raises(httpx.RemoteProtocolError):
        chat(server)


@pytest.mark.parametrize(
    ("rule", "problem"),
    [
        ({"match": "x"}, "a rule needs a reply or a fail"),
        ({"fail": {}}, "exactly one of status or drop"),
        ({"fail": {"status": 429, "drop": "reset"}}, "exactly one of status or drop"),
        ({"fail": {"drop": "reset", "retry_after": 1}}, "retry_after needs status"),
        ({"fail": {"status": 503, "after_chunks": 2}}, "after_chunks needs drop"),
        ({"fail": {"status": 200}}, "greater than or equal to 400"),
        ({"fail": {"drop": "explode"}}, "'close' or 'reset'"),
        ({"times": 0, "reply": {"content": "x"}}, "greater than or equal to 1"),
    ],
)
def test_invalid_failure_rules_are_refused(rule: dict[str, Any], problem: str) -> None:
    with FakeOpenAI() as server:
        root = server.base_url.removesuffix("/v1")
        refused = httpx.post(f"{root}/_script", json=[rule])
        assert refused.status_code == 500
        assert problem in refused.json()["error"]["message"]
        assert chat(server).json()["choices"][0]["message"]["content"] == DEFAULT_REPLY


# --- what it refuses, as OpenAI refuses it ------------------------------------------------------


def _post(fake: FakeOpenAI, body: dict[str, Any]) -> httpx.Response:
    headers = {"Authorization": "Bearer sk-test"}
    return httpx.post(f"{fake.base_url}/chat/completions", json=body, headers=headers, timeout=10)


CALL = {"id": "call_1", "type": "function", "function": {"name": "host_probe", "arguments": "{}"}}


def test_a_tool_call_without_its_result_is_refused(fake: FakeOpenAI) -> None:
    messages = [
        *user("check"),
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "user", "content": "go on"},
    ]
    response = _post(fake, {"model": "gpt-4o-mini", "messages": messages})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "messages.[3].role"
    assert error["message"].endswith("did not have response messages: call_1")
    assert fake.rejections() == [error["message"]] and fake.requests()


def test_a_tool_result_nobody_asked_for_is_refused(fake: FakeOpenAI) -> None:
    messages = [*user("check"), {"role": "tool", "tool_call_id": "call_9", "content": "x"}]
    error = _post(fake, {"model": "gpt-4o-mini", "messages": messages}).json()["error"]
    assert error["message"] == (
        "Invalid parameter: messages with role 'tool' must be a response to a preceeding "
        "message with 'tool_calls'."
    )


def test_past_the_window_is_context_length_exceeded() -> None:
    with FakeOpenAI(context_window=50) as small:
        long = user("word " * 60)
        response = _post(small, {"model": "gpt-4o-mini", "messages": long, "max_tokens": 10})
        error = response.json()["error"]
        assert response.status_code == 400 and error["code"] == "context_length_exceeded"
        assert error["message"].startswith("This model's maximum context length is 50 tokens.")
        assert "(62 in the messages, 10 in the completion)" in error["message"]
