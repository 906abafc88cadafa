"""A scripted, OpenAI-compatible chat-completions server: the fake LLM at the model boundary.

Replies are chosen by rules (first match wins), loaded from a JSON/YAML file (re-read whenever it
changes) or set with ``POST /_script``::

    [{"match": "disk", "where": "last_user", "turn": 0,
      "reply": {"tool_calls": [{"name": "host_probe", "arguments": {"host": "db1"}}]}},
     {"match": "", "reply": {"content": "All good."}, "delay": 0.2},
     {"match": "ping", "reply": {"echo": true}}]

``where`` is ``any`` (all message contents), ``last_user`` or ``system``; ``turn`` is the number of
assistant messages already in the conversation; a rule ``delay`` replaces the global one; a rule
with ``times`` answers that many requests, then later ones fall through to the next rules. A rule
may ``fail`` instead of replying, to script a provider's outages::

    [{"times": 2, "fail": {"status": 429, "retry_after": 1}},      # rate limited twice,
     {"times": 1, "fail": {"drop": "reset"}},                       # then a connection reset,
     {"reply": {"content": "At last."}}]                            # then an answer

``fail.status`` answers that HTTP status with an OpenAI error body (``retry_after``: a
``Retry-After`` header, in seconds); ``fail.drop`` closes the connection without a response
(``close``: a clean close; ``reset``: a TCP reset), after ``after_chunks`` chunks of the streamed
``reply`` when set.

Like OpenAI, it refuses (400, ``invalid_request_error``, OpenAI's words) an assistant message
whose ``tool_calls`` are not each answered by a ``tool`` message right after it, a ``tool``
message that answers no call, and, given a ``context_window``, a request whose messages and
``max_tokens`` pass it (``context_length_exceeded``; tokens counted as the usage counts them).

In process, a ``policy`` may decide the replies instead: a function of each request body (its
``messages``, its ``tools``) returning the :class:`Reply`, consulted when no rule matches, so a
scripted model can choose its next call from the tool results it was sent
(:mod:`workers.testing.recipe_model`).

Other endpoints: ``GET /v1/models``, ``GET /_requests`` (every request body, in order),
``GET /_keys`` (the SHA-256 of each request's bearer key, in order), ``GET /_peers`` (the client
address each request came from, in order), ``GET /_arrivals`` (the unix time each arrived, in
order), ``POST /_release`` (answer the requests a rule's
``hold`` keeps waiting), ``POST /_reset`` (forget requests and rules set over HTTP). Run
``python -m workers.testing.fake_openai --help``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import itertools
import json
import os
import re
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Self

import uvicorn
import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

__all__ = [
    "DEFAULT_REPLY",
    "Failure",
    "FakeOpenAI",
    "Policy",
    "Reply",
    "Rule",
    "create_app",
    "main",
    "start_subprocess",
]

DEFAULT_REPLY = "(fake-openai) no rule matched"


class ToolCallReply(BaseModel):
    """One tool call the fake model makes."""

    name: str
    arguments: dict[str, Any] | str = Field(default_factory=dict)
    """A JSON object, or the raw argument string to send as is (e.g. deliberately invalid JSON)."""


class Reply(BaseModel):
    """What the fake model answers when its rule matches."""

    content: str | None = None
    tool_calls: list[ToolCallReply] = Field(default_factory=list)
    echo: bool = False
    """Answer with the last user message's content instead of ``content``."""


#: Error messages of the statuses a provider fails with, as OpenAI words them.
_STATUS_TEXT = {
    400: "bad request",
    401: "invalid api key",
    404: "model not found",
    408: "request timeout",
    429: "rate limit exceeded",
    500: "internal server error",
    502: "bad gateway",
    503: "service unavailable",
    504: "gateway timeout",
}


