"""The litellm adapter: with :mod:`workers._litellm_direct` (its cheapest path for a reply in
one piece), the only code that imports litellm.

Importing this module touches neither litellm nor the environment; :func:`load` does both, once,
and every use goes through it (:class:`LitellmModel`, :func:`readiness`). litellm fetches
its model cost map from the internet at import unless ``LITELLM_LOCAL_MODEL_COST_MAP`` is set, so
:func:`load` sets it first and the runtime works air-gapped. Provider keys come from a
:class:`~workers.hardening.ProviderCredentials` (a worker takes them out of ``os.environ`` at
start) and are passed to each call; other provider variables (``OPENAI_API_BASE``…) are read by
litellm as it documents them.

The project's messages and tool specs become OpenAI's shapes here, which litellm speaks for every
provider, and litellm's exceptions become :class:`~workers.model.ModelError` with a short cause.
"""

from __future__ import annotations

import email.utils
import functools
import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from workers import _litellm_direct as direct
from workers.hardening import ProviderCredentials
from workers.messages import Message, ToolCall, Usage
from workers.model import ModelError, ModelReply, ModelRequest, Readiness, ToolSpec, status_cause

__all__ = ["LitellmModel", "load", "readiness"]

log = logging.getLogger(__name__)

_lock = threading.Lock()
_loaded: ModuleType | None = None

#: Connections litellm's async HTTP client may open, per host too: more than any worker holds.
_CONNECTIONS = 65536
#: A call's arguments that are no model parameter: the direct path passes them on its own.
_CALL_SETTINGS = frozenset({"model", "messages", "timeout", "api_base", "api_key"})
#: Statuses worth another attempt besides every 5xx (as the OpenAI SDK retries them).
_RETRYABLE_STATUS = frozenset({408, 409, 429})


def load() -> ModuleType:
    """Import and configure litellm, once per process (thread-safe); returns the module.

    ``LITELLM_LOCAL_MODEL_COST_MAP``, ``LITELLM_LOG`` and aiohttp's connector limits are set (unless
    already set) before the
    import, which reads them.
    """
    global _loaded
    with _lock:
        if _loaded is not None:
            return _loaded
        if "litellm" in sys.modules and not os.environ.get("LITELLM_LOCAL_MODEL_COST_MAP"):
            log.warning(
                "litellm was imported before workers._litellm.load() set "
                "LITELLM_LOCAL_MODEL_COST_MAP: that import may have fetched litellm's model cost "
                "map from the internet (it fails or stalls on an air-gapped host)"
            )
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        os.environ.setdefault("LITELLM_LOG", "ERROR")
        # litellm's async calls go through aiohttp, whose connector allows 1000 connections,
        # 500 per host: a worker holding more spawns than that on one provider would queue its
        # model calls behind the limit. The spawns a worker takes (its concurrency) bound them.
        # (0 is no way out: litellm then passes no limit, and aiohttp's own default is 100.)
        os.environ.setdefault("AIOHTTP_CONNECTOR_LIMIT", str(_CONNECTIONS))
        os.environ.setdefault("AIOHTTP_CONNECTOR_LIMIT_PER_HOST", str(_CONNECTIONS))
        import litellm

        litellm.telemetry = False
        litellm.suppress_debug_info = True
        # Per-chunk success logging only feeds litellm callbacks, which the runtime does not use.
        litellm.disable_streaming_logging = True
        # Measured (bench/litellm_paths.py): replacing litellm's own async transport with an
        # httpx pool costs 2-6x the CPU per call; its default is the right one, so it is kept.
        _install_lean_metadata(litellm)
        _loaded = litellm
        return litellm


# --- the lean call ------------------------------------------------------------------------------
#
# After each reply litellm builds a logging payload for its callbacks and prices the reply through
# its full cost calculator to stamp it on the response: together a quarter of the CPU of a call
# (bench/engine_load.py, profiled). With no litellm callback registered nobody reads either, and
# the adapter prices the reply itself from its usage (``litellm.cost_per_token``, a fraction of
# that). So while no callback is registered each call runs as litellm's own internal sub-calls do
# (``internal_sub_call``: no success or failure logging) and skips the response-metadata step.
# Registering any litellm callback turns both back on for the calls that follow.

