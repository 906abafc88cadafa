"""Global feeds: an event bus whose one stream gathers events of every session.

A :class:`GlobalFeed` is an :class:`~workers.events.EventBus` whose stream, counter and channel
are global (``{prefix}<name>:events``, ``…:seq``, ``…:live``): entries are numbered by the feed,
so a reader resumes after the last number it handled, exactly as on a session. Each event keeps
its own session and spawn; the de-duplication hash stays per session, so it expires with the
session's events. Two feeds exist: the approval feed (:mod:`workers.approvals`) and the
spawn-end feed (:mod:`workers.spawn_ends`).
"""

from __future__ import annotations

import uuid
from typing import Any

import redis
import redis.asyncio
from redis.exceptions import ResponseError

from workers.channels import scoped
from workers.events import EventBus, Outgoing, SessionKeys
from workers.messages import Event

__all__ = ["FEED", "GlobalFeed"]

#: The one "session" every reader of a feed reads.
FEED = "all"


class GlobalFeed(EventBus):
    """The feed ``name`` on ``client`` (and ``async_client`` for asyncio readers)."""

    def __init__(
        self,
        client: redis.Redis,
        prefix: str,
        name: str,
        *,
        async_client: redis.asyncio.Redis | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(client, f"{prefix}{name}:", async_client=async_client, **kwargs)

    def keys(self, session_id: str) -> SessionKeys:
        p = self.prefix
        return SessionKeys(
            stream=f"{p}events",
            seq=f"{p}seq",
            dedup=f"{p}dedup:{session_id}",
            channel=scoped(self._client, p, "live"),
        )

    @property
    def stream(self) -> str:
        return self.keys(FEED).stream

    @property
    def epoch_key(self) -> str:
        return f"{self.prefix}epoch"

    def epoch(self) -> str:
        """The id of the feed's numbering, made on first use: a Redis that lost its data starts
        the numbering again under a new epoch, so a reader that stored the old numbers does not
        mistake the new entries for ones it has seen."""
        self._client.set(self.epoch_key, uuid.uuid4().hex, nx=True)
        value: Any = self._client.get(self.epoch_key)
        return value.decode() if isinstance(value, bytes) else str(value)

    async def aannounce(self, event: Event, index: int, client: redis.asyncio.Redis) -> None:
        """Publish ``event`` of a spawn; ``index`` is its spawn-local event index, so an attempt
        resumed after a crash that publishes it again stores nothing twice."""
        (done,) = await self.apublish_many(
            [Outgoing(event, f"spawn:{event.spawn_id}", index)], client=client
        )
        if isinstance(done, ResponseError):
            raise done
