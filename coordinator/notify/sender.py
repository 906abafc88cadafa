"""The notification sender: feeds → outbox → deliveries, one per cluster.

Every API process runs a :class:`NotificationSender` while channels are configured; they elect
one (:class:`~workers.election.Election`, key ``{prefix}notify:sender``) and the others stand
by. Each round (every :data:`ROUND_SECONDS`, or at once when a delivery ends) the holder:

1. **takes in** what the approval feed and the spawn-end feed gained since its stored position:
   for each entry, the notices the routing rules make (:mod:`coordinator.notify.events`), one
   delivery per channel with its body rendered, added in the same transaction as the new
   position (:class:`~coordinator.storage.notifications.NotificationStore`). A sender that never
   ran starts at the feeds' ends (no flood of history); a feed whose Redis lost its data (a new
   epoch) is read from its start; entries trimmed before they were read are logged as missed.
2. **sends** the due deliveries on threads of their own (``concurrency`` at once,
   ``per_channel`` per channel: a channel that does not answer holds at most its share), each
   attempt bounded by the channel's timeout (:mod:`coordinator.notify.delivery`), and records
   what came of it:
   ``sent``, again later with backoff (``Retry-After`` honoured), or ``failed`` once
   ``max_attempts`` are spent or the receiver refused for good.

Nothing here runs on a request's path or a worker: a dead webhook costs the sender's threads
their timeout, nothing else. A sender that dies mid-attempt leaves the delivery pending; the
next holder sends it again with the same ``Idempotency-Key``.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import Counter as Tally
from datetime import UTC, datetime, timedelta

import httpx
import redis
from prometheus_client import Counter
from sqlalchemy.exc import SQLAlchemyError

from coordinator import version
from coordinator.notify.delivery import attempt, backoff
from coordinator.notify.events import Notice, notices, who_may_decide
from coordinator.notify.render import console_link, render
from coordinator.storage.engine import Database, DatabaseUnavailable
from coordinator.storage.notifications import Delivery, NewDelivery, NotificationStore
from registry.settings import Settings
from workers.approvals import ApprovalFeed
from workers.election import Election
from workers.feeds import FEED, GlobalFeed
from workers.messages import ApprovalDecided, Event
from workers.spawn_ends import SpawnEndFeed
from workers.spawns import SpawnStore

__all__ = ["NOTIFICATIONS", "ROUND_SECONDS", "NotificationSender"]

log = logging.getLogger(__name__)

#: Longest pause between two rounds (seconds): how late a new event may be taken in.
ROUND_SECONDS = 0.5
#: Feed entries taken in per round and feed.
_BATCH = 500
#: The election key outlives its holder's last renewal by this many rounds.
_ELECTION_ROUNDS = 10
#: Seconds between two tries while the database or Redis does not answer.
_RETRY = 2.0
#: Seconds :meth:`NotificationSender.stop` lets attempts in flight end.
STOP_GRACE = 2.0

NOTIFICATIONS = Counter(
    "ongrid_notifications",
    "Notification delivery attempts by channel and outcome (sent, retried, failed).",
    ["channel", "outcome"],
)


class NotificationSender:
    """The sender thread of one API process (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        store: NotificationStore,
        database: Database,
        client: redis.Redis,
        *,
        member: str = "",
    ) -> None:
        self.settings, self.config = settings, settings.notifications
        self.store, self.database = store, database
        prefix = settings.key_prefix
        self.feeds: dict[str, GlobalFeed] = {
            "approvals": ApprovalFeed(client, prefix),
            "ends": SpawnEndFeed(client, prefix),
        }
        self.spawns = SpawnStore(client, prefix)
        member = member or f"{socket.gethostname()} pid {os.getpid()}"
        ttl_ms = int(ROUND_SECONDS * 1000 * _ELECTION_ROUNDS)
        self.election = Election(client, f"{prefix}notify:sender", member, ttl_ms, "notifier")
        self._lock = threading.Lock()
        self._in_flight: dict[str, str] = {}  # delivery id → channel
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sending: set[threading.Thread] = set()
        self._http: httpx.Client | None = None

    @property
    def enabled(self) -> bool:
        """Whether any channel is configured (else the sender does not run at all)."""
        return bool(self.config.channels)

    def start(self) -> None:
        """Start the thread (again, after :meth:`stop`); nothing when no channel is set."""
        if not self.enabled or (self._thread is not None and self._thread.is_alive()):
            return
        self._stop = threading.Event()
        self._prime()
        self._http = httpx.Client(
            follow_redirects=False, headers={"User-Agent": f"ongrid/{version()}"}
        )
        self._thread = threading.Thread(
            target=self._run, args=(self._stop,), name="notification-sender", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop taking in and sending. Attempts in flight get :data:`STOP_GRACE` seconds to
        end; one still waiting on its receiver then is left to the process's exit, unrecorded,
        and sent again (same ``Idempotency-Key``) by the next sender."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join()
        deadline = time.monotonic() + STOP_GRACE
        with self._lock:
            sending = list(self._sending)
        for thread in sending:
            thread.join(max(0.0, deadline - time.monotonic()))
        if self._http is not None and not any(t.is_alive() for t in sending):
            self._http.close()
        self.election.resign()

    def _prime(self) -> None:
        """Before the process serves: a sender that never ran takes its place at the feeds'
        ends now, so what happens once the API is up is notified, not skipped as history."""
        try:
            if not self.election.hold():
                return
            self.database.ensure()
            for name, feed in self.feeds.items():
                if not self.store.position(name)[0]:
                    self.store.take_in(name, feed.epoch(), feed.last_seq(FEED), [])
        except (DatabaseUnavailable, SQLAlchemyError, redis.RedisError) as exc:
            log.warning("notifications: could not take the sender's place yet: %s", exc)

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.round()
            except (DatabaseUnavailable, SQLAlchemyError, redis.RedisError) as exc:
                log.warning("notifications: %s (trying again)", exc)
                stop.wait(_RETRY)
            except Exception:  # noqa: BLE001 - a bug in one round must not end the sending
                log.exception("notifications: the round failed")
                stop.wait(_RETRY)
            self._wake.wait(ROUND_SECONDS)
            self._wake.clear()

    def round(self) -> None:
        """One round: hold the duty, take in what the feeds gained, send what is due."""
        if not self.election.hold():
            return
        self.database.ensure()
        for name, feed in self.feeds.items():
            self.take_in(name, feed)
        self.send_due()

    # -- taking in -----------------------------------------------------------------------------

    def take_in(self, name: str, feed: GlobalFeed) -> int:
        """Add the deliveries of ``feed``'s new entries; returns how many were added."""
        epoch = feed.epoch()
        stored_epoch, after = self.store.position(name)
        if not stored_epoch:
            # Never ran: start at the feed's end rather than notify its history.
            self.store.take_in(name, epoch, feed.last_seq(FEED), [])
            return 0
        if stored_epoch != epoch:
            log.warning("notifications: the %s feed was reset (Redis lost it); reading anew", name)
            after = 0
        added = 0
        while True:
            events = feed.history(FEED, after_seq=after, limit=_BATCH)
            if not events:
                if stored_epoch != epoch:
                    self.store.take_in(name, epoch, after, [])
                return added
            if after and events[0].seq > after + 1:
                missed = events[0].seq - after - 1
                log.warning(
                    "notifications: %d entries of the %s feed were trimmed before they were "
                    "read (the sender was down too long); they are not notified",
                    missed,
                    name,
                )
            deliveries = [d for event in events for d in self._deliveries(name, epoch, event)]
            added += self.store.take_in(name, epoch, events[-1].seq, deliveries)
            after = events[-1].seq
            stored_epoch = epoch
            if len(events) < _BATCH:
                return added

    def _deliveries(self, feed: str, epoch: str, event: Event) -> list[NewDelivery]:
        persona = ""
        if isinstance(event, ApprovalDecided):
            record = self.spawns.get(event.spawn_id)
            persona = record.persona if record is not None else ""
        out = []
        for notice in notices(event, self.config, persona):
            # Once per notice, whatever the number of its channels.
            link = console_link(self.config.console_url, notice)
            deciders = who_may_decide(self.settings, notice.owner)
            for channel in notice.channels:
                out.append(self._delivery(feed, epoch, notice, channel, link, deciders))
        return out

    def _delivery(
        self, feed: str, epoch: str, notice: Notice, channel: str, link: str, deciders: list[str]
    ) -> NewDelivery:
        delivery_id = os.urandom(16).hex()
        kind = self.config.channels[channel].type
        event = notice.event
        return NewDelivery(
            id=delivery_id,
            source=f"{feed}:{epoch}:{event.seq}:{notice.kind}:{channel}",
            channel=channel,
            kind=notice.kind,
            spawn_id=event.spawn_id,
            session_id=event.session_id,
            owner=notice.owner,
            persona=notice.persona,
            body=render(kind, delivery_id, notice, link, deciders),
        )

    # -- sending -------------------------------------------------------------------------------

    def send_due(self) -> int:
        """Start the due deliveries the bounds allow; returns how many were started."""
        with self._lock:
            busy = dict(self._in_flight)
        room = self.config.concurrency - len(busy)
        if room <= 0:
            return 0
        per_channel = Tally(busy.values())
        started = 0
        for delivery in self.store.due(room * 4, skip=list(busy)):
            if started >= room:
                break
            if per_channel[delivery.channel] >= self.config.per_channel:
                continue
            channel = self.config.channels.get(delivery.channel)
            if channel is None:
                self.store.failed(
                    delivery.id, delivery.attempts, None, "the channel is no longer configured"
                )
                NOTIFICATIONS.labels(delivery.channel, "failed").inc()
                continue
            per_channel[delivery.channel] += 1
            with self._lock:
                self._in_flight[delivery.id] = delivery.channel
            # Daemon threads of its own, not a pool's: a receiver that never answers must not
            # hold the process's exit (a pool's threads are joined at exit).
            thread = threading.Thread(
                target=self._send, args=(delivery,), name="notify-send", daemon=True
            )
            with self._lock:
                self._sending.add(thread)
            thread.start()
            started += 1
        return started

    def _send(self, delivery: Delivery) -> None:
        try:
            self._attempt(delivery)
        except (SQLAlchemyError, DatabaseUnavailable) as exc:
            # The attempt's outcome could not be recorded: the delivery stays pending and is
            # sent again (same Idempotency-Key), which the receiver can recognise.
            log.warning("notifications: could not record delivery %s: %s", delivery.id, exc)
        except Exception:  # noqa: BLE001 - a thread of the pool must not die silently
            log.exception("notifications: delivery %s failed", delivery.id)
        finally:
            with self._lock:
                self._in_flight.pop(delivery.id, None)
                self._sending.discard(threading.current_thread())
            self._wake.set()

    def _attempt(self, delivery: Delivery) -> None:
        assert self._http is not None
        channel = self.config.channels[delivery.channel]
        answer = attempt(self._http, channel, delivery.id, delivery.kind, delivery.body)
        attempts = delivery.attempts + 1
        if answer.done:
            self.store.sent(delivery.id, attempts, answer.status or 0)
            NOTIFICATIONS.labels(delivery.channel, "sent").inc()
            return
        if answer.retry and attempts < self.config.max_attempts:
            wait = backoff(
                attempts,
                self.config.retry_base_seconds,
                self.config.retry_max_seconds,
                answer.retry_after,
            )
            at = datetime.now(UTC) + timedelta(seconds=wait)
            self.store.retry(delivery.id, attempts, at, answer.status, answer.error)
            NOTIFICATIONS.labels(delivery.channel, "retried").inc()
            log.info(
                "notifications: %s to %s: %s; again in %.1f s",
                delivery.kind,
                delivery.channel,
                answer.error,
                wait,
            )
            return
        why = answer.error
        if answer.retry:
            why = f"{why} (gave up after {attempts} attempts)"
        self.store.failed(delivery.id, attempts, answer.status, why)
        NOTIFICATIONS.labels(delivery.channel, "failed").inc()
        log.warning("notifications: %s to %s failed: %s", delivery.kind, delivery.channel, why)