#: True while one of the adapter's lean calls runs (a context variable: only that call's task
#: and the threads litellm runs it in see it).
_LEAN: ContextVar[bool] = ContextVar("ongrid_litellm_lean", default=False)

#: litellm's callback lists; any entry in one means somebody reads what a lean call skips.
_CALLBACK_LISTS = (
    "callbacks",
    "input_callback",
    "success_callback",
    "failure_callback",
    "service_callback",
    "_async_success_callback",
    "_async_failure_callback",
    "_async_input_callback",
)


def _install_lean_metadata(litellm: ModuleType) -> None:
    """Wrap litellm's ``update_response_metadata`` so that a lean call skips it (litellm looks
    the function up on its ``utils`` module at each call). A litellm without it: calls run in
    full, as before, and the log says so once."""
    utils: Any = getattr(litellm, "utils", None)
    original = getattr(utils, "update_response_metadata", None)
    if original is None or getattr(original, "ongrid_lean", False):
        if original is None:
            log.info("litellm has no utils.update_response_metadata: model calls run in full")
        return

    @functools.wraps(original)
    def update_response_metadata(*args: Any, **kwargs: Any) -> Any:
        if _LEAN.get():
            return None
        return original(*args, **kwargs)

    update_response_metadata.ongrid_lean = True  # type: ignore[attr-defined]
    utils.update_response_metadata = update_response_metadata


def _lean_possible(litellm: ModuleType) -> bool:
    """No litellm callback is registered: nothing reads the logging a lean call skips."""
    utils: Any = getattr(litellm, "utils", None)
    if not getattr(getattr(utils, "update_response_metadata", None), "ongrid_lean", False):
        return False
    return not any(getattr(litellm, name, None) for name in _CALLBACK_LISTS)


@contextmanager
def _lean_call(litellm: ModuleType) -> Iterator[bool]:
    """Run the call inside lean (see above) when nothing needs litellm's logging; yields
    whether it is."""
    if not _lean_possible(litellm):
        yield False
        return
    try:
        from litellm._internal_context import internal_sub_call
    except ImportError:  # an older litellm: its logging runs, only the metadata step is skipped
        internal_sub_call = nullcontext  # type: ignore[assignment]
    token = _LEAN.set(True)
    try:
        with internal_sub_call():
            yield True
    finally:
        _LEAN.reset(token)


_priced: set[str] = set()
_price_lock = threading.Lock()


def _price_unmapped(litellm: ModuleType, model: str) -> None:
    """Register a zero price for a model litellm's cost map lacks, once per model.

    Without one, litellm's cost calculation raises (and catches) on every call: the largest
    single cost of a call through it (about 1.6 ms of CPU of a streamed call, measured). Such a
    model's cost is reported as 0.0, as it was before.
    """
    if model in _priced:
        return
    with _price_lock:
        _priced.add(model)
        try:
            litellm.get_model_info(model)
            return
        except Exception:  # noqa: BLE001 - litellm raises for a model it has no entry for
            pass
        provider = _provider(model)
        if provider is None:
            return  # the call itself fails, naming the provider nobody knows
        # Under its full id only: an entry for the bare name would also route that name.
        price = {
            "input_cost_per_token": 0.0,
            "output_cost_per_token": 0.0,
            "litellm_provider": provider,
            "mode": "chat",
        }
        litellm.register_model({model: price})


# --- the project's types → OpenAI's shapes ----------------------------------------------------


def _openai_message(message: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        ]
        out["content"] = message.content or None  # OpenAI wants null, not "", beside tool calls
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.name is not None and message.role == "tool":
        out["name"] = message.name
    return out


def _openai_tool(tool: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        },
    }


# --- credentials --------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1024)
def _provider(model_id: str) -> str | None:
    """litellm's provider of ``model_id``; ``None`` for a provider it does not know."""
    litellm = load()
    try:
        return str(litellm.get_llm_provider(model_id)[1])
    except Exception:  # noqa: BLE001 - litellm raises BadRequestError for an unknown provider
        return None


