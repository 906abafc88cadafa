"""The litellm adapter, driven for real over a socket against the fake OpenAI server."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from workers._litellm import (
    _CALLBACK_LISTS,
    LitellmModel,
    _lean_possible,
    _openai_message,
    _openai_tool,
    _Reply,
    load,
    readiness,
)
from workers.hardening import ProviderCredentials
from workers.messages import Message, ToolCall, Usage
from workers.model import ModelError, ModelReply, ModelRequest, ToolSpec
from workers.testing.aio import collect
from workers.testing.fake_openai import FakeOpenAI

litellm = load()

MODEL = "openai/gpt-4o-mini"
ANSWER = "The disk on db-1 is full: /var is at 100%."
PROBE_ARGS = {"section": "disk", "host": "db-1"}
PROBE_SCHEMA = {
    "type": "object",
    "properties": {"section": {"type": "string"}, "host": {"type": "string"}},
    "required": ["section"],
}
TOOLS = [ToolSpec("host_probe", "Probe a host.", PROBE_SCHEMA)]
#: TOOLS as the provider receives them.
OPENAI_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "host_probe",
            "description": "Probe a host.",
            "parameters": PROBE_SCHEMA,
        },
    }
]
RULES: list[dict[str, Any]] = [
    {"match": "/var is full", "turn": 1, "reply": {"content": "Clean /var/log."}},
    {
        "match": "check the disk",
        "where": "last_user",
        "reply": {
            "content": "Probing.",
            "tool_calls": [
                {"name": "host_probe", "arguments": PROBE_ARGS},
                {"name": "host_probe", "arguments": {"section": "memory"}},
            ],
        },
    },
    {"match": "", "reply": {"content": ANSWER}},
]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAI]:
    with FakeOpenAI(RULES) as server:
        point_at(monkeypatch, server.base_url)
        yield server


def point_at(monkeypatch: pytest.MonkeyPatch, base_url: str) -> None:
    monkeypatch.setenv("OPENAI_API_BASE", base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)


def request(*messages: Message, tools: list[ToolSpec] | None = None) -> ModelRequest:
    history = [Message(role="system", content="You investigate."), *messages]
    return ModelRequest(model=MODEL, messages=history, tools=TOOLS if tools is None else tools)


def ask(text: str) -> ModelRequest:
    return request(Message(role="user", content=text))


def run(model: LitellmModel, req: ModelRequest) -> tuple[list[str], ModelReply]:
    items = collect(model.stream(req))
    *deltas, reply = items
    assert isinstance(reply, ModelReply)
    assert all(isinstance(d, str) and d for d in deltas)
    return deltas, reply  # type: ignore[return-value]


# --- replies -------------------------------------------------------------------------------------


def test_text_streams_in_deltas_then_one_reply(fake: FakeOpenAI) -> None:
    deltas, reply = run(LitellmModel(), ask("why is db-1 slow?"))
    assert len(deltas) > 3
    assert "".join(deltas) == ANSWER
    assert reply.message == Message(role="assistant", content=ANSWER)
    assert reply.finish_reason == "stop"
    (sent,) = fake.requests()
    assert sent["model"] == "gpt-4o-mini" and sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True}
    assert sent["tools"] == OPENAI_TOOLS
    assert [m["role"] for m in sent["messages"]] == ["system", "user"]


def test_no_tools_sends_no_tools_key(fake: FakeOpenAI) -> None:
    run(LitellmModel(), request(Message(role="user", content="hi"), tools=[]))
    assert "tools" not in fake.requests()[0]


def test_tool_calls_are_reassembled(fake: FakeOpenAI) -> None:
    deltas, reply = run(LitellmModel(), ask("please check the disk"))
    assert "".join(deltas) == "Probing." == reply.message.content
    assert reply.finish_reason == "tool_calls"
    first, second = reply.message.tool_calls
    assert (first.id, first.name) == ("call_0_0", "host_probe")
    assert json.loads(first.arguments) == PROBE_ARGS
    assert (second.id, second.name) == ("call_0_1", "host_probe")
    assert json.loads(second.arguments) == {"section": "memory"}


@pytest.mark.parametrize("prompt", ["please check the disk", "why is db-1 slow?"])
def test_a_reply_asked_for_in_one_piece_is_the_streamed_reply(
    fake: FakeOpenAI, prompt: str
) -> None:
    """Nobody watching: one request without streaming, the same reply, its text as one delta."""
    _, streamed = run(LitellmModel(), ask(prompt))
    whole = dataclasses.replace(ask(prompt), stream=False)
    deltas, reply = run(LitellmModel(), whole)
    assert deltas == ([streamed.message.content] if streamed.message.content else [])
    assert reply.message.content == streamed.message.content
    assert [(c.id, c.name, json.loads(c.arguments)) for c in reply.message.tool_calls] == [
        (c.id, c.name, json.loads(c.arguments)) for c in streamed.message.tool_calls
    ]
    assert reply.finish_reason == streamed.finish_reason
    assert reply.usage.total_tokens == streamed.usage.total_tokens > 0
    assert reply.usage.cost == pytest.approx(streamed.usage.cost) and reply.usage.cost > 0
    first, second = fake.requests()[-2:]
    assert first.get("stream") is True and not second.get("stream")


def test_usage_and_cost(fake: FakeOpenAI) -> None:
    _, reply = run(LitellmModel(), ask("why is db-1 slow?"))
    usage = reply.usage
    assert usage.prompt_tokens > 0 and usage.completion_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.model_calls == 1
    price = litellm.model_cost["gpt-4o-mini"]
    expected = (
        usage.prompt_tokens * price["input_cost_per_token"]
        + usage.completion_tokens * price["output_cost_per_token"]
    )
    assert usage.cost > 0
    assert usage.cost == pytest.approx(expected)


def test_without_litellm_callbacks_a_call_skips_its_logging_and_prices_itself(
    fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nobody reads litellm's logging: it is skipped, and the cost is still the price table's.
    A registered callback turns litellm's logging back on and sees every call."""
    from litellm.integrations.custom_logger import CustomLogger

    class Recorder(CustomLogger):  # type: ignore[misc]
        """A litellm callback, as an operator would register one: it sees what litellm logs."""

        def __init__(self) -> None:
            super().__init__()
            self.costs: list[float] = []

        async def async_log_success_event(self, kwargs: Any, *_: Any, **__: Any) -> None:
            self.costs.append(kwargs.get("response_cost"))

    whole = dataclasses.replace(ask("why is db-1 slow?"), stream=False)
    recorder = Recorder()

    async def reply(req: ModelRequest) -> Usage:
        items = [item async for item in LitellmModel().stream(req)]
        assert isinstance(items[-1], ModelReply)
        return items[-1].usage

    async def logged(count: int) -> None:
        # litellm logs on tasks of its own after the call returns; bounded, not timed.
        for _ in range(200):
            if len(recorder.costs) >= count:
                return
            await asyncio.sleep(0.025)

    # litellm files a callback into its other lists in place: it works on copies of them, and
    # the lists it had come back untouched after the test.
    for name in _CALLBACK_LISTS:
        monkeypatch.setattr(litellm, name, list(getattr(litellm, name)))

    async def scenario() -> list[Usage]:
        assert _lean_possible(litellm)
        lean = await reply(whole)
        assert litellm.utils.update_response_metadata.ongrid_lean
        monkeypatch.setattr(litellm, "callbacks", [recorder])
        assert not _lean_possible(litellm)
        full = await reply(whole)
        await logged(1)
        # litellm files a callback into its own lists too: all of them are emptied.
        for name in _CALLBACK_LISTS:
            monkeypatch.setattr(litellm, name, [])
        again = await reply(whole)
        await asyncio.sleep(0.2)  # what litellm would have logged has had its chance
        return [lean, full, again]

    usages = asyncio.run(scenario())
    price = litellm.model_cost["gpt-4o-mini"]
    for usage in usages:
        expected = (
            usage.prompt_tokens * price["input_cost_per_token"]
            + usage.completion_tokens * price["output_cost_per_token"]
        )
        assert usage.cost == pytest.approx(expected) and usage.cost > 0
    # Only the call made while a callback was registered was logged.
    assert recorder.costs == [pytest.approx(usages[1].cost)]


