"""The notification outbox: one row per delivery of one event to one channel.

The notification sender (:mod:`coordinator.notify.sender`) reads the approval feed and the
spawn-end feed from where it left off (``notification_feeds``: per feed, its epoch and the last
seq taken in) and, in the same transaction as that position, adds a ``pending`` delivery per
channel the routing rules name, its body rendered once: every attempt sends the same bytes.
A delivery's ``source`` (feed, epoch, seq, channel) is unique, so taking an entry in twice (a
sender that crashed before its position was written, a second sender during a failover) adds
nothing. Its ``id`` is the idempotency key every attempt carries.

A delivery then moves to ``sent`` (2xx), back to ``pending`` with a later ``next_attempt_at``
(429, 5xx, a timeout, a refused connection) or to ``failed`` (any other answer, or the last
attempt), with the receiver's last status and error kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from sqlalchemy import (
    CheckConstraint,
    Engine,
    Index,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    func,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

from coordinator.storage.columns import NAMING_CONVENTION, UtcDateTime

__all__ = [
    "NOTIFICATIONS_METADATA",
    "Delivery",
    "DeliveryStatus",
    "NewDelivery",
    "NotificationStore",
]

DeliveryStatus = Literal["pending", "sent", "failed"]
_INSERTS: dict[str, Any] = {"postgresql": postgresql.insert, "sqlite": sqlite.insert}


class _Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UtcDateTime}


class _DeliveryRow(_Base):
    __tablename__ = "notification_deliveries"
    __table_args__ = (
        CheckConstraint("status IN ('pending', 'sent', 'failed')", name="status"),
        UniqueConstraint("source"),
        Index("ix_notification_deliveries_status_next_attempt_at", "status", "next_attempt_at"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    source: Mapped[str] = mapped_column(String(255))
    channel: Mapped[str] = mapped_column(String(255))
    kind: Mapped[str] = mapped_column(String(32))
    spawn_id: Mapped[str] = mapped_column(String(255))
    session_id: Mapped[str] = mapped_column(String(255))
    # Names and users come from personas and callers: no length is assumed.
    owner: Mapped[str] = mapped_column(Text)
    persona: Mapped[str] = mapped_column(Text)
    body: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column()
    next_attempt_at: Mapped[datetime] = mapped_column()
    last_status: Mapped[int | None] = mapped_column()
    last_error: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(index=True)
    sent_at: Mapped[datetime | None] = mapped_column()


class _FeedRow(_Base):
    __tablename__ = "notification_feeds"

    feed: Mapped[str] = mapped_column(String(32), primary_key=True)
    epoch: Mapped[str] = mapped_column(String(64))
    seq: Mapped[int] = mapped_column()


#: The outbox's metadata, for Alembic.
NOTIFICATIONS_METADATA = _Base.metadata


@dataclass(frozen=True)
class NewDelivery:
    """A delivery to add: ``id`` is its idempotency key; ``source`` names the feed entry, the
    notice and the channel (unique)."""

    id: str
    source: str
    channel: str
    kind: str
    spawn_id: str
    session_id: str
    owner: str
    persona: str
    body: str


@dataclass(frozen=True)
class Delivery:
    """One delivery as stored."""

    id: str
    channel: str
    kind: str
    spawn_id: str
    session_id: str
    owner: str
    persona: str
    status: DeliveryStatus
    attempts: int
    next_attempt_at: datetime
    created_at: datetime
    last_status: int | None = None
    last_error: str = ""
    sent_at: datetime | None = None
    body: str = field(default="", repr=False)

    def as_dict(self) -> dict[str, Any]:
        """The API's view: no body (it may hold arguments and answers; the spawn has them)."""
        out = asdict(self)
        out.pop("body")
        for key in ("next_attempt_at", "created_at", "sent_at"):
            out[key] = out[key].isoformat() if out[key] is not None else None
        return out


def _delivery(row: _DeliveryRow) -> Delivery:
    return Delivery(
        id=row.id,
        channel=row.channel,
        kind=row.kind,
        spawn_id=row.spawn_id,
        session_id=row.session_id,
        owner=row.owner,
        persona=row.persona,
        status=row.status,  # type: ignore[arg-type]
        attempts=row.attempts,
        next_attempt_at=row.next_attempt_at,
        created_at=row.created_at,
        last_status=row.last_status,
        last_error=row.last_error,
        sent_at=row.sent_at,
        body=row.body,
    )


