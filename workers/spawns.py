"""Spawn records in Redis: what was asked, which persona version runs it, its checkpoint, its
outcome, and the lease that says which worker holds it.

Every write of a running spawn is fenced by its lease: a worker that lost its lease (it stalled,
another worker took over) cannot overwrite the newer attempt's checkpoint. An attempt starts with
:meth:`SpawnStore.claim`, which takes the lease and marks the record ``running`` in one atomic
step: from the first moment a worker holds a spawn, its death shows as "running, no lease", the
state the reaper looks for.

A checkpoint appends instead of rewriting: the record's JSON leaves out the transcript
(``state.messages``), which lives in a Redis list of its own, and a write appends only the
messages added since that record object was read or last written, in the same script call as
the record (so both change together, and only under the lease). A record read without its
messages (a decision, the reaper) cannot change the list when written back: it does not know
what the list holds, so it leaves it alone.

Lease deadlines are indexed in a sorted set (score: the deadline in Redis server milliseconds,
so hosts with skewed clocks agree), so the one elected reaper (:mod:`workers.reaper`) reads only
the expired ones, and a process renews all its leases in one call
(:meth:`SpawnStore.renew_all`). The lease key with its TTL stays the fence; the set is an index.

Approval deadlines are indexed the same way (:attr:`_Keys.approval_deadlines_key`, score: the
request's ``expires_at`` in unix seconds, member: :func:`deadline_member`): the worker files a
call's deadline before the checkpoint that records the request, and the elected reaper settles
the requests found expired undecided (:meth:`SpawnStore.expire_approval`).

:class:`SpawnStore` is the blocking store, :class:`AsyncSpawnStore` the engine's; both use the
same scripts and the same serialization.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal, TypeVar, cast

import redis
import redis.asyncio
from pydantic import BaseModel, Field, PrivateAttr, TypeAdapter

from registry.errors import LeaseLost, NotFoundError
from workers._decisions import (
    AlreadyDecided,
    DecisionRefused,
    Expired,
    HashMismatch,
    NotWaiting,
    Replayed,
    apply_decision,
)
from workers._spawn_scripts import LEASE_DEADLINE, RELEASE, RENEW_ALL, SAVE
from workers.budget import SpawnBudget
from workers.loop import LoopState
from workers.messages import Message

__all__ = [
    "AlreadyDecided",
    "AsyncSpawnStore",
    "DecisionRefused",
    "Expired",
    "ExpiryOutcome",
    "HashMismatch",
    "LeaseLost",
    "NotWaiting",
    "Replayed",
    "SpawnRecord",
    "SpawnStatus",
    "SpawnStore",
    "StoredResults",
    "deadline_member",
    "parse_deadline_member",
]

SpawnStatus = Literal["queued", "running", "waiting", "ok", "failed", "cancelled"]
FINAL_STATUSES = frozenset({"ok", "failed", "cancelled"})
#: Statuses of a spawn that waits for a worker (``running`` only once its lease is gone).
UNHELD_STATUSES = frozenset({"queued", "running"})
#: How many times a transaction over a record retries when a concurrent write changed it.
T = TypeVar("T")
#: What a transaction's step returns: its value, and the writes to queue (``None``: none).
Step = tuple[T, Callable[[Any], None] | None]

CLAIM_TRIES = 32
DECIDE_TRIES = 32
FAIL_TRIES = 8
EXPIRE_TRIES = 8
#: What :meth:`SpawnStore.expire_approval` did with one deadline entry: ``expired`` (settled it
#: now: enqueue the spawn), ``requeue`` (settled by an earlier sweep that may have died before
#: its enqueue: enqueue again), ``forget`` (nothing left to expire: drop the entry), ``keep``
#: (not yet: the spawn runs, or the deadline moved).
ExpiryOutcome = Literal["expired", "requeue", "forget", "keep"]


def deadline_member(spawn_id: str, call_id: str) -> str:
    """The member of the approval deadlines set for one call (call ids may hold any text)."""
    return json.dumps([spawn_id, call_id])


def parse_deadline_member(member: bytes | str) -> tuple[str, str]:
    spawn_id, call_id = json.loads(member)
    return str(spawn_id), str(call_id)


def _redis_seconds(reply: Any) -> float:
    """``TIME``'s reply (seconds, microseconds) as unix seconds."""
    seconds, micros = reply
    return int(seconds) + int(micros) / 1_000_000


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
    #: The spawn that dispatched this one (a coordinator's); empty for a spawn a person started.
    parent_spawn_id: str = ""
    #: Notification channels told of this spawn's end besides those the routing rules name
    #: (a schedule's ``channels``): see :mod:`coordinator.notify`.
    notify: list[str] = Field(default_factory=list)
    status: SpawnStatus = "queued"
    attempts: int = 0  # executions started by a worker, resumptions included
    lost_attempts: int = 0  # attempts whose worker died (or stalled) before reporting back
    persona_markdown: str = ""  # the persona version this spawn started with, pinned
    #: Keys the persona's ``initial_prompt`` looked up and the context lacked (they rendered
    #: ``<no value>``), as dotted paths; set when the spawn starts.
    missing_context: list[str] = Field(default_factory=list)
    persona_source: str = ""
    model_id: str = ""
    #: The W3C trace context (``traceparent``, ``tracestate``) of the request that made the
    #: spawn: its spans, on whichever worker runs it, belong to that request's trace.
    trace: dict[str, str] = Field(default_factory=dict)
    state: LoopState | None = None
    #: Its budget: asked for, resolved at the first attempt, spent (:mod:`workers.budget`).
    budget: SpawnBudget = Field(default_factory=SpawnBudget)
    result: str = ""
    error: str = ""
    created: float = Field(default_factory=time.time)
    updated: float = Field(default_factory=time.time)
    #: How many leading messages of ``state.messages`` the spawn's message list in Redis holds:
    #: the next write appends the rest (or replaces the list when the state holds fewer).
    #: ``None``: this object was read without its messages (``state.messages`` is empty, not the
    #: transcript), so its writes leave the list as it is.
    _messages_saved: int | None = PrivateAttr(default=None)
    #: ``state.rewrites`` as the list in Redis reflects it: a state rewritten in place since
    #: (results shrunk, a compaction) replaces the list whole.
    _rewrites_saved: int = PrivateAttr(default=0)

    @property
    def finished(self) -> bool:
        return self.status in FINAL_STATUSES


