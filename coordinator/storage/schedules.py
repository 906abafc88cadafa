"""Scheduled investigations: the ``schedules`` and ``schedule_runs`` tables.

A schedule row holds a :class:`~registry.schedules.ScheduleSpec` and where it came from
(``config``: the config file, written at API start and read-only through the API; ``api``).
A run row is written once per schedule and due time: the unique constraint on
``(schedule, due_at)`` is what makes firing idempotent, so a due time sent twice (a beat
restarted at the wrong moment, a message delivered again) starts at most one spawn.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import (
    JSON,
    Boolean,
    Engine,
    Float,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    delete,
    select,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

from coordinator.storage.columns import NAMING_CONVENTION, UtcDateTime, utcnow
from registry.budget import Budget
from registry.errors import NotFoundError, OngridError
from registry.schedules import ScheduleSpec

__all__ = [
    "SCHEDULES_METADATA",
    "RunStatus",
    "ScheduleExists",
    "ScheduleRun",
    "ScheduleStore",
    "StoredSchedule",
]

RunStatus = Literal["started", "skipped", "failed"]
Source = Literal["config", "api"]


class ScheduleExists(OngridError):
    """A schedule of that name exists already."""


class _Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UtcDateTime}


class _ScheduleRow(_Base):
    __tablename__ = "schedules"

    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    persona: Mapped[str] = mapped_column(String(255))
    prompt: Mapped[str] = mapped_column(Text)
    context: Mapped[dict[str, Any]] = mapped_column(JSON)
    cron: Mapped[str | None] = mapped_column(String(255), nullable=True)
    interval_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    owner: Mapped[str] = mapped_column(String(255))
    role: Mapped[str] = mapped_column(String(255))
    budget: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    channels: Mapped[list[str]] = mapped_column(JSON)
    enabled: Mapped[bool] = mapped_column(Boolean)
    source: Mapped[str] = mapped_column(String(16))
    created_by: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column()
    updated_at: Mapped[datetime] = mapped_column()


class _RunRow(_Base):
    __tablename__ = "schedule_runs"
    __table_args__ = (UniqueConstraint("schedule", "due_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    schedule: Mapped[str] = mapped_column(
        String(63), ForeignKey("schedules.name", ondelete="CASCADE"), index=True
    )
    due_at: Mapped[datetime] = mapped_column()
    spawn_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    status: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column()


#: The tables' metadata, for Alembic.
SCHEDULES_METADATA = _Base.metadata


@dataclass(frozen=True)
class StoredSchedule:
    spec: ScheduleSpec
    source: Source
    created_by: str
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class ScheduleRun:
    id: int
    schedule: str
    due_at: datetime
    spawn_id: str | None
    status: RunStatus
    reason: str
    created_at: datetime

    def as_dict(self) -> dict[str, Any]:
        return {
            "due_at": self.due_at.isoformat(),
            "spawn_id": self.spawn_id,
            "status": self.status,
            "reason": self.reason,
            "created_at": self.created_at.isoformat(),
        }


class ScheduleStore:
    """Reads and writes both tables; each method is one transaction."""

    def __init__(self, engine: Engine) -> None:
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    # -- schedules ------------------------------------------------------------------------------

    def list(self) -> list[StoredSchedule]:
        with self._sessions() as db:
            rows = db.scalars(select(_ScheduleRow).order_by(_ScheduleRow.name)).all()
            return [_stored(row) for row in rows]

    def get(self, name: str) -> StoredSchedule | None:
        with self._sessions() as db:
            row = db.get(_ScheduleRow, name)
            return _stored(row) if row is not None else None

    def create(self, spec: ScheduleSpec, by: str, source: Source = "api") -> StoredSchedule:
        """Add a schedule; :class:`ScheduleExists` if one of that name exists."""
        now = utcnow()
        row = _ScheduleRow(
            **_columns(spec), source=source, created_by=by, created_at=now, updated_at=now
        )
        try:
            with self._sessions.begin() as db:
                db.add(row)
        except IntegrityError:
            raise ScheduleExists(f"schedule {spec.name!r} exists already") from None
        return _stored(row)

    def update(
        self, name: str, change: Callable[[ScheduleSpec], ScheduleSpec]
    ) -> tuple[StoredSchedule, StoredSchedule]:
        """Apply ``change`` to the stored schedule under its row lock; returns (before, after).
        :class:`NotFoundError` when there is none."""
        with self._sessions.begin() as db:
            row = db.get(_ScheduleRow, name, with_for_update=True)
            if row is None:
                raise NotFoundError("schedule", name)
            before = _stored(row)
            spec = change(before.spec)
            for key, value in _columns(spec).items():
                setattr(row, key, value)
            row.updated_at = utcnow()
            db.flush()
            return before, _stored(row)

    def delete(self, name: str) -> bool:
        with self._sessions.begin() as db:
            db.execute(delete(_RunRow).where(_RunRow.schedule == name))
            done = db.execute(delete(_ScheduleRow).where(_ScheduleRow.name == name))
            return bool(getattr(done, "rowcount", 0))

    def sync_config(self, specs: builtins.list[ScheduleSpec]) -> builtins.list[str]:
        """Make the ``config`` rows the config file's schedules: written over (a schedule of
        the API of the same name becomes the config file's), and those no longer in the file
        removed. Returns the names removed."""
        now = utcnow()
        wanted = {spec.name: spec for spec in specs}
        with self._sessions.begin() as db:
            rows = {row.name: row for row in db.scalars(select(_ScheduleRow)).all()}
            gone = [n for n, r in rows.items() if r.source == "config" and n not in wanted]
            for name in gone:
                db.execute(delete(_RunRow).where(_RunRow.schedule == name))
                db.delete(rows[name])
            for name, spec in wanted.items():
                row = rows.get(name)
                if row is None:
                    row = _ScheduleRow(name=name, created_by="config", created_at=now)
                    db.add(row)
                for key, value in _columns(spec).items():
                    setattr(row, key, value)
                row.source, row.updated_at = "config", now
        return gone

    # -- runs -----------------------------------------------------------------------------------

    def claim(self, name: str, due_at: datetime, spawn_id: str) -> tuple[ScheduleRun, bool]:
        """The run of ``name`` due at ``due_at``: written now as ``started`` with ``spawn_id``
        (True), or the one written before for that due time (False)."""
        try:
            with self._sessions.begin() as db:
                row = _RunRow(
                    schedule=name,
                    due_at=due_at,
                    spawn_id=spawn_id,
                    status="started",
                    reason="",
                    created_at=utcnow(),
                )
                db.add(row)
            return _run(row), True
        except IntegrityError:
            with self._sessions() as db:
                found = db.scalars(
                    select(_RunRow).where(_RunRow.schedule == name, _RunRow.due_at == due_at)
                ).one()
                return _run(found), False

    def settle(self, run_id: int, status: RunStatus, reason: str = "") -> None:
        """Mark a claimed run ``skipped`` or ``failed`` (its spawn never started)."""
        with self._sessions.begin() as db:
            row = db.get(_RunRow, run_id)
            if row is not None:
                row.status, row.reason, row.spawn_id = status, reason, None

    def previous_started(self, name: str, run_id: int) -> ScheduleRun | None:
        """The latest run of ``name`` other than ``run_id`` that started a spawn."""
        with self._sessions() as db:
            row = db.scalars(
                select(_RunRow)
                .where(_RunRow.schedule == name, _RunRow.id != run_id, _RunRow.status == "started")
                .order_by(_RunRow.id.desc())
                .limit(1)
            ).first()
            return _run(row) if row is not None else None

    def runs(self, name: str, limit: int = 20) -> builtins.list[ScheduleRun]:
        """The most recent runs of ``name``, newest first."""
        with self._sessions() as db:
            rows = db.scalars(
                select(_RunRow)
                .where(_RunRow.schedule == name)
                .order_by(_RunRow.due_at.desc())
                .limit(limit)
            ).all()
            return [_run(row) for row in rows]


def _columns(spec: ScheduleSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "persona": spec.persona,
        "prompt": spec.prompt,
        "context": spec.context,
        "cron": spec.cron,
        "interval_seconds": spec.interval_seconds,
        "owner": spec.owner,
        "role": spec.role,
        "budget": spec.budget.model_dump(exclude_none=True) if spec.budget else None,
        "channels": list(spec.channels),
        "enabled": spec.enabled,
    }


def _stored(row: _ScheduleRow) -> StoredSchedule:
    spec = ScheduleSpec(
        name=row.name,
        persona=row.persona,
        prompt=row.prompt,
        context=row.context or {},
        cron=row.cron,
        interval_seconds=row.interval_seconds,
        owner=row.owner,
        role=row.role,
        budget=Budget(**row.budget) if row.budget else None,
        channels=row.channels or [],
        enabled=row.enabled,
    )
    source: Source = "config" if row.source == "config" else "api"
    return StoredSchedule(spec, source, row.created_by, row.created_at, row.updated_at)


def _run(row: _RunRow) -> ScheduleRun:
    status: RunStatus = row.status  # type: ignore[assignment]
    return ScheduleRun(
        row.id, row.schedule, row.due_at, row.spawn_id, status, row.reason or "", row.created_at
    )