class Failure(BaseModel):
    """How a request fails instead of being answered: an HTTP error, or a dropped connection."""

    model_config = ConfigDict(extra="forbid")

    status: int | None = Field(default=None, ge=400, le=599)
    """Answer this HTTP status with an OpenAI-shaped error body."""
    message: str = ""
    """The error body's message; empty: the usual text of ``status``."""
    retry_after: float | None = Field(default=None, ge=0)
    """Seconds sent as the ``Retry-After`` header of the error."""
    drop: Literal["close", "reset"] | None = None
    """Close the connection without (the rest of) a response: ``close`` sends a FIN, ``reset`` a
    TCP reset."""
    after_chunks: int = Field(default=0, ge=0)
    """With ``drop`` on a streamed request: send this many chunks of the rule's reply first."""

    @model_validator(mode="after")
    def _one_way(self) -> Failure:
        if (self.status is None) == (self.drop is None):
            raise ValueError("a failure needs exactly one of status or drop")
        if self.after_chunks and self.drop is None:
            raise ValueError("after_chunks needs drop")
        if self.retry_after is not None and self.status is None:
            raise ValueError("retry_after needs status")
        return self

    def error_body(self) -> dict[str, Any]:
        assert self.status is not None
        text = self.message or _STATUS_TEXT.get(self.status, f"error {self.status}")
        return {"error": {"message": text, "type": "fake_openai_error", "code": self.status}}


class Rule(BaseModel):
    """A scripted reply, chosen when ``match`` is in the ``where`` text (and ``turn`` fits)."""

    match: str = ""
    where: Literal["any", "last_user", "system"] = "any"
    turn: int | None = None
    """Number of assistant messages already in the conversation; any turn when unset."""
    reply: Reply = Field(default_factory=lambda: Reply(content=DEFAULT_REPLY))
    """Required unless the rule has ``fail`` (then it is what a dropped stream had begun)."""
    fail: Failure | None = None
    """Fail the request instead of answering it."""
    times: int | None = Field(default=None, ge=1)
    """Answer at most this many requests; later ones go to the next matching rule."""
    delay: float | None = None
    """Seconds before the first byte; replaces the server's global delay."""
    hold: str | None = None
    """Answer only once this name is released (``POST /_release {"hold": name}``): lets a test
    see requests in flight without guessing how long they take."""

    @model_validator(mode="before")
    @classmethod
    def _reply_or_fail(cls, data: Any) -> Any:
        if isinstance(data, dict) and "reply" not in data and data.get("fail") is None:
            raise ValueError("a rule needs a reply or a fail")
        return data

    def applies(self, messages: list[dict[str, Any]], turn: int) -> bool:
        """Whether this rule answers ``messages`` with ``turn`` assistant messages in them."""
        return self.turn in (None, turn) and self.match in _haystack(messages, self.where)


class ScriptError(Exception):
    """The script file or a ``POST /_script`` body is not a valid rule list, or the policy
    could not decide a reply."""


#: Decides the reply to one chat request from its body; consulted when no rule matches.
Policy = Callable[[dict[str, Any]], Reply]


_RULES = TypeAdapter(list[Rule])


def parse_rules(data: Any) -> list[Rule]:
    """Validate a rule list (or ``{"rules": [...]}``) into rules."""
    if isinstance(data, dict) and "rules" in data:
        data = data["rules"]
    try:
        return _RULES.validate_python(data or [])
    except ValidationError as exc:
        raise ScriptError(f"invalid fake-openai script: {exc}") from exc


