"""Spawn records in Redis: what was asked, which persona version runs it, its checkpoint, its
outcome, and the lease that says which worker holds it.

Every write of a running spawn is fenced by its lease: a worker that lost its lease (it stalled,
another worker took over) cannot overwrite the newer attempt's checkpoint. An attempt starts with
:meth:`SpawnStore.claim`, which takes the lease and marks the record ``running`` in one atomic
step: from the first moment a worker holds a spawn, its death shows as "running, no lease", the
state the reaper looks for.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal, cast

import redis
from pydantic import BaseModel, Field

from registry.errors import LeaseLost, NotFoundError, UserError
from workers.loop import Approval, LoopState

__all__ = [
    "AlreadyDecided",
    "DecisionRefused",
    "LeaseLost",
    "NotWaiting",
    "SpawnRecord",
    "SpawnStatus",
    "SpawnStore",
]

SpawnStatus = Literal["queued", "running", "waiting", "ok", "failed", "cancelled"]
FINAL_STATUSES = frozenset({"ok", "failed", "cancelled"})
#: How many times :meth:`SpawnStore.claim` retries when a concurrent write changed the record.
CLAIM_TRIES = 32


class SpawnRecord(BaseModel):
    spawn_id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    session_id: str
    persona: str
    prompt: str
    context: dict[str, Any] = Field(default_factory=dict)
    role: str = "admin"
    user: str = ""
    background: bool = False
    queue: str = ""
    reason: str = ""  # why this persona was chosen (the coordinator's matching hint)
    status: SpawnStatus = "queued"
    attempts: int = 0  # executions started by a worker, resumptions included
    lost_attempts: int = 0  # attempts whose worker died (or stalled) before reporting back
    persona_markdown: str = ""  # the persona version this spawn started with, pinned
    #: Keys the persona's ``initial_prompt`` looked up and the context lacked (they rendered
    #: ``<no value>``), as dotted paths; set when the spawn starts.
    missing_context: list[str] = Field(default_factory=list)
    persona_source: str = ""
    model_id: str = ""
    state: LoopState | None = None
    result: str = ""
    error: str = ""
    created: float = Field(default_factory=time.time)
    updated: float = Field(default_factory=time.time)

    @property
    def finished(self) -> bool:
        return self.status in FINAL_STATUSES


_FENCED_SET = """
if redis.call('GET', KEYS[2]) == ARGV[2] then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[3])
  if ARGV[4] == '1' then
    redis.call('DEL', KEYS[2])
  end
  return 1