def test_a_model_without_a_price_costs_nothing(fake: FakeOpenAI) -> None:
    req = ModelRequest(model="openai/ongrid-unpriced-model", messages=ask("hi").messages)
    _, reply = run(LitellmModel(), req)
    assert reply.message.content == ANSWER
    assert reply.usage.cost == 0.0 and reply.usage.total_tokens > 0


def test_a_second_turn_with_tool_history_is_accepted(fake: FakeOpenAI) -> None:
    model = LitellmModel()
    question = Message(role="user", content="please check the disk")
    _, first = run(model, request(question))
    results = [
        Message(role="tool", content=f"/var is full ({c.name} {i})", tool_call_id=c.id, name=c.name)
        for i, c in enumerate(first.message.tool_calls)
    ]
    _, second = run(model, request(question, first.message, *results))
    assert second.message.content == "Clean /var/log."  # the rule for turn 1 matched
    sent = fake.requests()[-1]["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool", "tool"]
    assistant = sent[2]
    assert assistant["content"] == "Probing."
    assert assistant["tool_calls"] == [
        {
            "id": "call_0_0",
            "type": "function",
            "function": {"name": "host_probe", "arguments": json.dumps(PROBE_ARGS)},
        },
        {
            "id": "call_0_1",
            "type": "function",
            "function": {"name": "host_probe", "arguments": json.dumps({"section": "memory"})},
        },
    ]
    assert [(m["tool_call_id"], m["content"]) for m in sent[3:]] == [
        ("call_0_0", "/var is full (host_probe 0)"),
        ("call_0_1", "/var is full (host_probe 1)"),
    ]