# -- serialization, shared by both stores -------------------------------------------------------

_MESSAGES: TypeAdapter[list[Message]] = TypeAdapter(list[Message])


def encode_record(record: SpawnRecord) -> str:
    """The record's JSON, without the transcript (it lives in the message list)."""
    return record.model_dump_json(exclude={"state": {"messages"}})


def decode_record(raw: bytes | str) -> SpawnRecord:
    """A record from its JSON alone: without its messages, so writing it back leaves the list
    alone. A record written before messages had a list of their own carries them inline: those
    are kept, and its next write moves them to the list."""
    data = json.loads(raw)
    state = data.get("state")
    inline = state.pop("messages", None) if state is not None else None
    if state is not None:
        state["messages"] = inline if inline is not None else []
    record = SpawnRecord.model_validate(data)
    if inline is not None:
        record._messages_saved = 0
    return record


def attach_messages(record: SpawnRecord, items: list[bytes]) -> SpawnRecord:
    """``record`` with its transcript, read from the message list (``items``)."""
    if record._messages_saved is not None:  # inline messages of an older record: they stand
        return record
    if record.state is not None:
        record.state.messages = _MESSAGES.validate_json(b"[" + b",".join(items) + b"]")
        record._rewrites_saved = record.state.rewrites
    record._messages_saved = len(items)
    return record


