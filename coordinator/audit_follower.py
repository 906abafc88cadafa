"""The audit trail's copy of what happens on workers: requests and expiries, from the feed.

A confirmation request is made on a worker and an expiry by the elected reaper; both are
published on the approval feed (:mod:`workers.approvals`). Workers do not write the audit table
themselves: the feed is already the durable record of both, numbered, and keeping the table's
writes in the API keeps the database off the spawn's path (a database outage never holds up a
spawn or the sweep). :class:`AuditFollower` copies the feed into the table from where it left
off (the highest seq of the feed's epoch in the table), idempotently, so any number of API
processes may run one, and a restarted one loses nothing the feed still holds (its last 10 000
entries, kept a week after the last one). The decisions on the feed are skipped: the API writes
those rows itself when it takes them.

:meth:`AuditFollower.catch_up` also runs before the audit is read, so a reader sees every
request published before the read.
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime

import redis
from sqlalchemy.exc import SQLAlchemyError

from coordinator.storage.audit import AuditEntry, AuditStore
from coordinator.storage.engine import Database, DatabaseUnavailable
from workers.approvals import FEED, ApprovalFeed
from workers.messages import ApprovalDecided, ConfirmationRequired, Event

__all__ = ["AuditFollower", "entry_of"]

log = logging.getLogger(__name__)

#: Feed entries read per round trip.
_BATCH = 500
#: Longest block of one read of the feed (seconds): how soon the thread notices ``stop``.
_BLOCK = 1.0
#: Seconds between two tries while the database or Redis does not answer.
_RETRY = 2.0


def _when(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def entry_of(event: Event) -> AuditEntry | None:
    """The audit row of a feed event; ``None`` for the entries the API records itself."""
    if isinstance(event, ConfirmationRequired):
        by = _when(event.expires_at).isoformat(timespec="seconds") if event.expires_at else "-"
        signers = "two different people" if event.needed > 1 else "one person"
        return AuditEntry(
            at=_when(event.ts),
            spawn_id=event.spawn_id,
            session_id=event.session_id,
            call_id=event.call_id,
            tool=event.name,
            args_hash=event.args_hash,
            actor=event.requested_by.user,
            role=event.requested_by.role,
            action="requested",
            outcome=f"{event.requested_by.persona} asks for {signers} to approve by {by}",
        )
    if isinstance(event, ApprovalDecided) and event.decision == "expired":
        signed = ", ".join(event.approved_by) or "nobody"
        return AuditEntry(
            at=_when(event.ts),
            spawn_id=event.spawn_id,
            session_id=event.session_id,
            call_id=event.call_id,
            tool=event.name,
            args_hash=event.args_hash,
            actor="",
            role="",
            action="expired",
            outcome=f"expired undecided (approved by {signed} of {event.needed} needed); "
            "the call was not run",
        )
    return None


class AuditFollower:
    """Copies the approval feed's requests and expiries into the audit table (a thread)."""

    def __init__(self, feed: ApprovalFeed, store: AuditStore, database: Database) -> None:
        self.feed, self.store, self.database = feed, store, database
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start copying in a thread (again, after :meth:`stop`: an app's lifespan may rerun)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(self._stop,), name="audit-follower", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join()

    def catch_up(self) -> int:
        """Copy every feed entry after the table's position; returns the last seq copied.
        :class:`~coordinator.storage.engine.DatabaseUnavailable` when the database is down."""
        with self._lock:
            self.database.ensure()
            epoch = self.feed.epoch()
            after = self.store.feed_position(epoch)
            while True:
                events = self.feed.history(FEED, after_seq=after, limit=_BATCH)
                if not events:
                    return after
                rows = [(e.seq, row) for e in events if (row := entry_of(e)) is not None]
                self.store.add_from_feed(epoch, rows)
                after = events[-1].seq
                if len(events) < _BATCH:
                    return after

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                after = self.catch_up()
                self.feed.read_blocking(FEED, after, _BLOCK)  # wakes up on the next entry
            except (DatabaseUnavailable, SQLAlchemyError, redis.RedisError) as exc:
                log.warning("audit: could not copy the approval feed (trying again): %s", exc)
                stop.wait(_RETRY)
            except Exception:  # noqa: BLE001 - a bug in one round must not end the copying
                log.exception("audit: copying the approval feed failed")
                stop.wait(_RETRY)
