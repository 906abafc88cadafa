"""Running the runtime's coroutines from plain (synchronous) tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TypeVar

__all__ = ["collect"]

T = TypeVar("T")


def collect(stream: AsyncIterator[T]) -> list[T]:
    """Every item of ``stream``, on an event loop of its own; an error it raises propagates."""

    async def drain() -> list[T]:
        return [item async for item in stream]

    return asyncio.run(drain())