def _unsaved(record: SpawnRecord) -> tuple[bool, list[str]]:
    """(replace the list?, messages to append): what the message list lacks of ``record``."""
    saved = record._messages_saved
    if saved is None:
        return False, []
    messages = record.state.messages if record.state is not None else []
    rewritten = record.state is not None and record.state.rewrites != record._rewrites_saved
    # The state was replaced by a shorter one, or rewritten in place: the list follows it.
    if len(messages) < saved or rewritten:
        return True, [m.model_dump_json() for m in messages]
    return False, [m.model_dump_json() for m in messages[saved:]]


def _mark_saved(record: SpawnRecord) -> None:
    if record._messages_saved is not None:
        record._messages_saved = len(record.state.messages) if record.state is not None else 0
        record._rewrites_saved = record.state.rewrites if record.state is not None else 0


class _Keys:
    """Where a spawn's data lives, under one prefix; how long it is kept."""

    def __init__(self, prefix: str, retention: int) -> None:
        self.prefix = prefix
        self.retention = retention

    def _key(self, spawn_id: str) -> str:
        return f"{self.prefix}spawn:{spawn_id}"

    def messages_key(self, spawn_id: str) -> str:
        return f"{self.prefix}messages:{spawn_id}"

    def lease_key(self, spawn_id: str) -> str:
        return f"{self.prefix}lease:{spawn_id}"

    def results_key(self, spawn_id: str) -> str:
        """The hash of the spawn's large tool results, by call id (:mod:`workers.context`)."""
        return f"{self.prefix}results:{spawn_id}"

    def cancel_key(self, spawn_id: str) -> str:
        return f"{self.prefix}cancel:{spawn_id}"

    def requeue_key(self, spawn_id: str) -> str:
        return f"{self.prefix}requeue:{spawn_id}"

    @property
    def active_key(self) -> str:
        return f"{self.prefix}spawns:active"

    @property
    def leases_key(self) -> str:
        """The sorted set of lease deadlines: member spawn id, score Redis time in ms."""
        return f"{self.prefix}leases"

    @property
    def approval_deadlines_key(self) -> str:
        """The sorted set of approval deadlines: member :func:`deadline_member`, score the
        request's ``expires_at`` (unix seconds)."""
        return f"{self.prefix}approvals:deadlines"

    def _queue_write(self, pipe: Any, record: SpawnRecord) -> None:
        """Queue the write of ``record`` and of the messages its list lacks on a ``MULTI``
        pipeline (sync or asyncio: queuing a command is synchronous in both)."""
        spawn_id = record.spawn_id
        replace, new = _unsaved(record)
        pipe.set(self._key(spawn_id), encode_record(record), ex=self.retention)
        if replace:
            pipe.delete(self.messages_key(spawn_id))
        if new:
            pipe.rpush(self.messages_key(spawn_id), *new)
        # The list is kept as long as its record, even by a write that leaves its content alone.
        pipe.expire(self.messages_key(spawn_id), self.retention)

    def _queue_claim(self, pipe: Any, record: SpawnRecord, token: str, ttl_ms: int) -> None:
        pipe.set(self.lease_key(record.spawn_id), token, px=ttl_ms)
        pipe.eval(LEASE_DEADLINE, 1, self.leases_key, ttl_ms, record.spawn_id)
        self._queue_write(pipe, record)

    def _save_call(
        self, record: SpawnRecord, token: str, release: bool
    ) -> tuple[list[str], list[Any]]:
        """Keys and arguments of the fenced save script for ``record``."""
        record.updated = time.time()
        replace, new = _unsaved(record)
        spawn_id = record.spawn_id
        keys = [
            self._key(spawn_id),
            self.lease_key(spawn_id),
            self.messages_key(spawn_id),
            self.leases_key,
            self.active_key,
            self.cancel_key(spawn_id),
        ]
        flags = [int(release), int(record.finished), spawn_id, int(replace)]
        return keys, [encode_record(record), token, self.retention, *flags, *new]

    def _renewal(self, held: Mapping[str, str], ttl_ms: int) -> tuple[list[str], list[Any]]:
        """Keys and arguments of the renewal script for every lease in ``held``."""
        keys = [self.leases_key, *(self.lease_key(spawn_id) for spawn_id in held)]
        args: list[Any] = [ttl_ms]
        for spawn_id, token in held.items():
            args += [spawn_id, token]
        return keys, args


