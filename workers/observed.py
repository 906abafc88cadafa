"""The runtime's instruments: a model whose calls are timed, counted and traced, a turn clock.

Kept apart from :mod:`workers.runtime` so that what is measured, and under which names
(:mod:`workers.metrics`, :mod:`workers.tracing`), reads in one place.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from workers import metrics, tracing
from workers.model import Model, ModelError, ModelReply, ModelRequest

__all__ = ["MeasuredModel", "TurnClock"]


class TurnClock:
    """Times each turn of a spawn (model call and the tool calls after it) for its metric."""

    def __init__(self, persona: str, turns: int) -> None:
        self.persona, self.turns, self.since = persona, turns, time.monotonic()

    def tick(self, turns: int) -> None:
        if turns > self.turns:
            now = time.monotonic()
            metrics.turn_done(self.persona, now - self.since)
            self.turns, self.since = turns, now


class MeasuredModel:
    """A :class:`Model` whose calls are timed, counted and traced (GenAI conventions)."""

    def __init__(self, inner: Model, persona: str) -> None:
        self.inner, self.persona = inner, persona

    async def stream(self, request: ModelRequest) -> AsyncIterator[str | ModelReply]:
        started = time.monotonic()
        with tracing.chat_span(request.model) as span:
            try:
                async for item in self.inner.stream(request):
                    if isinstance(item, ModelReply):
                        tracing.record_usage(span, item.usage)
                        seconds = time.monotonic() - started
                        metrics.model_call(request.model, self.persona, seconds, item.usage, None)
                    yield item
            except ModelError as exc:
                metrics.model_call(
                    request.model, self.persona, time.monotonic() - started, None, exc.cause
                )
                raise
