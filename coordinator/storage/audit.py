"""The audit trail of approvals: the ``approval_audit`` table.

One row per event a security review asks about: a tool call put to people (``requested``), a
decision (``approved``, ``denied``), a request that expired undecided (``expired``) and every
decision that was refused (``refused``, with the reason): who, what, when, the arguments' hash,
and the outcome. Rows are only ever added.

Two writers: the API adds the rows of the decisions it takes or refuses (:meth:`AuditStore.add`),
and the audit follower copies requests and expiries from the approval feed
(:meth:`AuditStore.add_from_feed`). A feed row carries the feed's epoch and seq under a unique
constraint, so copying an entry twice (a second API process, a restart) adds nothing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, Literal, get_args

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
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

from coordinator.storage.columns import NAMING_CONVENTION, UtcDateTime

__all__ = ["ACTIONS", "AUDIT_METADATA", "Action", "AuditEntry", "AuditStore"]

Action = Literal["requested", "approved", "denied", "expired", "refused"]
ACTIONS: tuple[str, ...] = get_args(Action)
_INSERTS: dict[str, Any] = {"postgresql": postgresql.insert, "sqlite": sqlite.insert}


class _Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UtcDateTime}


class _AuditRow(_Base):
    __tablename__ = "approval_audit"
    __table_args__ = (
        CheckConstraint(
            "action IN ('requested', 'approved', 'denied', 'expired', 'refused')", name="action"
        ),
        UniqueConstraint("feed_epoch", "feed_seq"),
        Index("ix_approval_audit_spawn_id_at", "spawn_id", "at"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(index=True)
    spawn_id: Mapped[str] = mapped_column(String(255))
    session_id: Mapped[str] = mapped_column(String(255))
    # Call ids, hashes and names come from models and callers: no length is assumed.
    call_id: Mapped[str] = mapped_column(Text)
    tool: Mapped[str] = mapped_column(Text)
    args_hash: Mapped[str] = mapped_column(Text)
    actor: Mapped[str] = mapped_column(Text)
    role: Mapped[str] = mapped_column(Text)
    action: Mapped[str] = mapped_column(String(16))
    outcome: Mapped[str] = mapped_column(Text)
    #: The approval feed's epoch and seq of the entry the row was copied from; NULL for the
    #: rows the API writes itself.
    feed_epoch: Mapped[str | None] = mapped_column(String(64))
    feed_seq: Mapped[int | None] = mapped_column()


#: The audit table's metadata, for Alembic.
AUDIT_METADATA = _Base.metadata


@dataclass(frozen=True)
class AuditEntry:
    """One audit row. ``actor``: who acted (the requester for ``requested``; empty for an
    expiry, which nobody did); ``role``: that person's role."""

    at: datetime
    spawn_id: str
    session_id: str
    call_id: str
    tool: str
    args_hash: str
    actor: str
    role: str
    action: Action
    outcome: str
    id: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "at": self.at.isoformat()}


def _entry(row: _AuditRow) -> AuditEntry:
    return AuditEntry(
        at=row.at,
        spawn_id=row.spawn_id,
        session_id=row.session_id,
        call_id=row.call_id,
        tool=row.tool,
        args_hash=row.args_hash,
        actor=row.actor,
        role=row.role,
        action=row.action,  # type: ignore[arg-type]
        outcome=row.outcome,
        id=row.id,
    )


def _values(entry: AuditEntry) -> dict[str, Any]:
    if entry.action not in ACTIONS:
        raise ValueError(f"action must be one of {', '.join(ACTIONS)}, got {entry.action!r}")
    values = asdict(entry)
    values.pop("id")
    return values


class AuditStore:
    """Adds audit rows and reads them back."""

    def __init__(self, engine: Engine) -> None:
        self._insert = _INSERTS[engine.dialect.name]
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    def add(self, entry: AuditEntry) -> AuditEntry:
        """Add one row (``entry.id`` is ignored); returns it with its id."""
        row = _AuditRow(**_values(entry))
        with self._sessions.begin() as db:
            db.add(row)
        return _entry(row)

    def add_from_feed(self, epoch: str, entries: list[tuple[int, AuditEntry]]) -> None:
        """Add the rows copied from approval feed entries (seq, entry) of feed ``epoch``; an
        entry copied before is left as it is."""
        if not entries:
            return
        rows = [{**_values(entry), "feed_epoch": epoch, "feed_seq": seq} for seq, entry in entries]
        stmt = (
            self._insert(_AuditRow)
            .values(rows)
            .on_conflict_do_nothing(index_elements=["feed_epoch", "feed_seq"])
        )
        with self._sessions.begin() as db:
            db.execute(stmt)

    def feed_position(self, epoch: str) -> int:
        """The last seq of feed ``epoch`` copied so far; 0 before the first."""
        query = select(func.max(_AuditRow.feed_seq)).where(_AuditRow.feed_epoch == epoch)
        with self._sessions() as db:
            return int(db.scalar(query) or 0)

    def list(self, *, spawn_id: str | None = None, limit: int = 100) -> list[AuditEntry]:
        """The newest ``limit`` rows (of ``spawn_id``'s calls, if given), newest first."""
        query = select(_AuditRow)
        if spawn_id is not None:
            query = query.where(_AuditRow.spawn_id == spawn_id)
        query = query.order_by(_AuditRow.at.desc(), _AuditRow.id.desc()).limit(limit)
        with self._sessions() as db:
            return [_entry(row) for row in db.scalars(query)]