#: What the save script answers when it wrote and a cancel of the spawn was requested.
_CANCEL_REQUESTED = 2


def _start_attempt(record: SpawnRecord) -> str:
    """Mark ``record`` as run by a new attempt; the attempt's lease token."""
    record.attempts += 1
    if record.status == "running":
        record.lost_attempts += 1
    record.status = "running"
    record.updated = time.time()
    return uuid.uuid4().hex


def _names(reply: Any) -> list[str]:
    return [m.decode() if isinstance(m, bytes) else str(m) for m in reply]


# -- the blocking store -----------------------------------------------------------------------


class SpawnStore(_Keys):
    def __init__(
        self, client: redis.Redis, prefix: str = "ongrid:", retention: int = 7 * 86400
    ) -> None:
        super().__init__(prefix, retention)
        self.r = client
        self._save = client.register_script(SAVE)
        self._renew_all = client.register_script(RENEW_ALL)
        self._release = client.register_script(RELEASE)

    def create(self, record: SpawnRecord) -> SpawnRecord:
        record._messages_saved = 0  # the list starts as the record's messages
        pipe = self.r.pipeline()
        pipe.delete(self.messages_key(record.spawn_id))
        self._queue_write(pipe, record)
        pipe.sadd(self.active_key, record.spawn_id)
        pipe.execute()
        _mark_saved(record)
        return record

    def get(self, spawn_id: str) -> SpawnRecord | None:
        """The record with its messages (read together, in one transaction)."""
        pipe = self.r.pipeline()
        pipe.get(self._key(spawn_id))
        pipe.lrange(self.messages_key(spawn_id), 0, -1)
        raw, items = pipe.execute()
        return attach_messages(decode_record(raw), items) if raw else None

    def save(self, record: SpawnRecord, token: str, *, release: bool = False) -> bool:
        """Write ``record`` if ``token`` still holds the lease; else :class:`LeaseLost`.

        ``release``: give the lease back in the same atomic step (an attempt's last write).
        Returns whether a cancel of the spawn has been requested, looked at in the same step.
        """
        keys, args = self._save_call(record, token, release)
        written = int(self._save(keys=keys, args=args))
        if not written:
            raise LeaseLost(record.spawn_id)
        _mark_saved(record)
        return written == _CANCEL_REQUESTED

    def save_unfenced(self, record: SpawnRecord) -> None:
        """For writes by the caller side while no worker holds the spawn (decisions, cancel)."""
        record.updated = time.time()
        pipe = self.r.pipeline()
        self._queue_write(pipe, record)
        pipe.execute()
        _mark_saved(record)

    def claim(self, spawn_id: str, ttl_ms: int) -> tuple[SpawnRecord | None, str | None]:
        """Start an attempt: take the lease and mark the record in one transaction.

        Returns the record and the lease token. No token: the spawn does not exist (no record
        either), is finished, or another attempt holds it (the record then comes without its
        messages). On success the record, with its messages, is ``running`` with ``attempts``
        counted, and ``lost_attempts`` too when it was ``running`` already (the previous
        attempt's worker died or stalled without reporting back). The lease, its deadline and
        the record are written together, so no instant exists where a worker holds a spawn the
        reaper would not recognise as held; a worker that dies right after the claim leaves
        "running, no lease" once the lease expires.
        """
        key, lease, messages = (
            self._key(spawn_id),
            self.lease_key(spawn_id),
            self.messages_key(spawn_id),
        )

        def step(pipe: Any) -> Step[tuple[SpawnRecord | None, str | None]]:
            raw = cast("bytes | None", pipe.get(key))
            if not raw:
                return (None, None), None
            record = decode_record(raw)
            if record.finished or pipe.exists(lease):
                return (record, None), None
            attach_messages(record, cast("list[bytes]", pipe.lrange(messages, 0, -1)))
            token = _start_attempt(record)
            return (record, token), lambda p: self._queue_claim(p, record, token, ttl_ms)

        # A decision or a cancel written meanwhile: read it again.
        record, token = self._transaction(
            (key, lease, messages), CLAIM_TRIES, step, f"spawn {spawn_id}", "being claimed"
        )
        if record is not None and token is not None:
            _mark_saved(record)
        return record, token

    def renew(self, spawn_id: str, token: str, ttl_ms: int) -> bool:
        return not self.renew_all({spawn_id: token}, ttl_ms)

    def renew_all(self, held: Mapping[str, str], ttl_ms: int) -> list[str]:
        """Renew every lease of ``held`` (spawn id → token) in one call; returns the spawn ids
        whose lease was no longer that token's (expired, or taken by another attempt)."""
        if not held:
            return []
        keys, args = self._renewal(held, ttl_ms)
        return _names(self._renew_all(keys=keys, args=args))

    def release(self, spawn_id: str, token: str) -> None:
        self._release(keys=[self.lease_key(spawn_id), self.leases_key], args=[token, spawn_id])

    def leased(self, spawn_id: str) -> bool:
        return bool(self.r.exists(self.lease_key(spawn_id)))

    def active(self) -> list[str]:
        return sorted(_names(cast(set[Any], self.r.smembers(self.active_key))))

    def request_cancel(self, spawn_id: str) -> None:
        self.r.set(self.cancel_key(spawn_id), "1", ex=self.retention)

    def cancel_requested(self, spawn_id: str) -> bool:
        return bool(self.r.exists(self.cancel_key(spawn_id)))

    def fail_unheld(
        self,
        spawn_id: str,
        *,
        served: Callable[[SpawnRecord], bool],
        error: Callable[[SpawnRecord], str],
    ) -> SpawnRecord | None:
        """Fail a spawn no attempt holds (``queued``, or ``running`` with its lease expired)
        unless ``served(record)``; its error is ``error(record)``.

        A transaction over the record and its lease: a worker that claims the spawn at the same
        moment either wins or finds it finished. Returns the failed record, without its
        messages; ``None`` when the spawn was left as it is.
        """
        key, lease = self._key(spawn_id), self.lease_key(spawn_id)

        def step(pipe: Any) -> Step[SpawnRecord | None]:
            raw = cast("bytes | None", pipe.get(key))
            if not raw or pipe.exists(lease):
                return None, None
            record = decode_record(raw)
            if record.status not in UNHELD_STATUSES or served(record):
                return None, None
            record.status = "failed"
            record.error = error(record)
            record.updated = time.time()

            def write(p: Any) -> None:
                self._queue_write(p, record)
                p.srem(self.active_key, spawn_id)
                p.zrem(self.leases_key, spawn_id)

            return record, write

        try:  # claimed, decided or cancelled meanwhile: look again
            return self._transaction((key, lease), FAIL_TRIES, step, f"spawn {spawn_id}")
        except redis.WatchError:
            return None

    def decide(
        self, spawn_id: str, call_id: str, user: str, approve: bool, args_hash: str
    ) -> tuple[SpawnRecord, bool]:
        """Record ``user``'s decision on ``call_id``, naming its ``args_hash``, in one
        transaction.

        Returns the record as it now stands, without its messages, and whether this decision
        settled the call (the spawn is then ``queued`` and the caller enqueues it). The record
        is read, changed and written under ``WATCH``: a concurrent write (another decision, a
        cancel, a worker's claim) makes the write fail and the decision is applied again to
        what that writer left, so concurrent decisions are all recorded or refused, never lost,
        and exactly one of them settles the call. Expiry is judged by the Redis server's clock.
        Refusals: the :class:`DecisionRefused` family (:mod:`workers._decisions`).
        """
        key = self._key(spawn_id)

        def step(pipe: Any) -> Step[tuple[SpawnRecord, bool]]:
            raw = cast("bytes | None", pipe.get(key))
            if not raw:
                raise NotFoundError("spawn", spawn_id)
            now = _redis_seconds(pipe.time())
            record = decode_record(raw)
            settled = apply_decision(record, call_id, user, approve, args_hash, now)
            record.updated = time.time()
            return (record, settled), lambda p: self._queue_write(p, record)

        # Someone else wrote the record meanwhile: decide on what they left.
        return self._transaction(
            (key,), DECIDE_TRIES, step, f"spawn {spawn_id}", "during a decision"
        )

    def expire_approval(
        self, spawn_id: str, call_id: str, now: float
    ) -> tuple[ExpiryOutcome, SpawnRecord | None]:
        """Settle ``call_id``'s request as expired if, at unix time ``now`` (the Redis server's),
        its deadline has passed undecided while the spawn waits on it: ``queued`` in one
        transaction (a decision at the same moment either wins or is refused as expired).

        Returns the :data:`ExpiryOutcome` and the record (without its messages) for
        ``expired`` and ``requeue``. The caller enqueues the spawn for those two, and drops the
        deadline entry only after the enqueue, so a sweep that dies in between is repeated.
        """
        key = self._key(spawn_id)

        def step(pipe: Any) -> Step[tuple[ExpiryOutcome, SpawnRecord | None]]:
            raw = cast("bytes | None", pipe.get(key))
            record = decode_record(raw) if raw else None
            outcome = _expiry(record, call_id, now)
            if outcome != "expired" or record is None:
                return (outcome, record), None
            record.updated = time.time()
            return (outcome, record), lambda p: self._queue_write(p, record)

        try:  # decided, claimed or cancelled meanwhile: look again
            return self._transaction((key,), EXPIRE_TRIES, step, f"spawn {spawn_id}")
        except redis.WatchError:
            return "keep", None

    def _transaction(
        self,
        watch: tuple[str, ...],
        tries: int,
        step: Callable[[Any], Step[T]],
        what: str,
        while_: str = "",
    ) -> T:
        """Read under ``WATCH`` of ``watch`` and write in ``MULTI`` what ``step`` decided, read
        and decided again each time a concurrent write to a watched key made the write fail.

        ``step`` reads through the pipeline and returns its value and the writes to queue
        (``None``: nothing to write). After ``tries`` reads that all met a concurrent write:
        :class:`redis.WatchError`, naming ``what`` kept changing (``while_``).
        """
        with self.r.pipeline() as pipe:
            for _ in range(tries):
                try:
                    pipe.watch(*watch)
                    value, write = step(pipe)
                    if write is not None:
                        pipe.multi()
                        write(pipe)
                        pipe.execute()
                    return value
                except redis.WatchError:
                    continue
        raise redis.WatchError(f"{what}: the record kept changing {while_}".rstrip())