#: Keys of providers litellm's ``validate_environment`` reports nothing for although their calls
#: fail without them.
_UNREPORTED_KEYS = {"zai": "ZAI_API_KEY"}
#: Providers that run on this machine by default: litellm asks for their URL, but has one.
_LOCAL_BY_DEFAULT = frozenset({"ollama", "ollama_chat"})


def readiness(model_id: str, credentials: ProviderCredentials | None = None) -> Readiness:
    """Whether litellm can route ``model_id`` (``provider/model``, or a bare name it maps,
    such as ``gpt-4o-mini``) and which variables its provider still needs, read from
    ``credentials`` and the environment."""
    provider = _provider(model_id)
    if provider is None:
        return Readiness(None)
    if credentials is not None and credentials.for_provider(provider):
        return Readiness(provider)
    try:
        missing = list(load().validate_environment(model=model_id)["missing_keys"])
    except Exception:  # noqa: BLE001 - litellm raises for ids it cannot parse
        return Readiness(None)
    unreported = _UNREPORTED_KEYS.get(provider)
    if unreported and not os.environ.get(unreported):
        missing.append(unreported)
    if provider in _LOCAL_BY_DEFAULT:
        missing = [m for m in missing if not m.endswith("_API_BASE")]
    return Readiness(provider, tuple(dict.fromkeys(missing)))


# --- prompt caching ------------------------------------------------------------------------------

#: Anthropic's breakpoint: the prefix up to and including the marked block is cached.
_EPHEMERAL = {"type": "ephemeral"}


@functools.lru_cache(maxsize=1024)
def _breakpoint_caching(model_id: str) -> bool:
    """Whether ``model_id`` is cached through Anthropic's ``cache_control`` breakpoints
    (Claude on Anthropic's API, Bedrock, Vertex AI…), as litellm decides it."""
    provider = _provider(model_id)
    if provider == "anthropic":
        return True
    try:
        from litellm.llms.anthropic.common_utils import supports_anthropic_cache_control
    except ImportError:  # an older litellm: Anthropic's own API only
        return False
    return bool(supports_anthropic_cache_control(model_id, provider))


def _caching(request: ModelRequest) -> dict[str, Any]:
    """OpenAI's ``prompt_cache_key``: requests carrying the same key land on the same cache."""
    if request.cache_key and request.stable and _provider(request.model) == "openai":
        return {"prompt_cache_key": request.cache_key}
    return {}


def _mark_breakpoints(request: ModelRequest, arguments: dict[str, Any]) -> None:
    """Put Anthropic's cache breakpoints (four at most) on the prefix later turns send again.

    Anthropic caches in the order tools → system → messages, so a mark on the system prompt
    caches the tools with it (the last tool is marked only where there is no system prompt).
    The other marks go on the persona's opening message (which compaction keeps, so its prefix
    is read back even after older turns were replaced), the last message before the results a
    shrink may change next (``request.settled``) and the last message of the stable prefix
    (``request.stable``); the turn's reminder comes after them and never breaks the prefix.
    """
    if not request.stable or not _breakpoint_caching(request.model):
        return
    messages: list[dict[str, Any]] = arguments["messages"]
    has_system = bool(messages) and messages[0]["role"] == "system"
    wanted = (0, _first_user(messages), request.settled - 1, request.stable - 1)
    marked = {i for i in wanted if 0 <= i < len(messages)}
    for index in marked:
        message = messages[index]
        # litellm carries an assistant message's mark to its text only; a mark on its last
        # tool call lands on the last block, where it belongs.
        calls = message.get("tool_calls") if message["role"] == "assistant" else None
        (calls[-1] if calls else message)["cache_control"] = _EPHEMERAL
    if arguments["tools"] and not has_system:
        arguments["tools"][-1]["cache_control"] = _EPHEMERAL


def _first_user(messages: list[dict[str, Any]]) -> int:
    return next((i for i, m in enumerate(messages) if m["role"] == "user"), -1)


