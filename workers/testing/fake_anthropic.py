"""A scripted server that answers as Anthropic's Messages API does: the fake at that boundary.

It takes the same rules and policy as :mod:`workers.testing.fake_openai` (a rule's ``fail``
answers in Anthropic's error shape; ``status: 529`` is ``overloaded_error``) and is as strict as
the real API about what a client sends, so a request the runtime shapes badly is refused here
the way Anthropic refuses it, with Anthropic's words:

- ``x-api-key`` and ``anthropic-version`` headers; ``max_tokens`` required and within the
  model's output limit; no ``system`` role inside ``messages`` (it is a top-level field);
- messages start with ``user`` and alternate; no empty content; every ``tool_use`` answered by a
  ``tool_result`` in the next message and every ``tool_result`` answering one in the previous;
- at most four ``cache_control`` breakpoints;
- the context window: ``prompt is too long: N tokens > W maximum``, and input plus
  ``max_tokens`` past the window.

Prompt caching is simulated as Anthropic describes it: the prompt is the tools, then the
system blocks, then each message's blocks; a breakpoint caches the prefix that ends at its
block once it holds at least ``min_cacheable`` tokens; a later request reads the longest cached
prefix that ends at one of its breakpoints or at most 20 blocks before one. Usage reports
``input_tokens`` (not cached), ``cache_creation_input_tokens`` and ``cache_read_input_tokens``.
Tokens are counted as four characters of each block's JSON; :meth:`FakeAnthropic.prompt_tokens`
gives each request's count.

Streaming sends ``message_start``, ``content_block_start`` / ``_delta`` (``text_delta``,
``input_json_delta`` in pieces) / ``_stop``, ``message_delta`` and ``message_stop``, as the API
does. litellm reaches it with ``api_base=fake.base_url`` (or ``ANTHROPIC_API_BASE``).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import re
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

# The rule language, the policy and the server plumbing are fake_openai's: one fake, two wires.
from workers.testing.fake_openai import (
    DEFAULT_REPLY,
    Failure,
    Policy,
    Reply,
    Rule,
    ScriptError,
    _drop,
    _dropped_after,
    _InThread,
    _Script,
)

__all__ = ["AnthropicError", "FakeAnthropic", "Usage", "block_text", "blocks", "create_app"]

#: Anthropic's error type and usual message for each status it answers with.
_ERRORS = {
    400: ("invalid_request_error", "Invalid request"),
    401: ("authentication_error", "invalid x-api-key"),
    403: (
        "permission_error",
        "Your API key does not have permission to use the specified resource.",
    ),
    404: ("not_found_error", "Not found"),
    413: ("request_too_large", "Request exceeds the maximum allowed number of bytes."),
    429: ("rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit"),
    500: ("api_error", "Internal server error"),
    529: ("overloaded_error", "Overloaded"),
}
#: Blocks before a breakpoint at which the API still looks for a cached prefix.
_LOOKBACK = 20


class AnthropicError(Exception):
    """A request the API refuses: answered with ``status`` and Anthropic's error body."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def body(self) -> dict[str, Any]:
        kind, usual = _ERRORS.get(self.status, ("api_error", "Internal server error"))
        error = {"type": kind, "message": self.message or usual}
        return {"type": "error", "error": error, "request_id": f"req_fake_{id(self):x}"}


def _invalid(message: str) -> AnthropicError:
    return AnthropicError(400, message)


