"""The narrow interface the run loop knows a model by, how a persona's model is chosen, and how a
failed model call is tried again.

The loop calls :meth:`Model.stream` with a :class:`ModelRequest` (the project's own messages and
:class:`ToolSpec` tool descriptions) and iterates, asynchronously, over text deltas (``str``)
followed by one :class:`ModelReply`: every spawn of a worker process runs as a coroutine on the
process's event loop (:mod:`workers.engine`), so a model call waits without holding a thread.
Adapters translate these to and from a provider's types:
:mod:`workers._litellm` for every real model, :mod:`workers.demo_model` for the offline demo.
:class:`RetryingModel` wraps any of them to retry the calls that failed for a passing reason.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Protocol

from registry.errors import OngridError
from workers.messages import Message, Usage

if TYPE_CHECKING:
    from registry.settings import Settings

__all__ = [
    "DEMO_MODEL",
    "DEMO_NOTE",
    "Model",
    "PROVIDER_ALIASES",
    "ModelChoice",
    "ModelError",
    "ModelReply",
    "ModelRequest",
    "RetryAbandoned",
    "RetryPolicy",
    "Readiness",
    "RetryingModel",
    "ToolSpec",
    "resolve_model",
    "status_cause",
]

#: The model id of the offline demo model (deterministic, not an LLM).
DEMO_MODEL = "ongrid/demo"
#: What a tile of the demo model says about it.
DEMO_NOTE = (
    "the offline demo model (deterministic, not an LLM): no model is configured; set "
    "ONGRID_DEFAULT_MODEL and its provider's key for a real one"
)


@dataclass(frozen=True)
class ToolSpec:
    """A tool as the model is told about it."""

    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=dict)
    """The JSON schema of the tool's arguments."""


@dataclass(frozen=True)
class ModelRequest:
    model: str
    messages: list[Message]
    tools: list[ToolSpec] = field(default_factory=list)
    stream: bool = True
    """Whether text is wanted as it is generated. ``False`` (nobody is watching the session):
    the adapter may ask for the whole reply at once, which costs far less CPU per call, and
    yields its text as one delta."""
    max_tokens: int | None = None
    """The most tokens the reply may have; ``None``: the provider's default (litellm then asks
    for the model's whole output limit)."""
    cache_key: str = ""
    """Names the conversation for providers that route prompt caching by a key (OpenAI's
    ``prompt_cache_key``): the spawn id. Empty: none sent."""
    stable: int = 0
    """How many of ``messages``, from the first, the next call of this conversation sends again
    unchanged (all but the per-turn reminder and what follows it): where a provider's cache
    breakpoint may go. 0: no caching asked for."""
    settled: int = 0
    """How many of ``messages``, from the first, stay unchanged even when the runtime shrinks
    older tool results before the next call (:mod:`workers.context`): a second breakpoint, so
    that a shrink re-reads the cache up to it instead of missing it whole. 0: none."""


@dataclass(frozen=True)
class ModelReply:
    message: Message
    usage: Usage
    finish_reason: str = "stop"


#: Short words for the statuses providers fail with (``status_cause``); others use HTTP's phrase.
_STATUS_WORDS = {
    400: "bad request",
    401: "unauthorized",
    403: "forbidden",
    404: "not found",
    408: "request timeout",
    409: "conflict",
    429: "rate limited",
    500: "internal server error",
    502: "bad gateway",
    503: "service unavailable",
    504: "gateway timeout",
    529: "overloaded",
}


def status_cause(status: int) -> str:
    """``429 rate limited``, ``503 service unavailable``: a provider's status in a few words."""
    try:
        words = _STATUS_WORDS.get(status) or HTTPStatus(status).phrase.lower()
    except ValueError:
        words = "error"
    return f"{status} {words}"


class ModelError(OngridError):
    """A model call that failed: which model, the provider's status (if any), retryable or not.

    ``cause`` says in a few words what happened (``429 rate limited``, ``timeout after 60 s``,
    ``connection reset``); ``retry_after`` is the wait in seconds the provider asked for.
    """

    def __init__(
        self,
        model: str,
        message: str,
        *,
        status: int | None = None,
        retryable: bool,
        cause: str = "",
        retry_after: float | None = None,
        context_exceeded: bool = False,
    ):
        self.model, self.status, self.retryable = model, status, retryable
        self.detail = message
        self.cause = cause or (status_cause(status) if status else message[:80])
        self.retry_after = retry_after
        #: The provider refused the request as longer than the model's context window.
        self.context_exceeded = context_exceeded
        named = status is None or message.startswith(str(status))
        super().__init__(f"model {model}: {message}" + ("" if named else f" (status {status})"))