class _Script:
    """The current rules: the file's, reloaded when it changes, unless set over HTTP since.

    It also counts how many requests each rule answered (for ``times``); new rules start at 0.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._rules: list[Rule] = []
        self._used: list[int] = []
        self._stamp: tuple[int, int] | None = None

    @property
    def rules(self) -> list[Rule]:
        return self._rules

    @rules.setter
    def rules(self, rules: list[Rule]) -> None:
        self._rules, self._used = rules, [0] * len(rules)

    def current(self) -> list[Rule]:
        if self.path is None:
            return self.rules
        try:
            stat = self.path.stat()
            stamp = (stat.st_mtime_ns, stat.st_size)
            if stamp != self._stamp:
                self.rules = parse_rules(yaml.safe_load(self.path.read_text()))
                self._stamp = stamp
        except (OSError, yaml.YAMLError) as exc:
            raise ScriptError(f"cannot load fake-openai script {self.path}: {exc}") from exc
        return self.rules

    def choose(self, messages: list[dict[str, Any]], turn: int) -> Rule | None:
        """The first rule that applies and is not used up; counted as used once more."""
        for number, rule in enumerate(self.current()):
            spent = rule.times is not None and self._used[number] >= rule.times
            if not spent and rule.applies(messages, turn):
                self._used[number] += 1
                return rule
        return None

    def reset(self) -> None:
        self.rules, self._stamp = [], None


def _text(content: Any) -> str:
    """Plain text of a message content: a string or a list of ``{"type": "text"}`` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _haystack(messages: list[dict[str, Any]], where: str) -> str:
    if where == "last_user":
        users = [m for m in messages if m.get("role") == "user"]
        return _text(users[-1].get("content")) if users else ""
    roles = ("system", "developer") if where == "system" else None
    return "\n".join(
        _text(m.get("content")) for m in messages if roles is None or m.get("role") in roles
    )


def _words(text: str) -> int:
    return len(text.split())


@dataclass(frozen=True)
class _Answer:
    """A reply resolved for one request: the text, tool calls in OpenAI's shape, the delay."""

    content: str | None
    calls: list[dict[str, Any]]
    delay: float
    hold: str | None = None
    fail: Failure | None = None

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.calls else "stop"

    def usage(self, messages: list[dict[str, Any]]) -> dict[str, int]:
        prompt = sum(_words(_text(m.get("content"))) for m in messages)
        args = (call["function"]["arguments"] for call in self.calls)
        completion = _words(self.content or "") + sum(1 + _words(a) for a in args)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }


def _tool_call(call_id: str, call: ToolCallReply) -> dict[str, Any]:
    args = call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments)
    return {"id": call_id, "type": "function", "function": {"name": call.name, "arguments": args}}