# --- the streamed reply -------------------------------------------------------------------------


@dataclass
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class _Reply:
    """The reply rebuilt from streamed chunks as they pass.

    It follows litellm's ``stream_chunk_builder`` (tool-call fragments keyed by index; ids and
    names replaced, arguments joined) but needs no second pass over the chunks: litellm has
    already built the full response once to put usage and cost on its closing usage chunk.
    """

    text: list[str] = field(default_factory=list)
    calls: list[_PartialCall] = field(default_factory=list)
    _at: dict[int, _PartialCall] = field(default_factory=dict)
    """The call each streamed index currently adds to."""
    finish_reason: str | None = None
    usage: Any = None
    cost: float | None = None

    def add(self, chunk: Any) -> str:
        """Take one chunk in; return its text delta ("" when it has none)."""
        usage = getattr(chunk, "usage", None)
        if usage is not None:
            self.usage = usage
            self.cost = _cost_of(chunk, usage)
        if not chunk.choices:
            return ""
        choice = chunk.choices[0]
        self.finish_reason = choice.finish_reason or self.finish_reason
        delta = choice.delta
        for fragment in getattr(delta, "tool_calls", None) or ():
            self._add_call(fragment)
        content = getattr(delta, "content", None)
        if content:
            self.text.append(content)
            return str(content)
        return ""

    def _add_call(self, fragment: Any) -> None:
        index = getattr(fragment, "index", None) or 0
        fragment_id = getattr(fragment, "id", None)
        call = self._at.get(index)
        # A new id at a known index is a new call: some providers number every call 0.
        if call is None or (fragment_id and call.id and fragment_id != call.id):
            call = self._at[index] = _PartialCall()
            self.calls.append(call)
        function = getattr(fragment, "function", None)
        call.id = fragment_id or call.id
        call.name = getattr(function, "name", None) or call.name
        if piece := getattr(function, "arguments", None):
            call.arguments.append(piece)

    @property
    def complete(self) -> bool:
        """litellm's closing usage chunk has arrived: the provider's stream is over."""
        return self.usage is not None and self.finish_reason is not None

    def message(self) -> Message:
        calls = [
            ToolCall(id=c.id, name=c.name, arguments="".join(c.arguments) or "{}")
            for c in self.calls
            if c.name
        ]
        return Message(role="assistant", content="".join(self.text), tool_calls=calls)

    def to_usage(self, model: str) -> Usage:
        prompt = getattr(self.usage, "prompt_tokens", 0) or 0
        completion = getattr(self.usage, "completion_tokens", 0) or 0
        if self.cost is not None:
            cost = self.cost
        else:
            cost = _price(model, self.usage) if self.usage is not None else 0.0
        written, read = _cache_tokens(self.usage)
        return Usage(
            prompt_tokens=prompt,
            completion_tokens=completion,
            total_tokens=prompt + completion,
            cost=cost,
            model_calls=1,
            cache_write_tokens=written,
            cache_read_tokens=read,
        )


def _cache_tokens(usage: Any) -> tuple[int, int]:
    """``(written, read)``: the input tokens a call wrote to the provider's prompt cache and
    read from it, both included in litellm's ``prompt_tokens``. Anthropic reports both;
    OpenAI reads only (``prompt_tokens_details.cached_tokens``)."""

    def count(value: Any) -> int:
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    written = count(getattr(usage, "cache_creation_input_tokens", None))
    read = count(getattr(usage, "cache_read_input_tokens", None))
    if not read:
        details = getattr(usage, "prompt_tokens_details", None)
        read = count(getattr(details, "cached_tokens", None))
    return written, read


def _cost_of(chunk: Any, usage: Any) -> float | None:
    """The cost litellm computed for the whole response and stamped on its usage chunk."""
    for value in (
        getattr(usage, "cost", None),
        (getattr(chunk, "_hidden_params", None) or {}).get("response_cost"),
    ):
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return None


