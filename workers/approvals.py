"""The approval feed: one Redis stream of every confirmation request and every decision on one,
across all sessions, so a request reaches the people who may approve it wherever the spawn
runs (a background spawn's included) instead of waiting where nobody looks.

:class:`ApprovalFeed` is a :class:`~workers.feeds.GlobalFeed` (``{prefix}approvals:events``,
``…:seq``, ``…:live``): a reader resumes with ``Last-Event-ID`` exactly as on a session.

Writers: a worker announces a request (:meth:`~workers.feeds.GlobalFeed.aannounce`, de-duplicated
by the spawn's event index, so a resumed attempt does not announce it twice), the deciding side
each decision (:meth:`ApprovalFeed.decided`), the reaper each expiry. Readers: the approvers'
event stream (``GET /api/v1/approvals/events``), the audit table's follower and the notification
sender (:mod:`coordinator.notify`).
"""

from __future__ import annotations

from typing import Any, Literal

import redis

from workers.feeds import FEED, GlobalFeed
from workers.messages import ApprovalDecided
from workers.spawns import SpawnRecord

__all__ = ["FEED", "ApprovalFeed", "decision_event"]


class ApprovalFeed(GlobalFeed):
    """The approval feed on ``client`` (and ``async_client`` for asyncio readers)."""

    def __init__(self, client: redis.Redis, prefix: str = "ongrid:", **kwargs: Any) -> None:
        super().__init__(client, prefix, "approvals", **kwargs)

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