def refusal(body: dict[str, Any], context_window: int | None) -> tuple[str, str, str] | None:
    """What OpenAI's chat API would refuse in ``body``, in its words: (message, param, code);
    ``None`` when it is well formed. The window is counted as :meth:`_Answer.usage` counts."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "[] is too short - 'messages'", "messages", "empty_array"
    open_calls: list[str] = []
    for n, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role == "tool":
            if message.get("tool_call_id") not in open_calls:
                return (
                    "Invalid parameter: messages with role 'tool' must be a response to a "
                    "preceeding message with 'tool_calls'.",
                    f"messages.[{n}].role",
                    "",
                )
            open_calls.remove(message["tool_call_id"])
            continue
        if open_calls:
            return (
                "An assistant message with 'tool_calls' must be followed by tool messages "
                "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                f"response messages: {', '.join(open_calls)}",
                f"messages.[{n}].role",
                "",
            )
        if role == "assistant":
            open_calls = [c.get("id", "") for c in message.get("tool_calls") or []]
    if open_calls:
        return (
            "An assistant message with 'tool_calls' must be followed by tool messages responding "
            "to each 'tool_call_id'. The following tool_call_ids did not have response "
            f"messages: {', '.join(open_calls)}",
            f"messages.[{len(messages)}].role",
            "",
        )
    if context_window is not None:
        prompt = sum(_words(_text(m.get("content"))) for m in messages)
        wanted = int(body.get("max_tokens") or body.get("max_completion_tokens") or 0)
        if prompt + wanted > context_window:
            asked = (
                f"you requested {prompt + wanted} tokens ({prompt} in the messages, {wanted} in "
                "the completion). Please reduce the length of the messages or completion."
                if wanted
                else f"your messages resulted in {prompt} tokens. Please reduce the length of "
                "the messages."
            )
            return (
                f"This model's maximum context length is {context_window} tokens. However, {asked}",
                "messages",
                "context_length_exceeded",
            )
    return None


class _Service:
    """The fake's state and endpoints."""

    def __init__(
        self,
        script_path: Path | None,
        delay: float,
        policy: Policy | None,
        context_window: int | None = None,
    ) -> None:
        self.script = _Script(script_path)
        self.context_window = context_window
        #: Each refused request's message, in order.
        self.rejections: list[str] = []
        self.delay = delay
        self.policy = policy
        self.received: list[dict[str, Any]] = []
        self.keys: list[str] = []
        #: The client IP of each chat request, as the server saw it: which host asked.
        self.peers: list[str] = []
        #: When each chat request arrived (unix seconds): what landed after what.
        self.arrivals: list[float] = []
        self._ids = itertools.count(1)
        self._holds: dict[str, asyncio.Event] = {}

    def _released(self, name: str) -> asyncio.Event:
        return self._holds.setdefault(name, asyncio.Event())

    def answer(self, body: dict[str, Any]) -> _Answer:
        """Apply the first matching rule (else the policy, else the default reply) to a request."""
        messages: list[dict[str, Any]] = body.get("messages") or []
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        rule = self.script.choose(messages, turn)
        reply = rule.reply if rule else self._decide(body)
        content = _haystack(messages, "last_user") if reply.echo else reply.content
        calls = [_tool_call(f"call_{turn}_{i}", c) for i, c in enumerate(reply.tool_calls)]
        delay = rule.delay if rule and rule.delay is not None else self.delay
        if rule is None:
            return _Answer(content, calls, delay)
        return _Answer(content, calls, delay, rule.hold, rule.fail)

    def _decide(self, body: dict[str, Any]) -> Reply:
        if self.policy is None:
            return Reply(content=DEFAULT_REPLY)
        try:
            return self.policy(body)
        except Exception as exc:  # noqa: BLE001 - the client is told why, as a server error
            why = f"{type(exc).__name__}: {exc}"
            raise ScriptError(f"the fake-openai policy failed: {why}") from exc

    async def chat(self, request: Request) -> Response:
        body: dict[str, Any] = await request.json()
        self.received.append(body)
        # Only a digest of the key: a test proves which key arrived without the fake keeping it.
        bearer = request.headers.get("authorization", "").removeprefix("Bearer ")
        self.keys.append(hashlib.sha256(bearer.encode()).hexdigest() if bearer else "")
        self.peers.append(request.client.host if request.client else "")
        self.arrivals.append(time.time())
        messages: list[dict[str, Any]] = body.get("messages") or []
        refused = refusal(body, self.context_window)
        if refused is not None:
            text, param, code = refused
            self.rejections.append(text)
            error = {"message": text, "type": "invalid_request_error", "param": param}
            return JSONResponse({"error": {**error, "code": code or None}}, status_code=400)
        answer = self.answer(body)
        meta = {
            "id": f"chatcmpl-{next(self._ids)}",
            "created": int(time.time()),
            "model": body.get("model", "fake"),
        }
        usage = answer.usage(messages)
        if answer.hold is not None:
            await self._released(answer.hold).wait()
        if answer.delay > 0:
            await asyncio.sleep(answer.delay)
        fail = answer.fail
        if fail is not None and fail.status is not None:
            headers = {} if fail.retry_after is None else {"Retry-After": f"{fail.retry_after:g}"}
            return JSONResponse(fail.error_body(), status_code=fail.status, headers=headers)
        if fail is not None and not (fail.after_chunks and body.get("stream")):
            await _drop(request, fail)
            return Response()  # not sent: the connection is gone
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            chunks = _stream(meta, answer, usage if include_usage else None)
            if fail is not None:
                chunks = _dropped_after(chunks, request, fail)
            return StreamingResponse(chunks, media_type="text/event-stream")
        message: dict[str, Any] = {"role": "assistant", "content": answer.content}
        if answer.calls:
            message["tool_calls"] = answer.calls
        choice = {"index": 0, "message": message, "finish_reason": answer.finish_reason}
        return JSONResponse(
            {**meta, "object": "chat.completion", "choices": [choice], "usage": usage}
        )

    async def models(self, request: Request) -> Response:
        model = {"id": "fake", "object": "model", "created": 0, "owned_by": "fake-openai"}
        return JSONResponse({"object": "list", "data": [model]})

    async def requests(self, request: Request) -> Response:
        return JSONResponse(self.received)

    async def key_digests(self, request: Request) -> Response:
        return JSONResponse(self.keys)

    async def peer_addresses(self, request: Request) -> Response:
        return JSONResponse(self.peers)

    async def arrival_times(self, request: Request) -> Response:
        return JSONResponse(self.arrivals)

    async def set_script(self, request: Request) -> Response:
        self.script.rules = parse_rules(await request.json())
        return JSONResponse({"rules": len(self.script.rules)})

    async def release(self, request: Request) -> Response:
        body = await request.json()
        self._released(str(body["hold"])).set()
        return JSONResponse({"released": body["hold"]})

    async def reset(self, request: Request) -> Response:
        self.received.clear()
        self.rejections.clear()
        self.keys.clear()
        self.peers.clear()
        self.arrivals.clear()
        self.script.reset()
        for held in self._holds.values():  # nothing stays stuck behind a forgotten rule
            held.set()
        self._holds.clear()
        return JSONResponse({"ok": True})


