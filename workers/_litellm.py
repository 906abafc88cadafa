"""The litellm adapter: the only module that imports litellm.

litellm fetches its model cost map from the internet at import unless
``LITELLM_LOCAL_MODEL_COST_MAP`` is set; we set it before the import so the runtime works
air-gapped. Provider variables (``OPENAI_API_BASE``, ``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY``…) are
read by litellm as it documents them.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_LOG", "ERROR")

from collections.abc import Iterator  # noqa: E402
from typing import Any  # noqa: E402

import litellm  # noqa: E402

from workers.messages import Message, ToolCall, Usage  # noqa: E402
from workers.model import ModelError, ModelReply, ModelRequest  # noqa: E402

__all__ = ["LitellmModel", "has_credentials"]

litellm.telemetry = False
litellm.suppress_debug_info = True

_RETRYABLE = (
    litellm.exceptions.RateLimitError,
    litellm.exceptions.Timeout,
    litellm.exceptions.APIConnectionError,
    litellm.exceptions.ServiceUnavailableError,
    litellm.exceptions.InternalServerError,
)


def has_credentials(model_id: str) -> bool:
    """Whether litellm knows ``model_id``'s provider and finds its credentials in the environment.

    litellm answers "keys present" for providers it does not know, so the provider is checked
    against its list first.
    """
    provider = model_id.partition("/")[0]
    if provider not in {str(getattr(p, "value", p)) for p in litellm.provider_list}:
        return False
    try:
        return bool(litellm.validate_environment(model=model_id)["keys_in_environment"])
    except Exception:  # noqa: BLE001 - an unknown provider is simply "not configured"
        return False


def _usage(model: str, chunks_response: Any) -> Usage:
    raw = getattr(chunks_response, "usage", None)
    prompt = getattr(raw, "prompt_tokens", 0) or 0
    completion = getattr(raw, "completion_tokens", 0) or 0
    try:
        cost = float(litellm.completion_cost(completion_response=chunks_response, model=model))
    except Exception:  # noqa: BLE001 - no price known for this model: cost unknown, not an error
        cost = 0.0
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        cost=cost,
        model_calls=1,
    )


def _message(response: Any) -> tuple[Message, str]:
    choice = response.choices[0]
    msg = choice.message
    calls = [
        ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments or "{}")
        for c in (getattr(msg, "tool_calls", None) or [])
    ]
    return Message(role="assistant", content=msg.content or "", tool_calls=calls), (
        choice.finish_reason or "stop"
    )


class LitellmModel:
    """Streams a chat completion through litellm and rebuilds the full reply from the chunks."""

    def __init__(self, *, timeout: float = 600.0) -> None:
        self.timeout = timeout

    def stream(self, request: ModelRequest) -> Iterator[str | ModelReply]:
        messages = [m.to_openai() for m in request.messages]
        try:
            response = litellm.completion(
                model=request.model,
                messages=messages,
                tools=request.tools or None,
                stream=True,
                stream_options={"include_usage": True},
                timeout=self.timeout,
            )
            chunks = []
            for chunk in response:
                chunks.append(chunk)
                delta = chunk.choices[0].delta if chunk.choices else None
                text = getattr(delta, "content", None) if delta is not None else None
                if text:
                    yield text
            full = litellm.stream_chunk_builder(chunks, messages=messages)
        except _RETRYABLE as exc:
            raise ModelError(request.model, str(exc), status=_status(exc), retryable=True) from exc
        except litellm.exceptions.APIError as exc:
            raise ModelError(request.model, str(exc), status=_status(exc), retryable=False) from exc
        except litellm.exceptions.BadRequestError as exc:
            raise ModelError(request.model, str(exc), status=_status(exc), retryable=False) from exc
        if full is None:
            raise ModelError(request.model, "empty response stream", retryable=True)
        message, finish = _message(full)
        yield ModelReply(message=message, usage=_usage(request.model, full), finish_reason=finish)


def _status(exc: Exception) -> int | None:
    return getattr(exc, "status_code", None)