end
return 0
"""
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class SpawnStore:
    def __init__(
        self, client: redis.Redis, prefix: str = "ongrid:", retention: int = 7 * 86400
    ) -> None:
        self.r = client
        self.prefix = prefix
        self.retention = retention
        self._fenced_set = client.register_script(_FENCED_SET)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)

    def _key(self, spawn_id: str) -> str:
        return f"{self.prefix}spawn:{spawn_id}"

    def lease_key(self, spawn_id: str) -> str:
        return f"{self.prefix}lease:{spawn_id}"

    @property
    def active_key(self) -> str:
        return f"{self.prefix}spawns:active"

    def create(self, record: SpawnRecord) -> SpawnRecord:
        pipe = self.r.pipeline()
        pipe.set(self._key(record.spawn_id), record.model_dump_json(), ex=self.retention)
        pipe.sadd(self.active_key, record.spawn_id)
        pipe.execute()
        return record

    def get(self, spawn_id: str) -> SpawnRecord | None:
        raw = cast(bytes | None, self.r.get(self._key(spawn_id)))
        return SpawnRecord.model_validate_json(raw) if raw else None

    def save(self, record: SpawnRecord, token: str, *, release: bool = False) -> None:
        """Write ``record`` if ``token`` still holds the lease; else :class:`LeaseLost`.

        ``release``: give the lease back in the same atomic step (an attempt's last write).
        """
        record.updated = time.time()
        ok = self._fenced_set(
            keys=[self._key(record.spawn_id), self.lease_key(record.spawn_id)],
            args=[record.model_dump_json(), token, self.retention, "1" if release else "0"],
        )
        if not ok:
            raise LeaseLost(record.spawn_id)
        if record.finished:
            self.r.srem(self.active_key, record.spawn_id)

    def save_unfenced(self, record: SpawnRecord) -> None:
        """For writes by the caller side while no worker holds the spawn (decisions, cancel)."""
        record.updated = time.time()
        self.r.set(self._key(record.spawn_id), record.model_dump_json(), ex=self.retention)

    def claim(self, spawn_id: str, ttl_ms: int) -> tuple[SpawnRecord | None, str | None]:
        """Start an attempt: take the lease and mark the record in one transaction.

        Returns the record and the lease token. No token: the spawn does not exist (no record
        either), is finished, or another attempt holds it. On success the record is ``running``
        with ``attempts`` counted, and ``lost_attempts`` too when it was ``running`` already
        (the previous attempt's worker died or stalled without reporting back). Both keys are
        written together, so no instant exists where a worker holds a spawn the reaper would
        not recognise as held; a worker that dies right after the claim leaves "running, no
        lease" once the lease expires.
        """
        key, lease = self._key(spawn_id), self.lease_key(spawn_id)
        with self.r.pipeline() as pipe:
            for _ in range(CLAIM_TRIES):
                try:
                    pipe.watch(key, lease)
                    raw = cast("bytes | None", pipe.get(key))
                    if not raw:
                        return None, None
                    record = SpawnRecord.model_validate_json(raw)
                    if record.finished or pipe.exists(lease):
                        return record, None
                    record.attempts += 1
                    if record.status == "running":
                        record.lost_attempts += 1
                    record.status = "running"
                    record.updated = time.time()
                    token = uuid.uuid4().hex
                    pipe.multi()
                    pipe.set(lease, token, px=ttl_ms)
                    pipe.set(key, record.model_dump_json(), ex=self.retention)
                    pipe.execute()
                    return record, token
                except redis.WatchError:
                    continue  # a decision or a cancel was written meanwhile: read it again
        raise redis.WatchError(f"spawn {spawn_id}: the record kept changing while being claimed")

    def renew(self, spawn_id: str, token: str, ttl_ms: int) -> bool:
        return bool(self._renew(keys=[self.lease_key(spawn_id)], args=[token, ttl_ms]))

    def release(self, spawn_id: str, token: str) -> None:
        self._release(keys=[self.lease_key(spawn_id)], args=[token])

    def leased(self, spawn_id: str) -> bool:
        return bool(self.r.exists(self.lease_key(spawn_id)))

    def active(self) -> list[str]:
        return sorted(
            m.decode() if isinstance(m, bytes) else m
            for m in cast(set[Any], self.r.smembers(self.active_key))
        )

    def request_cancel(self, spawn_id: str) -> None:
        self.r.set(f"{self.prefix}cancel:{spawn_id}", "1", ex=self.retention)

    def cancel_requested(self, spawn_id: str) -> bool:
        return bool(self.r.exists(f"{self.prefix}cancel:{spawn_id}"))

    # -- decisions on calls that wait for a person ---------------------------------------------

    def decide(
        self, spawn_id: str, call_id: str, user: str, approve: bool
    ) -> tuple[SpawnRecord, bool]:
        """Record ``user``'s decision on ``call_id`` in one transaction.

        Returns the record as it now stands and whether this decision settled the call (the
        spawn is then ``queued`` and the caller enqueues it). The record is read, changed and
        written under ``WATCH``: a concurrent write (another decision, a cancel, a worker's
        claim) makes the write fail and the decision is applied again to what that writer left,
        so concurrent decisions are all recorded or refused, never lost, and exactly one of them
        settles the call. Refusals: :class:`NotWaiting`, :class:`AlreadyDecided`.
        """
        key = self._key(spawn_id)
        with self.r.pipeline() as pipe:
            for _ in range(DECIDE_TRIES):
                try:
                    pipe.watch(key)
                    raw = cast("bytes | None", pipe.get(key))
                    if not raw:
                        raise NotFoundError("spawn", spawn_id)
                    record = SpawnRecord.model_validate_json(raw)
                    if not _apply_decision(record, call_id, user, approve):
                        return record, False  # a repeat of this person's decision
                    record.updated = time.time()
                    pipe.multi()
                    pipe.set(key, record.model_dump_json(), ex=self.retention)
                    pipe.execute()
                    return record, record.status == "queued"
                except redis.WatchError:
                    continue  # someone else wrote the record meanwhile: decide on what they left
        raise redis.WatchError(f"spawn {spawn_id}: the record kept changing during a decision")


#: How many times :meth:`SpawnStore.decide` retries when a concurrent write changed the record.
DECIDE_TRIES = 32


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


def _apply_decision(record: SpawnRecord, call_id: str, user: str, approve: bool) -> bool:
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