def test_openai_shapes() -> None:
    call = ToolCall(id="c1", name="host_probe", arguments='{"section": "disk"}')
    assert _openai_message(Message(role="assistant", tool_calls=[call])) == {
        "role": "assistant",
        "content": None,  # OpenAI wants null, not "", beside tool calls
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "host_probe", "arguments": '{"section": "disk"}'},
            }
        ],
    }
    tool = Message(role="tool", content="ok", tool_call_id="c1", name="host_probe")
    assert _openai_message(tool) == {
        "role": "tool",
        "content": "ok",
        "tool_call_id": "c1",
        "name": "host_probe",
    }
    assert _openai_message(Message(role="user", content="hi", name="bob")) == {
        "role": "user",
        "content": "hi",
    }
    assert (
        _openai_message(Message(role="assistant", content="Checking.", tool_calls=[call]))[
            "content"
        ]
        == "Checking."
    )
    assert [_openai_tool(t) for t in TOOLS] == OPENAI_TOOLS


def test_api_base_and_key_can_be_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_BASE", "OPENAI_BASE_URL", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    with FakeOpenAI(RULES) as server:
        model = LitellmModel(api_base=server.base_url, api_key="sk-explicit")
        _, reply = run(model, ask("hello"))
    assert reply.message.content == ANSWER


def test_abandoning_the_stream_closes_it(fake: FakeOpenAI) -> None:
    async def abandon() -> None:
        stream = LitellmModel().stream(ask("why is db-1 slow?"))
        assert isinstance(await anext(stream), str)
        await stream.aclose()  # the loop may stop consuming (a cancelled spawn); nothing may leak

    asyncio.run(abandon())
    _, reply = run(LitellmModel(), ask("why is db-1 slow?"))  # the next call works
    assert reply.message.content == ANSWER


def chunk(content: str | None = None, *calls: Any, finish: str | None = None) -> Any:
    delta = SimpleNamespace(content=content, tool_calls=list(calls) or None)
    choice = SimpleNamespace(delta=delta, finish_reason=finish)
    return SimpleNamespace(choices=[choice], usage=None)


def fragment(index: int | None, call_id: str | None, name: str | None, args: str) -> Any:
    function = SimpleNamespace(name=name, arguments=args)
    return SimpleNamespace(index=index, id=call_id, function=function)