class RetryAbandoned(ModelError):
    """The wait before another attempt was cut short: the stop event was set."""


class Model(Protocol):
    def stream(self, request: ModelRequest) -> AsyncIterator[str | ModelReply]:
        """Yield text deltas as they arrive, then exactly one :class:`ModelReply`."""
        ...


@dataclass(frozen=True)
class RetryPolicy:
    """How often, and how long apart, a model call that failed for a passing reason is retried.

    The wait before retry *n* is drawn uniformly from 0 to ``base_seconds`` · 2^(n-1) ("full
    jitter": many spawns hit by one outage do not come back in step), at most ``max_seconds``;
    a provider's ``Retry-After`` replaces the draw, bounded by ``max_seconds`` as well.
    """

    retries: int = 4
    """Attempts after the first; 0 turns retrying off."""
    base_seconds: float = 1.0
    max_seconds: float = 30.0

    @classmethod
    def from_settings(cls, settings: Settings) -> RetryPolicy:
        return cls(
            retries=settings.model_retries,
            base_seconds=settings.model_retry_base_seconds,
            max_seconds=settings.model_retry_max_seconds,
        )

    def delay(self, retry: int, retry_after: float | None, rng: random.Random) -> float:
        """Seconds to wait before retry number ``retry`` (1 for the first)."""
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_seconds)
        # The exponent is bounded: past 2^60 the cap is max_seconds anyway.
        ceiling = min(self.max_seconds, self.base_seconds * 2.0 ** min(retry - 1, 60))
        return rng.uniform(0.0, ceiling)


#: The jitter of every backoff of the process. One generator: seeding one per model call (from
#: os.urandom) showed in a worker's profile.
_JITTER = random.Random()


class RetryingModel:
    """A :class:`Model` that retries its inner model's retryable failures with backoff.

    A call is retried only while it has streamed no text: text already shown cannot be taken
    back, and a second attempt would stream its own, different text after it. A call that
    fails after streaming, or on a non-retryable error, or past ``policy.retries`` retries,
    raises a :class:`ModelError` that lists every attempt. ``stop``, when set, ends a wait at
    once with :class:`RetryAbandoned`; ``pause(stop, seconds)`` is how a wait is made (True:
    stopped), replaceable so tests need not sleep.
    """

    def __init__(
        self,
        inner: Model,
        policy: RetryPolicy,
        *,
        stop: threading.Event | None = None,
        rng: random.Random | None = None,
        pause: Callable[[threading.Event, float], Awaitable[bool]] | None = None,
    ) -> None:
        self.inner, self.policy = inner, policy
        self._stop = stop if stop is not None else threading.Event()
        self._rng = rng or _JITTER
        self._pause = pause or stopped_within

    async def stream(self, request: ModelRequest) -> AsyncIterator[str | ModelReply]:
        failures: list[ModelError] = []
        started = time.monotonic()
        while True:
            streamed = False
            attempt: AsyncIterator[str | ModelReply] | None = None
            try:
                attempt = self.inner.stream(request)
                async for item in attempt:
                    streamed = streamed or (isinstance(item, str) and item != "")
                    yield item
                return
            except ModelError as exc:
                failures.append(exc)
                why_not = self._why_not_retry(exc, streamed, len(failures))
                if why_not is not None:
                    error = self._failed(request.model, failures, started, why_not)
                    if error is exc:
                        raise
                    raise error from exc
            finally:
                close = getattr(attempt, "aclose", None)
                if callable(close):
                    await close()
            wait = self.policy.delay(len(failures), failures[-1].retry_after, self._rng)
            if await self._pause(self._stop, wait):
                note = "; retry abandoned: stop requested"
                error = self._failed(request.model, failures, started, note)
                raise RetryAbandoned(
                    request.model,
                    error.detail,
                    status=error.status,
                    retryable=True,
                    cause=error.cause,
                ) from failures[-1]

    def _why_not_retry(self, exc: ModelError, streamed: bool, attempts: int) -> str | None:
        """``None`` to retry; otherwise what to add to the failure's message ("" for nothing)."""
        if not exc.retryable or attempts > self.policy.retries:
            return ""
        if streamed:
            return "; not retried: part of the reply had already been streamed"
        return None

    def _failed(
        self, model: str, failures: list[ModelError], started: float, note: str
    ) -> ModelError:
        last = failures[-1]
        if len(failures) == 1 and not note:
            return last
        causes = ", ".join(
            cause + (f" ×{n}" if (n := len(list(group))) > 1 else "")
            for cause, group in itertools.groupby(f.cause for f in failures)
        )
        attempts = f"{len(failures)} attempt{'s' if len(failures) > 1 else ''}"
        elapsed = time.monotonic() - started
        return ModelError(
            model,
            f"call failed after {attempts} over {elapsed:.1f} s: {causes}{note}; "
            f"last error: {last.detail}",
            status=last.status,
            retryable=last.retryable,
            cause=last.cause,
        )