def _expiry(record: SpawnRecord | None, call_id: str, now: float) -> ExpiryOutcome:
    """What the sweep does with ``call_id``'s deadline entry; marks ``record`` for ``expired``."""
    approval = record.state.approvals.get(call_id) if record and record.state else None
    if record is None or approval is None or record.finished:
        return "forget"
    if approval.expired:
        return "requeue" if record.status == "queued" else "forget"
    if approval.settled:
        return "forget"
    if not approval.expires_at or approval.expires_at > now or record.status != "waiting":
        return "keep"  # running (about to park, or resumed after a crash): looked at again
    approval.expired = True
    record.status = "queued"
    return "expired"


# -- the engine's store -----------------------------------------------------------------------


class AsyncSpawnStore(_Keys):
    """What the engine's coroutines need of :class:`SpawnStore`, on ``redis.asyncio``: the same
    keys, scripts and semantics."""

    def __init__(
        self, client: redis.asyncio.Redis, prefix: str = "ongrid:", retention: int = 7 * 86400
    ) -> None:
        super().__init__(prefix, retention)
        self.r = client
        self._save = client.register_script(SAVE)
        self._renew_all = client.register_script(RENEW_ALL)
        self._release = client.register_script(RELEASE)

    async def get(self, spawn_id: str) -> SpawnRecord | None:
        """The record with its messages (read together, in one transaction)."""
        async with self.r.pipeline() as pipe:
            pipe.get(self._key(spawn_id))
            pipe.lrange(self.messages_key(spawn_id), 0, -1)
            raw, items = await pipe.execute()
        return attach_messages(decode_record(raw), items) if raw else None

    def results(self, spawn_id: str) -> StoredResults:
        """The spawn's store of large tool results."""
        return StoredResults(self, spawn_id)

    async def save(self, record: SpawnRecord, token: str, *, release: bool = False) -> bool:
        """:meth:`SpawnStore.save`."""
        keys, args = self._save_call(record, token, release)
        written = int(await self._save(keys=keys, args=args))
        if not written:
            raise LeaseLost(record.spawn_id)
        _mark_saved(record)
        return written == _CANCEL_REQUESTED

    async def claim(self, spawn_id: str, ttl_ms: int) -> tuple[SpawnRecord | None, str | None]:
        """:meth:`SpawnStore.claim`."""
        key, lease, messages = (
            self._key(spawn_id),
            self.lease_key(spawn_id),
            self.messages_key(spawn_id),
        )
        async with self.r.pipeline() as pipe:
            for _ in range(CLAIM_TRIES):
                try:
                    await pipe.watch(key, lease, messages)
                    raw = await pipe.get(key)
                    if not raw:
                        return None, None
                    record = decode_record(raw)
                    if record.finished or await pipe.exists(lease):
                        return record, None
                    items = await cast("Awaitable[list[bytes]]", pipe.lrange(messages, 0, -1))
                    attach_messages(record, items)
                    token = _start_attempt(record)
                    pipe.multi()
                    self._queue_claim(pipe, record, token, ttl_ms)
                    await pipe.execute()
                    _mark_saved(record)
                    return record, token
                except redis.WatchError:
                    continue  # a decision or a cancel was written meanwhile: read it again
        raise redis.WatchError(f"spawn {spawn_id}: the record kept changing while being claimed")

    async def renew_all(self, held: Mapping[str, str], ttl_ms: int) -> list[str]:
        """:meth:`SpawnStore.renew_all`."""
        if not held:
            return []
        keys, args = self._renewal(held, ttl_ms)
        return _names(await self._renew_all(keys=keys, args=args))

    async def release(self, spawn_id: str, token: str) -> None:
        await self._release(
            keys=[self.lease_key(spawn_id), self.leases_key], args=[token, spawn_id]
        )

    async def cancel_requested(self, spawn_id: str) -> bool:
        return bool(await self.r.exists(self.cancel_key(spawn_id)))

    async def file_deadline(self, spawn_id: str, call_id: str, expires_at: float) -> None:
        """Index the deadline of a confirmation request, for the sweep that expires it."""
        member = deadline_member(spawn_id, call_id)
        await self.r.zadd(self.approval_deadlines_key, {member: expires_at})


class StoredResults:
    """One spawn's large tool results in Redis (a :class:`~workers.context.ResultStore`), kept
    as long as its record. Written before the checkpoint that refers to a result; a result is
    the same whichever attempt writes it (a call runs once), so the write is not fenced."""

    def __init__(self, store: AsyncSpawnStore, spawn_id: str) -> None:
        self._r = store.r
        self._key = store.results_key(spawn_id)
        self._retention = store.retention

    async def put(self, call_id: str, content: str) -> None:
        async with self._r.pipeline(transaction=False) as pipe:
            pipe.hset(self._key, call_id, content)
            pipe.expire(self._key, self._retention)
            await pipe.execute()

    async def get(self, call_id: str) -> str | None:
        raw: Any = await cast(Awaitable[Any], self._r.hget(self._key, call_id))
        return None if raw is None else raw.decode() if isinstance(raw, bytes) else str(raw)
