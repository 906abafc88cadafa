"""People's decisions on a spawn's tool calls that wait for confirmation: whether a decision is
allowed, whether it settles the call, and the refusals (HTTP 409) when it is not.

Pure logic over a :class:`~workers.spawns.SpawnRecord`; :meth:`SpawnStore.decide` applies it
inside its Redis transaction.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from registry.errors import UserError
from workers.loop import Approval

if TYPE_CHECKING:
    from workers.spawns import SpawnRecord

__all__ = ["AlreadyDecided", "DecisionRefused", "NotWaiting", "apply_decision"]


class DecisionRefused(UserError):
    """A decision the spawn's state does not allow (HTTP 409); nothing was recorded."""


class NotWaiting(DecisionRefused):
    """The spawn does not wait for a decision on that call (any more, or never did)."""

    def __init__(self, record: SpawnRecord, call_id: str) -> None:
        self.status = record.status
        self.waiting_on = sorted(
            cid
            for cid, approval in (record.state.approvals if record.state else {}).items()
            if record.status == "waiting" and not _settled(approval)
        )
        super().__init__(f"spawn {record.spawn_id} is not waiting for a decision on {call_id!r}")


class AlreadyDecided(DecisionRefused):
    """Someone else settled the call first; the first decision stands."""

    def __init__(self, spawn_id: str, call_id: str, approval: Approval) -> None:
        self.decision = "denied" if approval.denied_by is not None else "approved"
        self.decided_by = (
            [approval.denied_by] if approval.denied_by is not None else list(approval.approved_by)
        )
        super().__init__(
            f"call {call_id!r} of spawn {spawn_id} was already {self.decision} by "
            f"{' and '.join(self.decided_by)}; the first decision stands"
        )


def _settled(approval: Approval) -> bool:
    """Denied, or approved by as many different people as the call needs."""
    return approval.denied_by is not None or len(set(approval.approved_by)) >= approval.needed


def _repeats(approval: Approval, user: str, approve: bool) -> bool:
    """Whether the decision is one ``user`` already took on this call."""
    if approval.denied_by is not None:
        return not approve and approval.denied_by == user
    return approve and user in approval.approved_by


def apply_decision(record: SpawnRecord, call_id: str, user: str, approve: bool) -> bool:
    """Apply one decision to ``record`` (``queued`` once it settles the call); False when it
    only repeats what ``user`` decided already, on a call still open."""
    approval = record.state.approvals.get(call_id) if record.state else None
    if approval is None:
        raise NotWaiting(record, call_id)
    if _settled(approval):
        if not _repeats(approval, user, approve):
            raise AlreadyDecided(record.spawn_id, call_id, approval)
        raise NotWaiting(record, call_id)  # the spawn has moved on since that decision
    if record.status != "waiting":
        raise NotWaiting(record, call_id)
    if approve:
        if user in approval.approved_by:
            return False
        approval.approved_by.append(user)
    else:
        approval.denied_by = user
    if _settled(approval):
        record.status = "queued"
    return True
