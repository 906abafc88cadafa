"""The fake Anthropic Messages server, and the runtime's litellm adapter driven against it.

The adapter goes through litellm's real Anthropic adapter over a socket; what the fake refuses
is what Anthropic refuses, in Anthropic's words and shapes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from workers._litellm import LitellmModel, load
from workers.messages import Message, ToolCall
from workers.model import ModelError, ModelReply, ModelRequest, ToolSpec
from workers.testing.aio import collect
from workers.testing.fake_anthropic import FakeAnthropic

litellm = load()

MODEL = "anthropic/claude-sonnet-4-5"
PROBE = ToolSpec(
    "host_probe",
    "Probe a host.",
    {"type": "object", "properties": {"host": {"type": "string"}}, "required": ["host"]},
)
RULES: list[dict[str, Any]] = [
    {
        "match": "check db-1 and db-2",
        "where": "last_user",
        "reply": {
            "content": "Probing both.",
            "tool_calls": [
                {"name": "host_probe", "arguments": {"host": "db-1"}},
                {"name": "host_probe", "arguments": {"host": "db-2"}},
            ],
        },
    },
    {"match": "", "reply": {"content": "The disk on db-1 is full: /var is at 100%."}},
]
HEADERS = {"x-api-key": "sk-ant-test", "anthropic-version": "2023-06-01"}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAnthropic]:
    with FakeAnthropic(RULES, context_window=20_000, max_output=4096) as server:
        monkeypatch.setenv("ANTHROPIC_API_BASE", server.base_url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
        monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
        yield server


def ask(*messages: Message, max_tokens: int = 1024, stable: int = 0, stream: bool = True):
    history = [Message(role="system", content="You investigate hosts."), *messages]
    return ModelRequest(
        model=MODEL,
        messages=history,
        tools=[PROBE],
        max_tokens=max_tokens,
        stable=stable,
        stream=stream,
    )


def run(request: ModelRequest) -> tuple[list[str], ModelReply]:
    *deltas, reply = collect(LitellmModel().stream(request))
    assert isinstance(reply, ModelReply)
    return [d for d in deltas if isinstance(d, str)], reply


def fail(request: ModelRequest) -> ModelError:
    with pytest.raises(ModelError) as caught:
        run(request)
    return caught.value


def post(fake: FakeAnthropic, body: dict[str, Any], headers: dict[str, str] = HEADERS):
    return httpx.post(f"{fake.base_url}/v1/messages", json=body, headers=headers, timeout=10)


def body(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": list(messages), **extra}


USER = {"role": "user", "content": "hello"}


# --- the adapter against it ----------------------------------------------------------------------


def test_streamed_parallel_tool_calls_and_their_results(fake: FakeAnthropic) -> None:
    deltas, reply = run(ask(Message(role="user", content="check db-1 and db-2")))
    assert "".join(deltas) == "Probing both."
    calls = reply.message.tool_calls
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("host_probe", {"host": "db-1"}),
        ("host_probe", {"host": "db-2"}),
    ]
    assert reply.finish_reason == "tool_calls"
    follow = ask(
        Message(role="user", content="check db-1 and db-2"),
        reply.message,
        *(
            Message(
                role="tool",
                content=f"{json.loads(c.arguments)['host']}: /var 100%",
                tool_call_id=c.id,
                name=c.name,
            )
            for c in calls
        ),
    )
    _, answer = run(follow)
    assert "/var is at 100%" in (answer.message.content or "")
    assert fake.rejections() == []
    second = fake.requests()[1]["messages"]
    assert [m["role"] for m in second] == ["user", "assistant", "user"]
    results = [b for b in second[2]["content"] if b["type"] == "tool_result"]
    assert [r["tool_use_id"] for r in results] == [c.id for c in calls]


def test_a_reply_asked_for_in_one_piece(fake: FakeAnthropic) -> None:
    deltas, reply = run(ask(Message(role="user", content="status?"), stream=False))
    assert "".join(deltas) == "The disk on db-1 is full: /var is at 100%."
    assert reply.usage.prompt_tokens == fake.prompt_tokens()[0]
    assert fake.requests()[0]["max_tokens"] == 1024


def test_breakpoints_are_cached_and_read_back(fake: FakeAnthropic) -> None:
    long = "Context: " + "the fleet has 40 database hosts and each one logs to /var. " * 120
    first = ask(Message(role="user", content=long), stable=2)
    _, reply = run(first)
    assert reply.usage.cache_write_tokens > 1024 and reply.usage.cache_read_tokens == 0
    again = ask(
        Message(role="user", content=long),
        reply.message,
        Message(role="user", content="and now?"),
        stable=4,
    )
    _, second = run(again)
    assert second.usage.cache_read_tokens == reply.usage.cache_write_tokens
    sent = fake.requests()
    assert all(json.dumps(b).count('"cache_control"') <= 4 for b in sent)
    assert fake.rejections() == []
    usage = fake.usages()[1]
    assert usage.cache_read_input_tokens == second.usage.cache_read_tokens
    # The cost is litellm's, with writes and reads at their own prices.
    price = litellm.model_cost["claude-sonnet-4-5"]
    expected = (
        usage.input_tokens * price["input_cost_per_token"]
        + usage.cache_creation_input_tokens * price["cache_creation_input_token_cost"]
        + usage.cache_read_input_tokens * price["cache_read_input_token_cost"]
        + second.usage.completion_tokens * price["output_cost_per_token"]
    )
    assert second.usage.cost == pytest.approx(expected)
    assert second.usage.prompt_tokens == usage.prompt_tokens  # cached input counted in full


def test_429_waits_what_retry_after_says(fake: FakeAnthropic) -> None:
    fake.set_script([{"fail": {"status": 429, "retry_after": 6}}])
    error = fail(ask(Message(role="user", content="hi")))
    assert error.status == 429 and error.retryable and error.retry_after == 6
    assert "rate limit" in str(error) and "\n" not in str(error)


def test_529_is_named_overloaded(fake: FakeAnthropic) -> None:
    fake.set_script([{"fail": {"status": 529}}])
    error = fail(ask(Message(role="user", content="hi")))
    assert error.status == 529 and error.retryable
    assert "overloaded" in str(error).lower()
    assert "litellm" not in str(error) and "b'" not in str(error) and "\n" not in str(error)


def test_a_prompt_too_long_is_a_context_error_with_its_figures(fake: FakeAnthropic) -> None:
    huge = "x " * 50_000
    error = fail(ask(Message(role="user", content=huge)))
    assert error.context_exceeded
    assert "prompt is too long" in str(error) and "20000 maximum" in str(error)
    assert fake.rejections()[0][0] == 400


# --- what it refuses, as Anthropic refuses it ----------------------------------------------------


def refused(response: httpx.Response, status: int, kind: str, words: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == kind
    assert words in error["error"]["message"]


def test_it_wants_the_key_and_the_version(fake: FakeAnthropic) -> None:
    refused(
        post(fake, body(USER), {"anthropic-version": "2023-06-01"}),
        401,
        "authentication_error",
        "x-api-key",
    )
    refused(
        post(fake, body(USER), {"x-api-key": "k"}),
        400,
        "invalid_request_error",
        "anthropic-version",
    )


def test_max_tokens_is_required_and_bounded(fake: FakeAnthropic) -> None:
    no_limit = body(USER)
    del no_limit["max_tokens"]
    refused(post(fake, no_limit), 400, "invalid_request_error", "max_tokens: Field required")
    refused(
        post(fake, body(USER, max_tokens=128_000)),
        400,
        "invalid_request_error",
        "128000 > 4096, which is the maximum allowed number of output tokens",
    )


def test_roles_alternate_and_start_with_the_user(fake: FakeAnthropic) -> None:
    refused(
        post(fake, body(USER, USER)), 400, "invalid_request_error", 'multiple "user" roles in a row'
    )
    refused(
        post(fake, body({"role": "assistant", "content": "hi"})),
        400,
        "invalid_request_error",
        'first message must use the "user" role',
    )
    refused(
        post(fake, body({"role": "system", "content": "x"}, USER)),
        400,
        "invalid_request_error",
        'Unexpected role "system"',
    )


def test_tool_uses_and_results_pair_up(fake: FakeAnthropic) -> None:
    use = {
        "role": "assistant",
        "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "host_probe", "input": {"host": "a"}}
        ],
    }
    unanswered = body(USER, use, {"role": "user", "content": "go on"})
    refused(
        post(fake, unanswered),
        400,
        "invalid_request_error",
        "`tool_use` ids were found without `tool_result` blocks immediately after: toolu_1",
    )
    stray = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "x"}],
    }
    refused(
        post(fake, body(USER, {"role": "assistant", "content": "ok"}, stray)),
        400,
        "invalid_request_error",
        "unexpected `tool_use_id` found in `tool_result` blocks",
    )


def test_at_most_four_breakpoints(fake: FakeAnthropic) -> None:
    marked = [
        {"type": "text", "text": f"part {n}", "cache_control": {"type": "ephemeral"}}
        for n in range(5)
    ]
    refused(
        post(fake, body({"role": "user", "content": marked})),
        400,
        "invalid_request_error",
        "A maximum of 4 blocks with cache_control",
    )


def test_the_window_counts_input_and_output(fake: FakeAnthropic) -> None:
    nearly = {"role": "user", "content": "y " * 38_000}
    refused(
        post(fake, body(nearly, max_tokens=4000)),
        400,
        "invalid_request_error",
        "input length and `max_tokens` exceed context limit",
    )
    assert len(fake.rejections()) == 1 and fake.usages() == []


def test_tool_calls_in_one_piece_have_anthropic_shapes(fake: FakeAnthropic) -> None:
    response = post(fake, body({"role": "user", "content": "check db-1 and db-2"}))
    message = response.json()
    assert message["type"] == "message" and message["stop_reason"] == "tool_use"
    kinds = [b["type"] for b in message["content"]]
    assert kinds == ["text", "tool_use", "tool_use"]
    assert set(message["usage"]) == {
        "input_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
        "output_tokens",
    }


def test_tool_use_streams_input_json_deltas(fake: FakeAnthropic) -> None:
    response = post(fake, body({"role": "user", "content": "check db-1 and db-2"}, stream=True))
    events = [
        json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")
    ]
    kinds = [e["type"] for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    pieces = [
        e["delta"]["partial_json"]
        for e in events
        if e["type"] == "content_block_delta" and e["index"] == 1
    ]
    assert len(pieces) > 1 and json.loads("".join(pieces)) == {"host": "db-1"}
    assert litellm is not None  # the real adapter was loaded with the local price map


def test_tool_call_reply_keeps_ids(fake: FakeAnthropic) -> None:
    _, reply = run(ask(Message(role="user", content="check db-1 and db-2")))
    ids = [c.id for c in reply.message.tool_calls]
    assert len(set(ids)) == 2 and all(i.startswith("toolu_") for i in ids)
    assert isinstance(reply.message.tool_calls[0], ToolCall)


def test_breakpoints_sit_on_the_system_the_opening_the_settled_and_the_stable_message(
    fake: FakeAnthropic,
) -> None:
    call = ToolCall(id="toolu_a", name="host_probe", arguments='{"host": "db-1"}')
    later = ToolCall(id="toolu_b", name="host_probe", arguments='{"host": "db-2"}')
    history = [
        Message(role="system", content="You investigate hosts."),
        Message(role="user", content="check db-1 and db-2"),
        Message(role="assistant", content="", tool_calls=[call]),
        Message(role="tool", content="db-1: /var 100%", tool_call_id="toolu_a", name="host_probe"),
        Message(role="assistant", content="", tool_calls=[later]),
        Message(role="tool", content="db-2: fine", tool_call_id="toolu_b", name="host_probe"),
    ]
    request = ModelRequest(
        model=MODEL, messages=history, tools=[PROBE], max_tokens=512, stable=6, settled=3
    )
    run(request)
    sent = fake.requests()[0]

    def marked(blocks: list[dict[str, Any]]) -> list[str]:
        return [
            b.get("id") or b.get("tool_use_id") or b["type"] for b in blocks if "cache_control" in b
        ]

    assert marked(sent["tools"]) == []  # cached with the system prompt, which follows them
    assert marked(sent["system"]) == ["text"]
    per_message = [
        marked(m["content"]) if isinstance(m["content"], list) else [] for m in sent["messages"]
    ]
    # The opening message, the tool call before the result a shrink changes next, the last one.
    assert per_message == [["text"], ["toolu_a"], [], [], ["toolu_b"]]
    assert fake.rejections() == []