def _price(model: str, usage: Any) -> float:
    """The reply's cost from its usage at litellm's prices (cached input read and written at
    their own rates) when litellm stamped none (a lean call): 0.0 for an unpriced model."""
    try:
        # The provider given: litellm would otherwise resolve it again for every reply.
        prompt_cost, completion_cost = load().cost_per_token(
            model=model, custom_llm_provider=_provider(model), usage_object=usage
        )
    except Exception:  # noqa: BLE001 - no price known for this model: cost unknown, not an error
        return 0.0
    return float(prompt_cost + completion_cost)


class LitellmModel:
    """Streams a chat completion through litellm and rebuilds the full reply from the chunks.

    ``max_retries`` is handed to the provider client and is 0 by default: the runtime retries
    failed calls itself (:class:`~workers.model.RetryingModel`), with its own bounds, and reports
    each attempt; the OpenAI SDK's own retries would multiply those and stay invisible.
    ``credentials`` supply each provider's key; ``api_base`` / ``api_key`` override both them and
    the provider's environment variables.
    """

    def __init__(
        self,
        *,
        timeout: float = 600.0,
        max_retries: int = 0,
        api_base: str | None = None,
        api_key: str | None = None,
        credentials: ProviderCredentials | None = None,
    ) -> None:
        load()
        self.timeout = timeout
        self.credentials = credentials or ProviderCredentials()
        options = {"max_retries": max_retries, "api_base": api_base, "api_key": api_key}
        self.options: dict[str, Any] = {k: v for k, v in options.items() if v is not None}

    def _call_options(self, model: str) -> dict[str, Any]:
        provider = _provider(model)
        given = self.credentials.for_provider(provider) if provider else {}
        return {**given, **self.options}

    async def stream(self, request: ModelRequest) -> AsyncIterator[str | ModelReply]:
        import httpx
        import openai  # litellm's exceptions derive from the OpenAI SDK's

        litellm = load()
        _price_unmapped(litellm, request.model)
        arguments: dict[str, Any] = {
            "model": request.model,
            "messages": [_openai_message(m) for m in request.messages],
            "tools": [_openai_tool(t) for t in request.tools] or None,
            "timeout": self.timeout,
            **_caching(request),
            **self._call_options(request.model),
        }
        if request.max_tokens is not None:
            arguments["max_tokens"] = request.max_tokens
        _mark_breakpoints(request, arguments)
        try:
            if request.stream:
                reply = _Reply()
                async for text in self._streamed(litellm, arguments, reply):
                    yield text
            else:
                reply = _whole(await self._whole_call(litellm, arguments))
                if reply.text:
                    yield "".join(reply.text)
        except (openai.OpenAIError, httpx.HTTPError) as exc:
            raise _model_error(request.model, exc, self.timeout) from exc
        if reply.finish_reason is None and not reply.text and not reply.calls:
            raise ModelError(
                request.model, "empty response stream", retryable=True, cause="empty response"
            )
        message = reply.message()
        finish = reply.finish_reason or ("tool_calls" if message.tool_calls else "stop")
        yield ModelReply(message=message, usage=reply.to_usage(request.model), finish_reason=finish)

    @staticmethod
    async def _whole_call(litellm: ModuleType, arguments: dict[str, Any]) -> Any:
        """The reply in one piece: straight through the provider's adapter when the call can
        go that way (:mod:`workers._litellm_direct`), else through ``acompletion``."""
        with _lean_call(litellm) as lean:
            # The OpenAI SDK's own retries (``max_retries``) exist only on the full path.
            chosen = None
            if lean and not arguments.get("max_retries"):
                chosen = direct.route(litellm, arguments["model"], arguments.get("api_base"))
            if chosen is not None:
                params = {k: v for k, v in arguments.items() if k not in _CALL_SETTINGS}
                response = await direct.complete(
                    litellm,
                    chosen,
                    messages=arguments["messages"],
                    params=params,
                    seconds=arguments["timeout"],
                    api_base=arguments.get("api_base"),
                    api_key=arguments.get("api_key"),
                )
                if response is not None:
                    return response
            return await litellm.acompletion(**arguments, stream=False)

    @staticmethod
    async def _streamed(
        litellm: ModuleType, arguments: dict[str, Any], reply: _Reply
    ) -> AsyncIterator[str]:
        response: Any = None
        try:
            with _lean_call(litellm):
                response = await litellm.acompletion(
                    **arguments, stream=True, stream_options={"include_usage": True}
                )
            async for chunk in response:
                text = reply.add(chunk)
                if text:
                    yield text
                if reply.complete:
                    break  # iterating on would only make litellm rebuild the response again
        finally:
            close = getattr(response, "aclose", None)
            if callable(close):
                await close()


