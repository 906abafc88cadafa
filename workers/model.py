"""The narrow interface the run loop knows a model by, and how a persona's model is chosen.

The loop calls :meth:`Model.stream` and gets text deltas (``str``) followed by one
:class:`ModelReply`. Adapters translate a provider's types into these: :mod:`workers._litellm`
for every real model, :mod:`workers.demo_model` for the offline demo.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from registry.errors import OngridError
from workers.messages import Message, Usage

__all__ = ["DEMO_MODEL", "Model", "ModelError", "ModelReply", "ModelRequest", "resolve_model_id"]

#: The model id of the offline demo model (deterministic, not an LLM).
DEMO_MODEL = "ongrid/demo"


@dataclass(frozen=True)
class ModelRequest:
    model: str
    messages: list[Message]
    tools: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class ModelReply:
    message: Message
    usage: Usage
    finish_reason: str = "stop"


class ModelError(OngridError):
    """A model call that failed: which model, the provider's status (if any), retryable or not."""

    def __init__(self, model: str, message: str, *, status: int | None = None, retryable: bool):
        self.model, self.status, self.retryable = model, status, retryable
        super().__init__(f"model {model}: {message}" + (f" (status {status})" if status else ""))


class Model(Protocol):
    def stream(self, request: ModelRequest) -> Iterator[str | ModelReply]:
        """Yield text deltas as they arrive, then exactly one :class:`ModelReply`."""
        ...


def resolve_model_id(
    persona_model: str,
    *,
    default_model: str,
    default_provider: str,
    has_credentials: Callable[[str], bool],
) -> str:
    """Persona ``model`` → organisation default; a provider without credentials maps to
    ``default_provider``; with neither, the offline demo model.

    ``has_credentials(model_id) -> bool`` asks the adapter whether the provider is configured.
    """
    wanted = persona_model or default_model
    if not wanted:
        return DEMO_MODEL
    if wanted == DEMO_MODEL or has_credentials(wanted):
        return wanted
    provider, _, rest = wanted.partition("/")
    if not rest:  # a bare name ("gpt-4o-mini") names no provider: try the default one
        rest = provider
    if default_provider and rest:
        mapped = f"{default_provider}/{rest}"
        if has_credentials(mapped):
            return mapped
    return DEMO_MODEL
