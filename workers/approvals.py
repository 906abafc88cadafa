"""The approval feed: one Redis stream of every confirmation request and every decision on one,
across all sessions, so a request reaches the people who may approve it wherever the spawn
runs (a background spawn's included) instead of waiting where nobody looks.

:class:`ApprovalFeed` is an :class:`~workers.events.EventBus` whose stream, counter and channel
are global (``{prefix}approvals:events``, ``…:seq``, ``…:live``): entries are numbered by the
feed, so a reader resumes with ``Last-Event-ID`` exactly as on a session. Each event keeps its
own session and spawn. The de-duplication hash stays per session, so it expires with the
session's events.

Writers: a worker announces a request (:meth:`ApprovalFeed.aannounce`, de-duplicated by the
spawn's event index, so a resumed attempt does not announce it twice), the deciding side each
decision (:meth:`ApprovalFeed.decided`), the reaper each expiry. Readers: the approvers' event
stream (``GET /api/v1/approvals/events``) and the audit table's follower.
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

import redis
import redis.asyncio
from redis.exceptions import ResponseError

from workers.channels import scoped
from workers.events import EventBus, Outgoing, SessionKeys
from workers.messages import ApprovalDecided, ConfirmationRequired
from workers.spawns import SpawnRecord

__all__ = ["FEED", "ApprovalFeed", "decision_event"]

#: The one "session" every reader of the feed subscribes to.
FEED = "all"


class ApprovalFeed(EventBus):
    """The approval feed on ``client`` (and ``async_client`` for asyncio readers)."""

    def __init__(
        self,
        client: redis.Redis,
        prefix: str = "ongrid:",
        *,
        async_client: redis.asyncio.Redis | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(client, f"{prefix}approvals:", async_client=async_client, **kwargs)

    def keys(self, session_id: str) -> SessionKeys:
        p = self.prefix
        return SessionKeys(
            stream=f"{p}events",
            seq=f"{p}seq",
            dedup=f"{p}dedup:{session_id}",
            channel=scoped(self._client, p, "live"),
        )

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

    async def aannounce(
        self, event: ConfirmationRequired, index: int, client: redis.asyncio.Redis
    ) -> None:
        """Publish a confirmation request; ``index`` is its spawn-local event index."""
        (done,) = await self.apublish_many(
            [Outgoing(event, f"spawn:{event.spawn_id}", index)], client=client
        )
        if isinstance(done, ResponseError):
            raise done

    def decided(
        self,
        record: SpawnRecord,
        call_id: str,
        decision: Literal["approved", "denied", "expired"],
        by: str = "",
    ) -> None:
        """Publish a decision on (or the expiry of) ``call_id`` as ``record`` now stands."""
        self.publish(decision_event(record, call_id, decision, by))


def decision_event(
    record: SpawnRecord,
    call_id: str,
    decision: Literal["approved", "denied", "expired"],
    by: str = "",
) -> ApprovalDecided:
    """The feed's event for a decision on ``call_id`` of ``record`` (read after the decision)."""
    state = record.state
    approval = state.approvals[call_id] if state is not None else None
    call = next((c for c in state.pending if c.id == call_id), None) if state else None
    return ApprovalDecided(
        session_id=record.session_id,
        spawn_id=record.spawn_id,
        call_id=call_id,
        name=call.name if call is not None else "",
        args_hash=approval.args_hash if approval is not None else "",
        decision=decision,
        by=by,
        owner=record.user,
        approved_by=list(approval.approved_by) if approval is not None else [],
        needed=approval.needed if approval is not None else 1,
        settled=approval.settled if approval is not None else True,
    )