def _whole(response: Any) -> _Reply:
    """A reply asked for in one piece, as if it had been streamed."""
    reply = _Reply()
    usage = getattr(response, "usage", None)
    if usage is not None:
        reply.usage = usage
        reply.cost = _cost_of(response, usage)
    if response.choices:
        choice = response.choices[0]
        reply.finish_reason = choice.finish_reason
        message = choice.message
        if content := getattr(message, "content", None):
            reply.text.append(str(content))
        for call in getattr(message, "tool_calls", None) or ():
            function = getattr(call, "function", None)
            reply.calls.append(
                _PartialCall(
                    id=getattr(call, "id", None) or "",
                    name=getattr(function, "name", None) or "",
                    arguments=[getattr(function, "arguments", None) or ""],
                )
            )
    return reply


# --- litellm's exceptions → ModelError ----------------------------------------------------------


def _model_error(model: str, exc: Exception, timeout: float) -> ModelError:
    status = _status(exc)
    retryable = isinstance(exc, _retryable_types()) or (
        status is not None and (status in _RETRYABLE_STATUS or status >= 500)
    )
    cause = _cause(exc, status, timeout)
    said = _provider_message(exc)
    return ModelError(
        model,
        f"{cause}: {said}" if said and said.lower() != cause.lower() else cause,
        status=status,
        retryable=retryable,
        cause=cause,
        retry_after=_retry_after(exc),
        context_exceeded=isinstance(exc, load().exceptions.ContextWindowExceededError),
    )


#: The ``"message"`` of a provider's JSON error body, wherever litellm put the body in its text.
_BODY_MESSAGE = re.compile(r'"message"\s*:\s*"((?:[^"\\]|\\.)*)"')
#: What litellm wraps a provider's text in: its exception's name, the provider's, its advice.
_LITELLM_WRAPPING = re.compile(
    r"^(?:(?:litellm\.)?\w*(?:Error|Exception)\s*[:-]\s*)+"
    r"|\.?\s*Handle with `litellm\.\w+`\.?|\s*LiteLLM Retried:.*$|Received Model Group=.*$",
)
#: The most of a provider's message a failure line carries.
_MESSAGE_CHARS = 300


def _provider_message(exc: BaseException) -> str:
    """The provider's own words for a failure, on one line: the ``message`` of its JSON error
    body when there is one, else litellm's text without its wrapping; "" when it said nothing."""
    text = str(getattr(exc, "message", None) or exc)
    if found := _BODY_MESSAGE.search(text):
        try:
            said = str(json.loads(f'"{found.group(1)}"'))
        except ValueError:
            said = found.group(1)
    else:
        said = _LITELLM_WRAPPING.sub("", text.strip())
    said = " ".join(said.split())
    return said if len(said) <= _MESSAGE_CHARS else said[: _MESSAGE_CHARS - 1] + "…"


