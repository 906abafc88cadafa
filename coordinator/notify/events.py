"""Which feed entries are notified, as what, and to which channels.

From the approval feed: a request (``approval.requested``), a decision (``approval.decided``)
and an expiry (``approval.expired``). From the spawn-end feed: the end of a spawn a person or a
schedule started (a coordinator's specialists report to their coordinator, not to people):
``spawn.finished`` (``ok``), ``spawn.failed``, and ``budget.reached`` beside either when a
budget limit stopped it. A cancelled spawn is not notified: somebody asked for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from registry.notifications import NotificationSettings
from registry.settings import Settings
from workers.messages import ApprovalDecided, ConfirmationRequired, Event, SpawnEnded

__all__ = ["Notice", "notices", "who_may_decide"]


@dataclass(frozen=True)
class Notice:
    """One notifiable event: its kind, whose spawn, and the channels it goes to."""

    kind: str
    event: Event
    persona: str
    owner: str
    channels: tuple[str, ...]


def _spawn_kinds(event: SpawnEnded) -> list[str]:
    if event.parent_spawn_id or event.status == "cancelled":
        return []
    kinds = ["spawn.finished" if event.status == "ok" else "spawn.failed"]
    if event.budget_reached:
        kinds.append("budget.reached")
    return kinds


def notices(event: Event, config: NotificationSettings, persona: str = "") -> list[Notice]:
    """The notices of one feed entry (``persona``: the spawn's, for a decision, which does not
    carry it)."""
    owner, background = "", True
    extra: tuple[str, ...] = ()
    if isinstance(event, ConfirmationRequired):
        kinds, owner, persona = (
            ["approval.requested"],
            event.requested_by.user,
            event.requested_by.persona,
        )
    elif isinstance(event, ApprovalDecided):
        kinds = ["approval.expired" if event.decision == "expired" else "approval.decided"]
        owner = event.owner
    elif isinstance(event, SpawnEnded):
        kinds, owner, persona = _spawn_kinds(event), event.owner, event.persona
        background = event.background
        extra = tuple(c for c in event.notify if c in config.channels)
    else:
        return []
    found = []
    for kind in kinds:
        channels = config.channels_for(kind, persona, owner, background)
        channels += [c for c in extra if c not in channels]
        if channels:
            found.append(Notice(kind, event, persona, owner, tuple(channels)))
    return found


def who_may_decide(settings: Settings, owner: str) -> list[str]:
    """The users who may decide on ``owner``'s calls: those that approve for the owner (the
    owner included) and whose token's role may approve."""
    may = settings.approvers_of(owner)
    return sorted(
        {
            grant.user
            for grant in settings.token_grants.values()
            if grant.user in may
            and settings.roles.get(grant.role, None) is not None
            and settings.roles[grant.role].approve
        }
    )