def _now() -> datetime:
    return datetime.now(UTC)


class NotificationStore:
    """The outbox and the sender's positions in the feeds."""

    def __init__(self, engine: Engine) -> None:
        self._insert = _INSERTS[engine.dialect.name]
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    def position(self, feed: str) -> tuple[str, int]:
        """The epoch and the last seq of ``feed`` taken in; ``("", 0)`` before the first."""
        with self._sessions() as db:
            row = db.get(_FeedRow, feed)
            return (row.epoch, row.seq) if row is not None else ("", 0)

    def take_in(self, feed: str, epoch: str, seq: int, deliveries: Sequence[NewDelivery]) -> int:
        """Add ``deliveries`` (those added before are left as they are) and move ``feed``'s
        position to ``seq`` of ``epoch``, in one transaction. Returns how many were added."""
        now = _now()
        rows = [
            {
                **asdict(d),
                "status": "pending",
                "attempts": 0,
                "next_attempt_at": now,
                "last_error": "",
                "created_at": now,
            }
            for d in deliveries
        ]
        position = (
            self._insert(_FeedRow)
            .values(feed=feed, epoch=epoch, seq=seq)
            .on_conflict_do_update(index_elements=["feed"], set_={"epoch": epoch, "seq": seq})
        )
        added = 0
        with self._sessions.begin() as db:
            if rows:
                stmt = (
                    self._insert(_DeliveryRow)
                    .values(rows)
                    .on_conflict_do_nothing(index_elements=["source"])
                )
                result: Any = db.execute(stmt)
                added = result.rowcount or 0
            db.execute(position)
        return added

    def due(self, limit: int, *, skip: Sequence[str] = ()) -> list[Delivery]:
        """Pending deliveries whose next attempt is due, oldest first (not those in ``skip``,
        already in flight)."""
        query = select(_DeliveryRow).where(
            _DeliveryRow.status == "pending", _DeliveryRow.next_attempt_at <= _now()
        )
        if skip:
            query = query.where(_DeliveryRow.id.not_in(list(skip)))
        query = query.order_by(_DeliveryRow.next_attempt_at, _DeliveryRow.created_at).limit(limit)
        with self._sessions() as db:
            return [_delivery(row) for row in db.scalars(query)]

    def next_due(self) -> datetime | None:
        """When the earliest pending delivery is due; ``None`` when none is pending."""
        query = select(func.min(_DeliveryRow.next_attempt_at)).where(
            _DeliveryRow.status == "pending"
        )
        with self._sessions() as db:
            return db.scalar(query)

    def sent(self, delivery_id: str, attempts: int, status: int) -> None:
        self._set(
            delivery_id,
            status="sent",
            attempts=attempts,
            last_status=status,
            last_error="",
            sent_at=_now(),
        )

    def retry(
        self, delivery_id: str, attempts: int, at: datetime, status: int | None, error: str
    ) -> None:
        self._set(
            delivery_id, attempts=attempts, next_attempt_at=at, last_status=status, last_error=error
        )

    def failed(self, delivery_id: str, attempts: int, status: int | None, error: str) -> None:
        self._set(
            delivery_id, status="failed", attempts=attempts, last_status=status, last_error=error
        )

    def _set(self, delivery_id: str, **values: Any) -> None:
        with self._sessions.begin() as db:
            db.execute(update(_DeliveryRow).where(_DeliveryRow.id == delivery_id).values(**values))

    def get(self, delivery_id: str) -> Delivery | None:
        with self._sessions() as db:
            row = db.get(_DeliveryRow, delivery_id)
            return _delivery(row) if row is not None else None

    def list(
        self,
        *,
        status: DeliveryStatus | None = None,
        channel: str | None = None,
        spawn_id: str | None = None,
        limit: int = 100,
    ) -> list[Delivery]:
        """The newest ``limit`` deliveries (with that status, channel, spawn), newest first."""
        query = select(_DeliveryRow)
        if status is not None:
            query = query.where(_DeliveryRow.status == status)
        if channel is not None:
            query = query.where(_DeliveryRow.channel == channel)
        if spawn_id is not None:
            query = query.where(_DeliveryRow.spawn_id == spawn_id)
        query = query.order_by(_DeliveryRow.created_at.desc(), _DeliveryRow.id).limit(limit)
        with self._sessions() as db:
            return [_delivery(row) for row in db.scalars(query)]