def _retryable_types() -> tuple[type[BaseException], ...]:
    """Failures worth another attempt: no answer at all, or the statuses the OpenAI SDK retries."""
    import httpx

    errors = load().exceptions
    return (
        errors.RateLimitError,
        errors.Timeout,
        errors.APIConnectionError,
        errors.ServiceUnavailableError,
        errors.InternalServerError,
        errors.BadGatewayError,
        httpx.TransportError,
    )


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and what caused it, outermost first."""
    chain: list[BaseException] = []
    cause: BaseException | None = exc
    while cause is not None and len(chain) < 10:  # short; the bound guards against a cycle
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    return chain


def _cause(exc: BaseException, status: int | None, timeout: float) -> str:
    """What went wrong in a few words: ``429 rate limited``, ``connection reset``…"""
    import aiohttp
    import httpx
    import openai

    if isinstance(exc, load().exceptions.ContextWindowExceededError):
        return "context length exceeded"
    chain = _chain(exc)
    # Most precise first: the socket's own error says more than the HTTP client's wrapper of it.
    checks: list[tuple[Any, str]] = [
        (
            openai.APITimeoutError | httpx.TimeoutException | TimeoutError,
            f"timeout after {timeout:g} s",
        ),
        (ConnectionResetError, "connection reset"),
        (ConnectionRefusedError, "connection refused"),
        (httpx.RemoteProtocolError, ""),
        # litellm's async calls run on aiohttp, under httpx's names. A reply cut short shows
        # as an incomplete payload there, whether the peer closed or reset the connection.
        (aiohttp.ClientPayloadError, "connection closed mid-reply"),
        (aiohttp.ServerDisconnectedError, "connection closed without a response"),
        (aiohttp.ClientConnectorError, "cannot connect"),
        (httpx.ConnectError, "cannot connect"),
    ]
    for kind, words in checks:
        link = next((link for link in chain if isinstance(link, kind)), None)
        if link is None:
            continue
        if words:
            return words
        if "complete message body" in str(link):
            return "connection closed mid-reply"
        return "connection closed without a response"
    if status is not None:
        return status_cause(status)
    if any(isinstance(link, openai.APIConnectionError) for link in chain):
        return "connection error"
    return type(exc).__name__


def _retry_after(exc: BaseException) -> float | None:
    """The wait the provider asked for, in seconds: ``retry-after-ms`` or ``Retry-After``
    (seconds or an HTTP date); ``None`` when it sent neither."""
    # litellm leaves the provider's headers off its exception's response (that one is its own,
    # with none) and keeps them in ``litellm_response_headers``: both are looked at.
    for headers in (
        getattr(getattr(exc, "response", None), "headers", None),
        getattr(exc, "litellm_response_headers", None),
    ):
        if headers and (wait := _wait_in(headers)) is not None:
            return wait
    return None


def _wait_in(headers: Any) -> float | None:
    """The wait ``headers`` ask for: ``retry-after-ms`` or ``Retry-After``; ``None``: none."""
    try:
        if (ms := headers.get("retry-after-ms")) is not None:
            return max(float(ms) / 1000, 0.0)
        value = headers.get("retry-after")
        if value is None:
            return None
        try:
            return max(float(value), 0.0)
        except ValueError:
            when = email.utils.parsedate_to_datetime(value)
            return max(when.timestamp() - time.time(), 0.0)
    except (TypeError, ValueError, AttributeError):
        return None  # a header we cannot read is no instruction


def _status(exc: BaseException) -> int | None:
    """The provider's HTTP status; ``None`` when no response came back (litellm reports a
    refused connection as status 500)."""
    import openai

    for link in _chain(exc):
        if isinstance(link, openai.APIConnectionError) and not isinstance(
            link, openai.APITimeoutError
        ):
            return None
    # litellm reports Anthropic's 529 "overloaded" as a 500 and keeps the real one apart.
    for status in (getattr(exc, "provider_status_code", None), getattr(exc, "status_code", None)):
        if isinstance(status, int) and not isinstance(status, bool):
            return status
    return None


# --- model limits -------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1024)
def model_limits(model_id: str) -> tuple[int, int] | None:
    """``(context window, output limit)`` in tokens from litellm's model info; ``None`` for a
    model its map does not know (or knows without both figures)."""
    try:
        info = load().get_model_info(model_id)
    except Exception:  # noqa: BLE001 - litellm raises for a model it has no entry for
        return None
    window = info.get("max_input_tokens") or info.get("max_tokens")
    output = info.get("max_output_tokens") or info.get("max_tokens")
    if not isinstance(window, int) or not isinstance(output, int) or window <= 0 or output <= 0:
        return None
    return window, output