def blocks(content: Any) -> list[dict[str, Any]]:
    """A message content as Anthropic's blocks: a string is one text block."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def block_text(content: Any) -> str:
    """The text of a content: its text blocks and the text of its tool results."""
    parts = []
    for block in blocks(content):
        if block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        elif block.get("type") == "tool_result":
            parts.append(block_text(block.get("content", "")))
    return "\n".join(parts)


def _check(body: dict[str, Any], max_output: int) -> None:
    """Refuse what the Messages API refuses, in its words (checked in the API's order)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _invalid("model: Field required")
    if "max_tokens" not in body:
        raise _invalid("max_tokens: Field required")
    wanted = body["max_tokens"]
    if not isinstance(wanted, int) or wanted < 1:
        raise _invalid("max_tokens: Input should be a valid integer greater than or equal to 1")
    if wanted > max_output:
        raise _invalid(
            f"max_tokens: {wanted} > {max_output}, which is the maximum allowed number of "
            f"output tokens for {model}"
        )
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _invalid("messages: at least one message is required")
    previous_uses: set[str] = set()
    for n, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role == "system":
            raise _invalid(
                'messages: Unexpected role "system". The Messages API accepts a top-level '
                '`system` parameter, not "system" as an input message role.'
            )
        if role not in ("user", "assistant"):
            raise _invalid(f"messages.{n}.role: Input should be 'user' or 'assistant'")
        if n == 0 and role != "user":
            raise _invalid('messages: first message must use the "user" role')
        if n > 0 and messages[n - 1].get("role") == role:
            raise _invalid(
                'messages: roles must alternate between "user" and "assistant", but found '
                f'multiple "{role}" roles in a row'
            )
        parts = blocks(message.get("content"))
        last = n == len(messages) - 1
        if not parts and not (last and role == "assistant"):
            raise _invalid(
                f"messages.{n}: all messages must have non-empty content except for the "
                "optional final assistant message"
            )
        for b, block in enumerate(parts):
            if block.get("type") == "text" and not block.get("text") and not last:
                raise _invalid(
                    f"messages.{n}.content.{b}.text: text content blocks must be non-empty"
                )
        answered = {b.get("tool_use_id") for b in parts if b.get("type") == "tool_result"}
        if role == "user":
            missing = sorted(previous_uses - answered)
            if missing:
                raise _invalid(
                    f"messages.{n - 1}: `tool_use` ids were found without `tool_result` blocks "
                    f"immediately after: {', '.join(missing)}. Each `tool_use` block must have "
                    "a corresponding `tool_result` block in the next message."
                )
            stray = sorted(str(i) for i in answered - previous_uses)
            if stray:
                raise _invalid(
                    f"messages.{n}.content.0: unexpected `tool_use_id` found in `tool_result` "
                    f"blocks: {', '.join(stray)}. Each `tool_result` block must have a "
                    "corresponding `tool_use` block in the previous message."
                )
            previous_uses = set()
        else:
            previous_uses = {str(b.get("id")) for b in parts if b.get("type") == "tool_use"}
            if answered:
                raise _invalid(f"messages.{n}: `tool_result` blocks can only be in user messages")
    if previous_uses:
        raise _invalid(
            f"messages.{len(messages) - 1}: `tool_use` ids were found without `tool_result` "
            f"blocks immediately after: {', '.join(sorted(previous_uses))}. Each `tool_use` "
            "block must have a corresponding `tool_result` block in the next message."
        )
    breakpoints = sum(1 for block in _prompt_blocks(body) if "cache_control" in block)
    if breakpoints > 4:
        raise _invalid(
            f"A maximum of 4 blocks with cache_control may be provided. Found {breakpoints}."
        )


def _prompt_blocks(body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The prompt in the order the cache sees it: tools, system, then each message's blocks."""
    yield from (t for t in body.get("tools") or [] if isinstance(t, dict))
    yield from blocks(body.get("system"))
    for message in body.get("messages") or []:
        yield from blocks(message.get("content"))


def count_tokens(block: dict[str, Any]) -> int:
    """A block's tokens: four characters of its JSON (without its breakpoint) a token."""
    return max(1, len(json.dumps(_unmarked(block), sort_keys=True)) // 4)


def _unmarked(block: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in block.items() if k != "cache_control"}


@dataclass
class Usage:
    """The input of one request as Anthropic bills it."""

    input_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0

    @property
    def prompt_tokens(self) -> int:
        return self.input_tokens + self.cache_creation_input_tokens + self.cache_read_input_tokens


@dataclass
class _Cache:
    """Prefixes written by breakpoints, by (model, digest of the prefix)."""

    min_cacheable: int
    written: set[tuple[str, str]] = field(default_factory=set)

    def usage(self, body: dict[str, Any]) -> Usage:
        model = str(body.get("model"))
        digest = hashlib.sha256()
        ends: list[tuple[str, int]] = []  # (digest, tokens) of the prefix ending at each block
        marks: list[int] = []
        total = 0
        for number, block in enumerate(_prompt_blocks(body)):
            digest.update(json.dumps(_unmarked(block), sort_keys=True).encode())
            total += count_tokens(block)
            ends.append((digest.copy().hexdigest(), total))
            if "cache_control" in block:
                marks.append(number)
        read = 0
        for mark in marks:
            for number in range(mark, max(-1, mark - _LOOKBACK - 1), -1):
                if (model, ends[number][0]) in self.written:
                    read = max(read, ends[number][1])
                    break
        cached = read
        for mark in marks:
            prefix, tokens = ends[mark]
            if tokens >= self.min_cacheable:
                self.written.add((model, prefix))
                cached = max(cached, tokens)
        return Usage(total - cached, cached - read, read)


@dataclass(frozen=True)
class _Answer:
    blocks: list[dict[str, Any]]
    rule: Rule | None

    @property
    def stop_reason(self) -> str:
        return "tool_use" if any(b["type"] == "tool_use" for b in self.blocks) else "end_turn"

    @property
    def output_tokens(self) -> int:
        return sum(count_tokens(b) for b in self.blocks)


def _as_chat(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The conversation as the rules read it: ``system`` first, then the messages' text."""
    chat = [{"role": "system", "content": block_text(body.get("system"))}]
    return chat + [
        {"role": m.get("role"), "content": block_text(m.get("content"))} for m in body["messages"]
    ]


class _Service:
    """The fake's state and endpoints."""

    def __init__(
        self,
        policy: Policy | None,
        *,
        context_window: int,
        max_output: int,
        min_cacheable: int,
    ) -> None:
        self.script = _Script(None)
        self.policy = policy
        self.context_window = context_window
        self.max_output = max_output
        self.cache = _Cache(min_cacheable)
        self.received: list[dict[str, Any]] = []
        #: When each Messages request arrived (monotonic seconds), refused ones included.
        self.arrivals: list[float] = []
        self.usages: list[Usage] = []
        #: Each refused request's status and message, in order.
        self.rejections: list[tuple[int, str]] = []
        self._ids = itertools.count(1)
        self._uses = itertools.count(1)
        self._holds: dict[str, asyncio.Event] = {}

    def _released(self, name: str) -> asyncio.Event:
        return self._holds.setdefault(name, asyncio.Event())

    def answer(self, body: dict[str, Any]) -> _Answer:
        chat = _as_chat(body)
        turn = sum(1 for m in chat if m["role"] == "assistant")
        rule = self.script.choose(chat, turn)
        reply = rule.reply if rule else self._decide(body)
        user = [m for m in chat if m["role"] == "user"]
        text = user[-1]["content"] if reply.echo and user else reply.content
        blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
        for call in reply.tool_calls:
            arguments = call.arguments
            if isinstance(arguments, str):  # the API only ever sends an object
                arguments = json.loads(arguments)
            uid = f"toolu_fake{next(self._uses):06d}"
            blocks.append({"type": "tool_use", "id": uid, "name": call.name, "input": arguments})
        return _Answer(blocks, rule)

    def _decide(self, body: dict[str, Any]) -> Reply:
        if self.policy is None:
            return Reply(content=DEFAULT_REPLY)
        try:
            return self.policy(body)
        except Exception as exc:  # noqa: BLE001 - the client is told why, as a server error
            raise ScriptError(
                f"the fake-anthropic policy failed: {type(exc).__name__}: {exc}"
            ) from exc

    def _refuse(self, error: AnthropicError) -> Response:
        self.rejections.append((error.status, error.message))
        return JSONResponse(error.body(), status_code=error.status)

    async def messages(self, request: Request) -> Response:
        try:
            body: dict[str, Any] = await request.json()
        except ValueError:
            return self._refuse(
                _invalid("There was an issue with your request body: not valid JSON")
            )
        self.received.append(body)
        self.arrivals.append(time.monotonic())
        if not request.headers.get("x-api-key"):
            return self._refuse(AnthropicError(401, "x-api-key header is required"))
        if not request.headers.get("anthropic-version"):
            return self._refuse(_invalid("anthropic-version: header is required"))
        try:
            _check(body, self.max_output)
        except AnthropicError as error:
            return self._refuse(error)
        prompt = sum(count_tokens(b) for b in _prompt_blocks(body))
        if prompt > self.context_window:
            return self._refuse(
                _invalid(f"prompt is too long: {prompt} tokens > {self.context_window} maximum")
            )
        if prompt + body["max_tokens"] > self.context_window:
            return self._refuse(
                _invalid(
                    "input length and `max_tokens` exceed context limit: "
                    f"{prompt} + {body['max_tokens']} > {self.context_window}, decrease input "
                    "length or `max_tokens` and try again"
                )
            )
        answer = self.answer(body)
        rule = answer.rule
        if rule is not None and rule.hold is not None:
            await self._released(rule.hold).wait()
        if rule is not None and rule.delay:
            await asyncio.sleep(rule.delay)
        fail = rule.fail if rule is not None else None
        if fail is not None and fail.status is not None:
            return self._failed(fail)
        if fail is not None and not (fail.after_chunks and body.get("stream")):
            await _drop(request, fail)
            return Response()  # not sent: the connection is gone
        usage = self.cache.usage(body)
        self.usages.append(usage)
        message = {
            "id": f"msg_fake{next(self._ids):06d}",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": answer.blocks,
            "stop_reason": answer.stop_reason,
            "stop_sequence": None,
            "usage": {
                "input_tokens": usage.input_tokens,
                "cache_creation_input_tokens": usage.cache_creation_input_tokens,
                "cache_read_input_tokens": usage.cache_read_input_tokens,
                "output_tokens": answer.output_tokens,
            },
        }
        if not body.get("stream"):
            return JSONResponse(message)
        events = _stream(message)
        if fail is not None:
            events = _dropped_after(events, request, fail)
        return StreamingResponse(events, media_type="text/event-stream")

    def _failed(self, fail: Failure) -> Response:
        assert fail.status is not None
        error = AnthropicError(fail.status, fail.message)
        headers = {} if fail.retry_after is None else {"retry-after": f"{fail.retry_after:g}"}
        return JSONResponse(error.body(), status_code=fail.status, headers=headers)

    async def count(self, request: Request) -> Response:
        body = await request.json()
        return JSONResponse({"input_tokens": sum(count_tokens(b) for b in _prompt_blocks(body))})

    async def release(self, request: Request) -> Response:
        body = await request.json()
        self._released(str(body["hold"])).set()
        return JSONResponse({"released": body["hold"]})


def _sse(kind: str, data: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n"


async def _stream(message: dict[str, Any]) -> AsyncIterator[str]:
    """The message as Anthropic streams it: text in word deltas, tool input in JSON pieces."""
    usage = dict(message["usage"])
    start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
    yield _sse("message_start", {"message": start})
    yield _sse("ping", {})
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            yield _sse(
                "content_block_start",
                {"index": index, "content_block": {"type": "text", "text": ""}},
            )
            for word in re.split(r"(?<=\s)(?=\S)", block["text"]):
                delta = {"type": "text_delta", "text": word}
                yield _sse("content_block_delta", {"index": index, "delta": delta})
        else:
            head = {**block, "input": {}}
            yield _sse("content_block_start", {"index": index, "content_block": head})
            arguments = json.dumps(block["input"])
            size = max(1, -(-len(arguments) // 4))  # about four pieces per call
            for at in range(0, len(arguments), size):
                delta = {"type": "input_json_delta", "partial_json": arguments[at : at + size]}
                yield _sse("content_block_delta", {"index": index, "delta": delta})
        yield _sse("content_block_stop", {"index": index})
    end = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    yield _sse("message_delta", {"delta": end, "usage": {"output_tokens": usage["output_tokens"]}})
    yield _sse("message_stop", {})


async def _script_error(request: Request, exc: Exception) -> Response:
    return JSONResponse(AnthropicError(500, str(exc)).body(), status_code=500)


def create_app(
    policy: Policy | None = None,
    *,
    context_window: int = 200_000,
    max_output: int = 64_000,
    min_cacheable: int = 1024,
) -> Starlette:
    """The fake's ASGI app."""
    service = _Service(
        policy, context_window=context_window, max_output=max_output, min_cacheable=min_cacheable
    )
    routes = [
        Route("/v1/messages", service.messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", service.count, methods=["POST"]),
        Route("/_release", service.release, methods=["POST"]),
    ]
    app = Starlette(routes=routes, exception_handlers={ScriptError: _script_error})
    app.state.service = service
    return app


class FakeAnthropic(_InThread):
    """The fake Messages API in a background thread on a free port, for in-process tests::

    with FakeAnthropic(policy=decide, context_window=60_000) as fake:
        litellm.completion(model="anthropic/claude-sonnet-4-6", api_base=fake.base_url, ...)
        assert fake.rejections() == []
    """

    name = "fake-anthropic"

    def __init__(
        self,
        rules: Sequence[Rule | dict[str, Any]] = (),
        *,
        policy: Policy | None = None,
        context_window: int = 200_000,
        max_output: int = 64_000,
        min_cacheable: int = 1024,
    ) -> None:
        app = create_app(
            policy,
            context_window=context_window,
            max_output=max_output,
            min_cacheable=min_cacheable,
        )
        super().__init__(app, rules)

    @property
    def base_url(self) -> str:
        """The ``api_base`` for litellm's Anthropic adapter (it adds ``/v1/messages``)."""
        return f"http://127.0.0.1:{self.port}"

    def arrivals(self) -> list[float]:
        """When each Messages request arrived (``time.monotonic()``), in order."""
        return list(self._service.arrivals)

    def usages(self) -> list[Usage]:
        """The billed input of each answered request, in order."""
        return list(self._service.usages)

    def prompt_tokens(self) -> list[int]:
        """Each answered request's whole input in tokens (cached or not), in order."""
        return [u.prompt_tokens for u in self._service.usages]

    def rejections(self) -> list[tuple[int, str]]:
        """The status and message of each request refused as invalid, in order."""
        return list(self._service.rejections)