async def _drop(request: Request, fail: Failure) -> None:
    """Close the request's connection with no (further) response, then wait until the server
    has seen it go, so that nothing is written after it."""
    # uvicorn's receive callable is a method of the connection's request cycle, which holds the
    # transport; the ASGI interface itself has no way to drop a connection.
    # (uvloop's transports do not derive from asyncio.Transport, hence no isinstance.)
    transport: Any = getattr(getattr(request.receive, "__self__", None), "transport", None)
    if not callable(getattr(transport, "abort", None)):
        raise ScriptError("fake-openai: this server cannot drop connections (no transport)")
    if fail.drop == "reset":
        sock = transport.get_extra_info("socket")
        # A zero linger makes close() send a reset instead of a FIN.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()
    else:
        transport.close()
    try:
        async with asyncio.timeout(10):  # the loop reports a closed transport at once
            while (await request.receive())["type"] != "http.disconnect":
                pass
    except TimeoutError:
        pass  # writes to a closing transport are dropped anyway


async def _dropped_after(
    chunks: AsyncIterator[str], request: Request, fail: Failure
) -> AsyncIterator[str]:
    """The first ``fail.after_chunks`` chunks of a streamed reply, then a dropped connection."""
    sent = 0
    async for piece in chunks:
        if sent == fail.after_chunks:
            break
        yield piece
        sent += 1
    await _drop(request, fail)