def test_reassembly_tells_calls_apart_by_id_when_every_index_is_zero() -> None:
    reply = _Reply()
    chunks = [
        chunk("Look"),
        chunk(None, fragment(0, "a", "host_probe", '{"sec')),
        chunk(None, fragment(0, None, None, 'tion": "disk"}')),
        chunk(None, fragment(0, "b", "get_edge_summary", "")),
        chunk(None, fragment(None, "c", "host_probe", '{"section": "cpu"}'), finish="tool_calls"),
    ]
    assert [reply.add(c) for c in chunks] == ["Look", "", "", "", ""]
    usage = SimpleNamespace(prompt_tokens=3, completion_tokens=4, cost=0.5)
    reply.add(SimpleNamespace(choices=[], usage=usage))
    assert reply.complete
    message = reply.message()
    assert message.content == "Look"
    assert [(c.id, c.name, c.arguments) for c in message.tool_calls] == [
        ("a", "host_probe", '{"section": "disk"}'),
        ("b", "get_edge_summary", "{}"),
        ("c", "host_probe", '{"section": "cpu"}'),
    ]
    assert reply.to_usage(MODEL) == Usage(
        prompt_tokens=3, completion_tokens=4, total_tokens=7, cost=0.5, model_calls=1
    )


# --- failures ------------------------------------------------------------------------------------


@dataclass
class ErrorServer:
    """Answers every POST with ``status`` (or hangs for ``hang`` seconds first)."""

    url: str = ""
    status: int = 500
    #: Set: every request waits for ``release`` before it answers.
    hang: bool = False
    release: threading.Event = field(default_factory=threading.Event)
    answered: list[str] = field(default_factory=list)
    hits: list[str] = field(default_factory=list)


@pytest.fixture
def error_server() -> Iterator[ErrorServer]:
    state = ErrorServer()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            state.hits.append(self.path)
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if state.hang:
                state.release.wait(60)
            body = json.dumps({"error": {"message": "upstream exploded", "type": "x"}}).encode()
            state.answered.append(self.path)
            try:
                self.send_response(state.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except OSError:
                pass  # the client gave up (timeout test)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        yield state
    finally:
        state.release.set()
        server.shutdown()
        server.server_close()
        thread.join()


#: Every failure is checked both ways a reply is asked for: streamed, and in one piece (which
#: takes the direct path of workers._litellm_direct for the ``openai`` provider).
BOTH_WAYS = pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])


def fail(model: LitellmModel, req: ModelRequest | None = None, *, stream: bool) -> ModelError:
    with pytest.raises(ModelError) as caught:
        collect(model.stream(dataclasses.replace(req or ask("hi"), stream=stream)))
    error = caught.value
    assert MODEL in str(error)
    return error


@BOTH_WAYS
@pytest.mark.parametrize(
    ("status", "retryable", "cause"),
    [
        (500, True, "500 internal server error"),
        (502, True, "502 bad gateway"),
        (503, True, "503 service unavailable"),
        (429, True, "429 rate limited"),
        (400, False, "400 bad request"),
        (401, False, "401 unauthorized"),
        (404, False, "404 not found"),
    ],
)
def test_http_errors_become_model_errors(
    monkeypatch: pytest.MonkeyPatch,
    error_server: ErrorServer,
    status: int,
    retryable: bool,
    cause: str,
    stream: bool,
) -> None:
    point_at(monkeypatch, error_server.url)
    error_server.status = status
    error = fail(LitellmModel(), stream=stream)
    assert error.status == status
    assert error.retryable is retryable
    assert error.cause == cause
    assert error.retry_after is None  # the server sent no Retry-After
    assert "upstream exploded" in str(error)
    assert len(error_server.hits) == 1  # the SDK's own retries are off by default


@BOTH_WAYS
def test_a_failure_is_one_line_with_the_providers_own_message(
    monkeypatch: pytest.MonkeyPatch, error_server: ErrorServer, stream: bool
) -> None:
    point_at(monkeypatch, error_server.url)
    error_server.status = 503
    error = fail(LitellmModel(), stream=stream)
    assert str(error) == f"model {MODEL}: 503 service unavailable: upstream exploded"


def test_the_reply_limit_and_the_cache_key_reach_openai(fake: FakeOpenAI) -> None:
    plain = ask("hello")
    run(LitellmModel(), plain)
    keyed = ModelRequest(
        model=MODEL, messages=plain.messages, max_tokens=321, cache_key="spawn-1", stable=2
    )
    run(LitellmModel(), keyed)
    first, second = fake.requests()
    assert "max_tokens" not in first and "prompt_cache_key" not in first
    assert second["max_tokens"] == 321
    assert second["prompt_cache_key"] == "spawn-1"
    # OpenAI caches on its own: no Anthropic breakpoint reaches it.
    assert "cache_control" not in json.dumps(second)


