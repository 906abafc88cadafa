"""People's decisions on a spawn's tool calls that wait for confirmation: whether a decision is
allowed, whether it settles the call, and the refusals (HTTP 409) when it is not.

A decision names the call's ``args_hash`` (:func:`~workers.loop.approval_hash`): an approval
binds to exactly the spawn, call, tool and arguments the person was shown. It is refused, each
with a code of its own and nothing recorded, when the hash is another call's
(``hash_mismatch``), the request has expired (``expired``: by the Redis server's clock, whether
or not the sweep has settled it yet), the same person decided that call already (``replayed``:
a second signature must come from someone else), someone else settled it first
(``already_decided``), or the spawn does not wait on it (``not_waiting``).

Pure logic over a :class:`~workers.spawns.SpawnRecord`; :meth:`SpawnStore.decide` applies it
inside its Redis transaction.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from registry.errors import UserError
from workers.loop import Approval, approval_hash

if TYPE_CHECKING:
    from workers.spawns import SpawnRecord

__all__ = [
    "AlreadyDecided",
    "DecisionRefused",
    "Expired",
    "HashMismatch",
    "NotWaiting",
    "Replayed",
    "apply_decision",
    "expected_hash",
]


class DecisionRefused(UserError):
    """A decision the spawn's state does not allow (HTTP 409); nothing was recorded."""

    #: The error code the API answers with.
    code = "conflict"

    @property
    def details(self) -> dict[str, Any]:
        """Structured specifics for the API's error body."""
        return {}


class NotWaiting(DecisionRefused):
    """The spawn does not wait for a decision on that call (any more, or never did)."""

    code = "not_waiting"

    def __init__(self, record: SpawnRecord, call_id: str) -> None:
        self.status = record.status
        self.waiting_on = sorted(
            cid
            for cid, approval in (record.state.approvals if record.state else {}).items()
            if record.status == "waiting" and not approval.settled
        )
        super().__init__(f"spawn {record.spawn_id} is not waiting for a decision on {call_id!r}")

    @property
    def details(self) -> dict[str, Any]:
        return {"status": self.status, "waiting_on": self.waiting_on}


class AlreadyDecided(DecisionRefused):
    """Someone else settled the call first; the first decision stands."""

    code = "already_decided"

    def __init__(self, spawn_id: str, call_id: str, approval: Approval) -> None:
        self.decision = "denied" if approval.denied_by is not None else "approved"
        self.decided_by = (
            [approval.denied_by] if approval.denied_by is not None else list(approval.approved_by)
        )
        super().__init__(
            f"call {call_id!r} of spawn {spawn_id} was already {self.decision} by "
            f"{' and '.join(self.decided_by)}; the first decision stands"
        )

    @property
    def details(self) -> dict[str, Any]:
        return {"decision": self.decision, "decided_by": self.decided_by}


class HashMismatch(DecisionRefused):
    """The decision names another ``args_hash`` than the call's: it was not taken on what runs."""

    code = "hash_mismatch"

    def __init__(self, call_id: str, given: str, expected: str) -> None:
        self.given, self.expected = given, expected
        super().__init__(
            f"args_hash {given[:80]!r} is not the hash of call {call_id!r}: the decision must "
            "name the args_hash of its confirmation_required (GET /api/v1/approvals shows it), "
            "which binds it to exactly that call's tool and arguments"
        )

    @property
    def details(self) -> dict[str, Any]:
        return {"args_hash": self.expected}


class Expired(DecisionRefused):
    """The request's deadline has passed: the call is not run, whatever is decided now."""

    code = "expired"

    def __init__(self, call_id: str, expires_at: float) -> None:
        self.expires_at = expires_at
        when = datetime.fromtimestamp(expires_at, UTC).isoformat(timespec="seconds")
        super().__init__(
            f"the approval request for call {call_id!r} expired at {when}; the model is told "
            "the call was not run, and may ask again"
        )

    @property
    def details(self) -> dict[str, Any]:
        return {"expires_at": self.expires_at}


class Replayed(DecisionRefused):
    """The same person decided this call already: nobody signs twice."""

    code = "replayed"

    def __init__(self, call_id: str, user: str, approval: Approval) -> None:
        self.user = user
        self.approved_by = list(approval.approved_by)
        self.needed = approval.needed
        if approval.settled:
            why = "a decision is taken once"
        else:
            left = approval.needed - len(set(approval.approved_by))
            why = f"{left} more approval must come from someone else"
        super().__init__(f"{user} already decided call {call_id!r}; {why}")

    @property
    def details(self) -> dict[str, Any]:
        return {"user": self.user, "approved_by": self.approved_by, "needed": self.needed}


def expected_hash(record: SpawnRecord, call_id: str, approval: Approval) -> str:
    """The hash a decision on ``call_id`` must name: the one the request carried, else (a state
    saved before hashes) that of the pending call."""
    if approval.args_hash:
        return approval.args_hash
    pending = record.state.pending if record.state else []
    call = next((c for c in pending if c.id == call_id), None)
    return approval_hash(record.spawn_id, call) if call is not None else ""


def _decided_by(approval: Approval, user: str) -> bool:
    return user in approval.approved_by or approval.denied_by == user


def apply_decision(
    record: SpawnRecord, call_id: str, user: str, approve: bool, args_hash: str, now: float
) -> bool:
    """Apply one decision to ``record`` at unix time ``now``; whether it settled the call (the
    record is then ``queued``). Refusals: see the module docstring; the record is unchanged."""
    approval = record.state.approvals.get(call_id) if record.state else None
    if approval is None:
        raise NotWaiting(record, call_id)
    expected = expected_hash(record, call_id, approval)
    if args_hash != expected:
        raise HashMismatch(call_id, args_hash, expected)
    if approval.expired or (approval.expires_at and now >= approval.expires_at):
        raise Expired(call_id, approval.expires_at)
    if _decided_by(approval, user):
        raise Replayed(call_id, user, approval)
    if approval.settled:
        raise AlreadyDecided(record.spawn_id, call_id, approval)
    if record.status != "waiting":
        raise NotWaiting(record, call_id)
    if approve:
        approval.approved_by.append(user)
    else:
        approval.denied_by = user
    if approval.settled:
        record.status = "queued"
        return True
    return False
