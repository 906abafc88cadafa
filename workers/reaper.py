"""One reaper per cluster: it enqueues again the running spawns whose worker is gone.

A worker that dies leaves its spawns ``running`` with their leases expiring. Every worker runs a
:class:`Reaper`, and they elect one: the key ``{prefix}reaper`` holds the leader's worker id with
a TTL of a few periods, renewed by its holder; the others stand by and the first to find it gone
takes over. The leader reads only the expired entries of the sorted set of lease deadlines
(:attr:`SpawnStore.leases_key`), never the records of live spawns, so its work follows the
number of dead leases, not the number of spawns. All times are the Redis server's (``TIME``), so
a worker whose clock is wrong changes nothing.

Each expired entry whose lease key is gone and whose record is still ``running`` is enqueued
again, at most once per lease period (``{prefix}requeue:{id}``, set ``NX`` for a lease's time,
guards against a second enqueue by this leader or a previous one). Its entry stays: the next
attempt's claim moves its deadline, and if no attempt claims the spawn (its message was lost, or
the attempt failed before its claim) it is enqueued again a lease later, instead of being left
``running`` forever. Entries of spawns that are not running any more, or no longer exist, are
removed, each only if its deadline has not moved since it was read.

The leader also sweeps the approval deadlines (:attr:`SpawnStore.approval_deadlines_key`): a
confirmation request whose deadline has passed undecided while its spawn waits is settled as
expired (:meth:`SpawnStore.expire_approval`), the spawn enqueued, and ``on_expired`` told (the
approval feed); the model then gets a tool result saying the request expired. Nobody has to
look at the spawn for that to happen. An entry is dropped only after its enqueue, so a leader
that dies in between leaves it to the next one, which enqueues the spawn again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import redis

from workers._spawn_scripts import (
    EXPIRED_APPROVALS,
    EXPIRED_LEASES,
    FORGET_EXPIRED,
)
from workers.election import Election
from workers.spawns import SpawnRecord, SpawnStore, decode_record, parse_deadline_member

__all__ = ["ELECTION_PERIODS", "REAP_BATCH", "Reaper"]

log = logging.getLogger(__name__)

#: The leader's election key lives this many periods: it survives two missed renewals.
ELECTION_PERIODS = 3
#: Expired leases looked at per period, at most (the rest wait for the next period).
REAP_BATCH = 500


class Reaper:
    """The reaper thread of one worker; it reaps only while it is the elected leader.

    ``requeue(record)`` enqueues a spawn again (the record comes without its messages);
    ``on_resumed(spawn_id)`` is called after each enqueue of a spawn whose worker was lost;
    ``on_expired(record, call_id)`` after each enqueue of a spawn whose confirmation request
    expired.
    """

    def __init__(
        self,
        store: SpawnStore,
        redis_client: redis.Redis,
        worker_id: str,
        lease_ms: int,
        period_s: float,
        requeue: Callable[[SpawnRecord], None],
        on_resumed: Callable[[str], None] | None = None,
        on_expired: Callable[[SpawnRecord, str], object] | None = None,
    ) -> None:
        self.store, self.r, self.worker_id = store, redis_client, worker_id
        self.lease_ms, self.period_s = lease_ms, period_s
        self.requeue, self.on_resumed, self.on_expired = requeue, on_resumed, on_expired
        self.election_key = f"{store.prefix}reaper"
        self.election = Election(
            redis_client,
            self.election_key,
            worker_id,
            int(period_s * 1000 * ELECTION_PERIODS),
            "reaper",
        )
        self._expired = redis_client.register_script(EXPIRED_LEASES)
        self._expired_approvals = redis_client.register_script(EXPIRED_APPROVALS)
        self._forget = redis_client.register_script(FORGET_EXPIRED)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spawn-reaper", daemon=True)

    @property
    def is_leader(self) -> bool:
        return self.election.held

    def start(self) -> None:
        self._thread.start()

    def stop(self, *, resign: bool = True) -> None:
        """Stop reaping. ``resign``: give the leadership up at once (else it lapses with the
        election key's TTL), so another worker's reaper takes over at its next period."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if resign:
            self.election.resign()

    def tick(self) -> int:
        """One period's work: keep or seek the leadership, and reap and sweep if leading.
        Returns how many spawns were enqueued again (lost workers, expired requests)."""
        if not self._elect():
            return 0
        return self._reap() + self._expire_approvals()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except redis.RedisError as exc:
                log.warning("reaper: %s", exc)
            except Exception:  # noqa: BLE001 - a bug in one period must not end the reaping
                log.exception("reaper: the period failed")
            self._stop.wait(self.period_s)

    def _elect(self) -> bool:
        return self.election.hold()

    def _reap(self) -> int:
        now, members = self._expired(keys=[self.store.leases_key], args=[REAP_BATCH])
        spawn_ids = [m.decode() if isinstance(m, bytes) else str(m) for m in members]
        if not spawn_ids:
            return 0
        pipe = self.r.pipeline(transaction=False)
        for spawn_id in spawn_ids:
            pipe.exists(self.store.lease_key(spawn_id))
            pipe.get(self.store._key(spawn_id))
        found = pipe.execute()
        done, resumed = [], 0
        for i, spawn_id in enumerate(spawn_ids):
            leased, raw = found[2 * i], found[2 * i + 1]
            if leased:
                continue  # the deadline passed but the lease lives: it is renewed or expires
            outcome = self._resume(spawn_id, raw)
            if outcome is None:
                done.append(spawn_id)
            else:
                resumed += outcome
        if done:
            self._forget(keys=[self.store.leases_key], args=[now, *done])
        return resumed

    def _expire_approvals(self) -> int:
        """Settle the confirmation requests whose deadline passed; how many were enqueued."""
        deadlines = self.store.approval_deadlines_key
        now, members = self._expired_approvals(keys=[deadlines], args=[REAP_BATCH])
        done, enqueued = [], 0
        for member in members:
            spawn_id, call_id = parse_deadline_member(member)
            outcome, record = self.store.expire_approval(spawn_id, call_id, float(now))
            if outcome == "keep":
                continue
            if record is not None and outcome in ("expired", "requeue"):
                if not self._enqueue_expired(record, call_id, fresh=outcome == "expired"):
                    continue  # the entry stays: the next period enqueues it again
                enqueued += 1
            done.append(member)
        if done:
            self._forget(keys=[deadlines], args=[now, *done])
        return enqueued

    def _enqueue_expired(self, record: SpawnRecord, call_id: str, *, fresh: bool) -> bool:
        if fresh:
            log.info(
                "spawn %s: the request for call %r expired undecided", record.spawn_id, call_id
            )
        try:
            self.requeue(record)
        except Exception:  # noqa: BLE001 - the next period tries again; others still get swept
            log.exception("spawn %s could not be enqueued after its expiry", record.spawn_id)
            return False
        if fresh and self.on_expired is not None:
            try:
                self.on_expired(record, call_id)
            except Exception:  # noqa: BLE001 - the spawn resumes; only the notice is lost
                log.exception(
                    "spawn %s: the expiry of %r was not announced", record.spawn_id, call_id
                )
        return True

    def _resume(self, spawn_id: str, raw: Any) -> int | None:
        """Enqueue the spawn again if it runs without a worker. Returns 1 if enqueued, 0 if not
        (now), ``None`` if its entry is to be removed (the spawn is not running)."""
        record = decode_record(raw) if raw else None
        if record is None or record.status != "running":
            return None
        guard = self.store.requeue_key(spawn_id)
        if not self.r.set(guard, "1", nx=True, px=self.lease_ms):
            return 0  # enqueued less than a lease ago, by this leader or the one before it
        log.warning("spawn %s lost its worker; re-enqueuing", spawn_id)
        try:
            self.requeue(record)
        except Exception:  # noqa: BLE001 - the next period tries again; others still get reaped
            log.exception("spawn %s could not be enqueued again", spawn_id)
            self.r.delete(guard)
            return 0
        if self.on_resumed is not None:
            self.on_resumed(spawn_id)
        return 1