@BOTH_WAYS
def test_the_sdk_retries_only_when_asked(
    monkeypatch: pytest.MonkeyPatch, error_server: ErrorServer, stream: bool
) -> None:
    point_at(monkeypatch, error_server.url)
    error = fail(LitellmModel(max_retries=1), stream=stream)
    assert error.retryable and len(error_server.hits) == 2


@BOTH_WAYS
def test_connection_refused(monkeypatch: pytest.MonkeyPatch, stream: bool) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    point_at(monkeypatch, f"http://127.0.0.1:{port}/v1")  # closed: nothing listens there
    error = fail(LitellmModel(max_retries=0), stream=stream)
    assert error.retryable
    assert error.status is None  # litellm says 500; no server answered at all
    assert "Connection error" in str(error)
    assert error.cause == "connection refused"


@BOTH_WAYS
def test_timeout(monkeypatch: pytest.MonkeyPatch, error_server: ErrorServer, stream: bool) -> None:
    """The server holds the request until the client has given up: the timeout ended the call,
    not an answer."""
    point_at(monkeypatch, error_server.url)
    error_server.hang = True
    error = fail(LitellmModel(timeout=0.5, max_retries=0), stream=stream)
    assert error_server.hits == ["/v1/chat/completions"] and error_server.answered == []
    assert error.retryable
    assert error.cause == "timeout after 0.5 s"


def test_an_unknown_provider_is_a_model_error(fake: FakeOpenAI) -> None:
    req = ModelRequest(model="zhipu/glm-4.7", messages=ask("hi").messages)
    with pytest.raises(ModelError, match="zhipu/glm-4.7") as caught:
        collect(LitellmModel(max_retries=0).stream(req))
    assert not caught.value.retryable
    assert fake.requests() == []


# --- air gap -------------------------------------------------------------------------------------

GUARD = textwrap.dedent(
    """
    import ipaddress, json, socket

    attempts = []

    def _loopback(address):
        if not isinstance(address, tuple):
            return True  # AF_UNIX path
        host = str(address[0])
        if host == "localhost":
            return True
        try:
            return ipaddress.ip_address(host.split("%")[0]).is_loopback
        except ValueError:
            return False  # a hostname: resolving it is already a network call

    def _guard(address):
        if not _loopback(address):
            attempts.append(repr(address))
            raise OSError(f"air-gap test: connection to {address!r} refused")

    _connect, _connect_ex = socket.socket.connect, socket.socket.connect_ex
    _create, _getaddrinfo = socket.create_connection, socket.getaddrinfo

    def connect(self, address):
        _guard(address)
        return _connect(self, address)

    def connect_ex(self, address):
        _guard(address)
        return _connect_ex(self, address)

    def create_connection(address, *args, **kwargs):
        _guard(address)
        return _create(address, *args, **kwargs)

    def getaddrinfo(host, port, *args, **kwargs):
        _guard((host, port))
        return _getaddrinfo(host, port, *args, **kwargs)

    socket.socket.connect, socket.socket.connect_ex = connect, connect_ex
    socket.create_connection, socket.getaddrinfo = create_connection, getaddrinfo

    from workers._litellm import LitellmModel, load, readiness
    from workers.messages import Message
    from workers.model import ModelRequest
    from workers.testing.fake_openai import FakeOpenAI

    litellm = load()
    configured = readiness("openai/gpt-4o-mini").usable
    with FakeOpenAI([{"reply": {"content": "offline answer"}}]) as fake:
        model = LitellmModel(api_base=fake.base_url, api_key="sk-test", max_retries=0)
        request = ModelRequest("openai/gpt-4o-mini", [Message(role="user", content="hi")])
        from workers.testing.aio import collect

        reply = collect(model.stream(request))[-1]
    seen_before_probe = list(attempts)
    try:  # the guard itself works: a public address is caught
        socket.create_connection(("192.0.2.1", 80), timeout=1)
    except OSError:
        pass
    print(json.dumps({
        "attempts": seen_before_probe,
        "probe_caught": attempts[len(seen_before_probe):] != [],
        "configured": configured,
        "cost_entries": len(litellm.model_cost),
        "knows_gpt_4o_mini": "gpt-4o-mini" in litellm.model_cost,
        "answer": reply.message.content,
        "cost": reply.usage.cost,
    }))
    """
)