async def _stream(
    meta: dict[str, Any], answer: _Answer, usage: dict[str, int] | None
) -> AsyncIterator[str]:
    """SSE lines the way OpenAI streams: role, word deltas, tool call head then argument pieces.

    Async so that Starlette does not hand each chunk to its (40-thread) pool.
    """

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        data = {**meta, "object": "chat.completion.chunk", "choices": [choice]}
        if usage is not None:
            data["usage"] = None
        return f"data: {json.dumps(data)}\n\n"

    yield chunk({"role": "assistant", "content": ""})
    for word in re.split(r"(?<=\s)(?=\S)", answer.content or ""):
        if word:
            yield chunk({"content": word})
    for index, call in enumerate(answer.calls):
        head = {"index": index, "id": call["id"], "type": "function"}
        function = {"name": call["function"]["name"], "arguments": ""}
        yield chunk({"tool_calls": [{**head, "function": function}]})
        arguments: str = call["function"]["arguments"]
        size = max(1, -(-len(arguments) // 4))  # about four fragments per call
        for start in range(0, len(arguments), size):
            piece = {"index": index, "function": {"arguments": arguments[start : start + size]}}
            yield chunk({"tool_calls": [piece]})
    yield chunk({}, answer.finish_reason)
    if usage is not None:
        tail = {**meta, "object": "chat.completion.chunk", "choices": [], "usage": usage}
        yield f"data: {json.dumps(tail)}\n\n"
    yield "data: [DONE]\n\n"


async def _script_error(request: Request, exc: Exception) -> Response:
    error = {"message": str(exc), "type": "fake_openai_script_error", "code": None}
    return JSONResponse({"error": error}, status_code=500)


def create_app(
    script_path: Path | None = None,
    delay: float = 0.0,
    policy: Policy | None = None,
    context_window: int | None = None,
) -> Starlette:
    """The fake's ASGI app; ``script_path`` may be JSON or YAML, ``delay`` is in seconds,
    ``policy`` answers what no rule matches; ``context_window`` (tokens as the fake counts them)
    refuses longer requests as OpenAI does."""
    service = _Service(script_path, delay, policy, context_window)
    routes = [
        Route("/v1/chat/completions", service.chat, methods=["POST"]),
        Route("/chat/completions", service.chat, methods=["POST"]),
        Route("/v1/models", service.models, methods=["GET"]),
        Route("/_requests", service.requests, methods=["GET"]),
        Route("/_keys", service.key_digests, methods=["GET"]),
        Route("/_peers", service.peer_addresses, methods=["GET"]),
        Route("/_arrivals", service.arrival_times, methods=["GET"]),
        Route("/_script", service.set_script, methods=["POST"]),
        Route("/_reset", service.reset, methods=["POST"]),
        Route("/_release", service.release, methods=["POST"]),
    ]
    app = Starlette(routes=routes, exception_handlers={ScriptError: _script_error})
    app.state.service = service
    return app


class _Server(uvicorn.Server):
    """uvicorn server that writes its port to ``port_file`` once it listens."""

    def __init__(self, app: Starlette, port_file: Path | None = None, **options: Any) -> None:
        # The runtime's benchmark holds 200+ slow requests open at once: no concurrency cap.
        options = {"access_log": False, "log_level": "warning", **options}
        super().__init__(uvicorn.Config(app, limit_concurrency=None, backlog=2048, **options))
        self.port_file = port_file

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.port_file is not None and self.started and sockets:
            partial = self.port_file.with_name(self.port_file.name + ".tmp")
            partial.write_text(f"{sockets[0].getsockname()[1]}\n")
            partial.replace(self.port_file)  # atomic: the parent never reads half a port


def _bind(host: str, port: int) -> socket.socket:
    # IPPROTO_TCP explicitly: asyncio only sets TCP_NODELAY on sockets created with it, and with
    # Nagle on every streamed reply waits ~40 ms for a delayed ACK.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


class _InThread:
    """A fake's app served by uvicorn in a daemon thread on a free port of 127.0.0.1."""

    name = "fake-server"

    def __init__(self, app: Starlette, rules: Sequence[Rule | dict[str, Any]] = ()) -> None:
        self.app = app
        #: The fake's state: its rules (``script``) and the request bodies (``received``).
        self._service: Any = app.state.service
        if rules:
            self.set_script(rules)
        self._server = _Server(app, log_config=None)  # leave the test's logging alone
        self._thread: threading.Thread | None = None
        self.port = 0

    def set_script(self, rules: Sequence[Rule | dict[str, Any]]) -> None:
        """Replace the rules (until the script file, if any, changes)."""
        self._service.script.rules = parse_rules(list(rules))

    def requests(self) -> list[dict[str, Any]]:
        """Every request body received so far, refused ones included, in order."""
        return list(self._service.received)

    def release(self, hold: str) -> None:
        """Let the requests held by rules with ``hold`` answer (and later ones pass at once)."""
        self.post("/_release", {"hold": hold})

    def post(self, path: str, body: Any) -> Any:
        """POST ``body`` as JSON to one of the fake's own endpoints; its JSON answer."""
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def __enter__(self) -> Self:
        sock = _bind("127.0.0.1", 0)
        self.port = sock.getsockname()[1]
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name=self.name, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                sock.close()
                raise RuntimeError(f"{self.name} server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)


class FakeOpenAI(_InThread):
    """The fake server in a background thread on a free port, for in-process tests::

    with FakeOpenAI([{"match": "hi", "reply": {"content": "hello"}}]) as fake:
        litellm.completion(model="openai/fake", api_base=fake.base_url, api_key="sk-test", ...)
        assert fake.requests()[0]["messages"][-1]["content"] == "hi"
    """

    name = "fake-openai"

    def __init__(
        self,
        rules: Sequence[Rule | dict[str, Any]] = (),
        *,
        script_path: Path | None = None,
        delay: float = 0.0,
        policy: Policy | None = None,
        context_window: int | None = None,
    ) -> None:
        super().__init__(create_app(script_path, delay, policy, context_window), rules)

    @property
    def base_url(self) -> str:
        """The ``api_base`` for litellm / the OpenAI client: ``http://127.0.0.1:PORT/v1``."""
        return f"http://127.0.0.1:{self.port}/v1"

    def rejections(self) -> list[str]:
        """The message of each request refused as malformed or too long, in order."""
        return list(self._service.rejections)

    def key_digests(self) -> list[str]:
        """The SHA-256 of each chat request's bearer key ("" for none), in order."""
        return list(self._service.keys)

    def peers(self) -> list[str]:
        """The client address of each chat request, in order."""
        return list(self._service.peers)


def start_subprocess(
    script_path: Path | str | None, delay: float = 0.0, *, timeout: float = 30.0
) -> tuple[subprocess.Popen[bytes], str]:
    """Start the fake in its own process; returns it (terminate and wait it) and its base URL."""
    with tempfile.TemporaryDirectory(prefix="fake-openai-") as tmp:
        port_file = Path(tmp) / "port"
        argv = [sys.executable, "-m", "workers.testing.fake_openai", "--host", "127.0.0.1"]
        argv += ["--port", "0", "--port-file", str(port_file), "--delay", str(delay)]
        if script_path is not None:
            argv += ["--script", str(script_path)]
        proc = subprocess.Popen(argv)
        deadline = time.monotonic() + timeout
        while not port_file.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise RuntimeError(f"fake-openai did not start (exit code {proc.returncode})")
            time.sleep(0.02)
        return proc, f"http://127.0.0.1:{port_file.read_text().strip()}/v1"


def main(argv: Sequence[str] | None = None) -> None:
    """Command-line entry point: ``python -m workers.testing.fake_openai --port 0 ...``."""
    parser = argparse.ArgumentParser(prog="python -m workers.testing.fake_openai")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--script", help="rules file (JSON/YAML); default $FAKE_OPENAI_SCRIPT")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each response")
    parser.add_argument("--port-file", type=Path, help="write the bound port here once listening")
    args = parser.parse_args(argv)
    script = args.script or os.environ.get("FAKE_OPENAI_SCRIPT")
    script_path = Path(script) if script else None
    if script_path is not None and not script_path.is_file():
        parser.error(f"--script / FAKE_OPENAI_SCRIPT: no such file {script_path}")
    server = _Server(create_app(script_path, args.delay), port_file=args.port_file)
    sock = _bind(args.host, args.port)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()


if __name__ == "__main__":
    main()