#: How often a backoff looks at its stop flag (seconds). The flag is a :class:`threading.Event`,
#: set from the signal handler of a worker that shuts down, which a coroutine cannot await.
_STOP_POLL = 0.1


async def stopped_within(stop: threading.Event, seconds: float) -> bool:
    """Sleep ``seconds``; True as soon as ``stop`` is set (then the sleep is cut short)."""
    deadline = time.monotonic() + seconds
    while not stop.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        await asyncio.sleep(min(left, _STOP_POLL))
    return True


#: Provider prefixes people write that litellm knows under another name: the source documents'
#: ``zhipu/glm-4.7`` is litellm's ``zai`` provider (Zhipu's GLM models).
PROVIDER_ALIASES: dict[str, str] = {"zhipu": "zai", "zhipuai": "zai"}


@dataclass(frozen=True)
class Readiness:
    """What the model adapter knows of a model id: litellm's provider for it (``None``: none it
    can route to) and the environment variables still to set before it can be called."""

    provider: str | None
    missing: tuple[str, ...] = ()

    @property
    def usable(self) -> bool:
        return self.provider is not None and not self.missing


@dataclass(frozen=True)
class ModelChoice:
    """The model a persona runs on: ``model_id``, or, when it cannot be used, ``problem``: one
    sentence naming the model and what to set (``model_id`` is then what was asked for)."""

    model_id: str
    problem: str = ""


def _aliased(model_id: str) -> str:
    provider, slash, rest = model_id.partition("/")
    alias = PROVIDER_ALIASES.get(provider.lower())
    return f"{alias}/{rest}" if alias and slash and rest else model_id


def resolve_model(
    persona_model: str,
    *,
    default_model: str,
    default_provider: str,
    readiness: Callable[[str], Readiness],
) -> ModelChoice:
    """Persona ``model`` → organisation default; a provider alias (:data:`PROVIDER_ALIASES`)
    is applied; a provider that cannot be used here (unknown to litellm, or its keys unset)
    maps to ``default_provider``; what still cannot be used is a :class:`ModelChoice` with a
    problem, never another model. Only where no model is configured at all is it the offline
    demo model.

    ``readiness(model_id)`` asks the adapter (:func:`workers._litellm.readiness`).
    """
    wanted = persona_model or default_model
    if not wanted:
        return ModelChoice(DEMO_MODEL)
    if wanted == DEMO_MODEL:
        return ModelChoice(wanted)
    model_id = _aliased(wanted)
    ready = readiness(model_id)
    if ready.usable:
        return ModelChoice(model_id)
    provider, slash, rest = model_id.partition("/")
    name = rest if slash else model_id  # a bare name ("gpt-4o-mini") names no provider
    fallback = f"{default_provider}/{name}" if default_provider and name else ""
    fallback_ready = readiness(fallback) if fallback and fallback != model_id else None
    if fallback_ready is not None and fallback_ready.usable:
        return ModelChoice(fallback)
    if ready.provider is None:
        why = (
            f"litellm knows no provider {provider!r}"
            if slash
            else "it names no provider litellm can route it to"
        )
        todo = "write it as <provider>/<model> with a provider litellm knows"
    else:
        why = f"{ready.provider} needs {' and '.join(ready.missing)}"
        todo = f"set {' and '.join(ready.missing)}"
    if fallback_ready is not None and fallback_ready.provider is not None:
        needs = " and ".join(fallback_ready.missing)
        why += f", and the default provider's {fallback} needs {needs}"
        todo += f" (or {needs})"
    elif fallback_ready is not None:
        why += f", and ONGRID_DEFAULT_PROVIDER={default_provider} is no provider litellm knows"
    elif not default_provider:
        also = ", or set" if ready.provider is None else ", or"
        todo += f"{also} ONGRID_DEFAULT_PROVIDER to a provider that is configured"
    shown = wanted if model_id == wanted else f"{wanted} ({model_id})"
    return ModelChoice(wanted, f"model {shown} cannot be used: {why}; {todo}")
