"""The spawn-end feed: one Redis stream of every spawn's end, across all sessions, so what must
follow a background spawn's result (notifications) reads it in one place, in order, from where
it left off, instead of every session's events.

:class:`SpawnEndFeed` is a :class:`~workers.feeds.GlobalFeed` (``{prefix}ends:events``). The
worker that ends a spawn publishes a :class:`~workers.messages.SpawnEnded` right after the
spawn's ``task_notification``, de-duplicated by that notification's event index: an attempt
resumed after a crash publishes it again and nothing is stored twice. The feed keeps its last
10 000 entries, for a week after the last one.
"""

from __future__ import annotations

from typing import Any

import redis

from workers.feeds import FEED, GlobalFeed
from workers.messages import SPAWN_END_TEXT_LIMIT, SpawnEnded
from workers.spawns import SpawnRecord

__all__ = ["FEED", "SpawnEndFeed", "spawn_ended"]


class SpawnEndFeed(GlobalFeed):
    """The spawn-end feed on ``client``."""

    def __init__(self, client: redis.Redis, prefix: str = "ongrid:", **kwargs: Any) -> None:
        super().__init__(client, prefix, "ends", **kwargs)


def spawn_ended(record: SpawnRecord) -> SpawnEnded:
    """The feed's event for ``record``, which has just ended."""
    text = record.result if record.status == "ok" else record.error
    reached = record.budget.reached
    usage = record.state.usage if record.state else None
    return SpawnEnded(
        session_id=record.session_id,
        spawn_id=record.spawn_id,
        status=record.status,  # type: ignore[arg-type]
        persona=record.persona,
        owner=record.user,
        background=record.background,
        parent_spawn_id=record.parent_spawn_id,
        message=text[:SPAWN_END_TEXT_LIMIT],
        budget_reached=reached.limit if reached else None,
        cost_usd=usage.cost if usage is not None else 0.0,
        notify=list(record.notify),
    )