def test_import_and_a_call_make_no_outside_connection() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LITELLM_", "OPENAI_"))}
    env["OPENAI_API_KEY"] = "sk-test"
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", GUARD],
        capture_output=True,
        text=True,
        env=env,
        cwd=root,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["attempts"] == []
    assert report["probe_caught"] is True
    assert report["configured"] is True
    assert report["cost_entries"] > 100 and report["knows_gpt_4o_mini"]
    assert report["answer"] == "offline answer" and report["cost"] > 0


def test_usage_type_is_ours(fake: FakeOpenAI) -> None:
    _, reply = run(LitellmModel(), ask("hi"))
    assert type(reply.usage) is Usage and type(reply.message) is Message


# --- credentials handed in, not read from the environment ------------------------------------


def test_keys_come_from_the_credentials_when_the_environment_has_none(
    fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker takes provider keys out of ``os.environ``; the adapter passes them per call."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    key = "sk-handed-in-0001"
    credentials = ProviderCredentials({"OPENAI_API_KEY": key})
    assert readiness(MODEL).usable is False
    assert readiness(MODEL, credentials).usable is True
    fake._service.keys.clear()
    _, reply = run(LitellmModel(credentials=credentials), ask("hi"))
    assert reply.message.content
    assert fake.key_digests() == [hashlib.sha256(key.encode()).hexdigest()]
    assert "sk-handed-in" not in repr(credentials)


# --- loading: nothing at import ------------------------------------------------------------------

IMPORT_ONLY = textwrap.dedent(
    """
    import json, os, sys
    from concurrent.futures import ThreadPoolExecutor

    before = dict(os.environ)
    import workers._litellm as adapter
    after_import = dict(os.environ)
    imported_litellm = "litellm" in sys.modules
    with ThreadPoolExecutor(8) as pool:  # concurrent first calls: one import, one module
        modules = list(pool.map(lambda _: adapter.load(), range(8)))
    after_load = dict(os.environ)
    print(json.dumps({
        "unchanged_by_import": after_import == before,
        "litellm_at_import": imported_litellm,
        "litellm_after_load": "litellm" in sys.modules,
        "one_module": len({id(m) for m in modules}) == 1 and modules[0] is sys.modules["litellm"],
        "added": {k: v for k, v in after_load.items() if k not in before},
        "changed": [k for k in before if after_load.get(k) != before[k]],
        "cost_entries": len(sys.modules["litellm"].model_cost),
    }))
    """
)

IMPORTED_EARLY = textwrap.dedent(
    """
    import logging, sys, types

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    sys.modules["litellm"] = types.ModuleType("litellm")  # someone imported it without the map
    from workers._litellm import load

    load()
    """
)


def run_clean(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter whose environment holds nothing of the suite's."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(Path.home())}
    root = Path(__file__).resolve().parents[2]
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root, timeout=120
    )


def test_importing_the_adapter_changes_nothing_until_load() -> None:
    done = run_clean(IMPORT_ONLY)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["unchanged_by_import"] is True
    assert report["litellm_at_import"] is False
    assert report["litellm_after_load"] is True and report["one_module"] is True
    assert report["added"] == {
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_LOG": "ERROR",
        "AIOHTTP_CONNECTOR_LIMIT": "65536",
        "AIOHTTP_CONNECTOR_LIMIT_PER_HOST": "65536",
    }
    assert report["changed"] == []
    assert report["cost_entries"] > 100  # the map shipped with litellm was read


def test_load_warns_when_litellm_was_imported_before_it() -> None:
    done = run_clean(IMPORTED_EARLY)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "WARNING workers._litellm litellm was imported before" in done.stderr
    assert "LITELLM_LOCAL_MODEL_COST_MAP" in done.stderr
