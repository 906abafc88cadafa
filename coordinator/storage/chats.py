"""Chat sessions and their messages: the ``chat_sessions`` and ``chat_messages`` tables.

Sessions are per user: :class:`ChatStore` never shows one user another's session.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, Literal, cast, get_args

from sqlalchemy import (
    CheckConstraint,
    Engine,
    ForeignKey,
    Index,
    MetaData,
    String,
    Table,
    Text,
    delete,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.engine import CursorResult
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

from coordinator.storage.columns import NAMING_CONVENTION, UtcDateTime, utcnow
from registry.errors import NotFoundError, UserError

__all__ = ["CHAT_METADATA", "ROLES", "ChatMessage", "ChatSession", "ChatStore", "Role"]

Role = Literal["user", "assistant", "system"]
ROLES: tuple[str, ...] = get_args(Role)
_SESSION_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class _Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UtcDateTime}


class _SessionRow(_Base):
    __tablename__ = "chat_sessions"
    __table_args__ = (Index("ix_chat_sessions_owner_updated_at", "owner", "updated_at"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    # Not "user": that is a reserved word in PostgreSQL (a bare `user` there is current_user).
    owner: Mapped[str] = mapped_column(String(255))
    title: Mapped[str] = mapped_column(Text, server_default="")
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(server_default=func.now())


class _MessageRow(_Base):
    __tablename__ = "chat_messages"
    __table_args__ = (
        CheckConstraint("role IN ('user', 'assistant', 'system')", name="role"),
        # Never reuse the id of a deleted message: ids are the order and may be referenced.
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    session_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("chat_sessions.id", ondelete="CASCADE"), index=True
    )
    role: Mapped[str] = mapped_column(String(16))
    content: Mapped[str] = mapped_column(Text)
    agent: Mapped[str | None] = mapped_column(String(255))
    spawn_id: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())


#: The chat tables' metadata, for Alembic.
CHAT_METADATA = _Base.metadata


@dataclass(frozen=True)
class ChatSession:
    """A conversation, owned by one user."""

    id: str
    user: str
    title: str
    created_at: datetime
    updated_at: datetime

    def as_dict(self) -> dict[str, Any]:
        return _jsonable(asdict(self))


@dataclass(frozen=True)
class ChatMessage:
    """One message of a session. ``agent``/``spawn_id`` link an answer to the spawn behind it."""

    id: int
    session_id: str
    role: str
    content: str
    agent: str | None
    spawn_id: str | None
    created_at: datetime

    def as_dict(self) -> dict[str, Any]:
        return _jsonable(asdict(self))


def _jsonable(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in data.items()}


def _session(row: _SessionRow) -> ChatSession:
    return ChatSession(row.id, row.owner, row.title, row.created_at, row.updated_at)


def _message(row: _MessageRow) -> ChatMessage:
    return ChatMessage(
        row.id, row.session_id, row.role, row.content, row.agent, row.spawn_id, row.created_at
    )


def _checked_id(session_id: str) -> str:
    """``session_id``, or :class:`UserError` when it is not one a session may have."""
    if not _SESSION_ID.match(session_id):
        raise UserError(
            f"chat session id {session_id[:80]!r}: use 1-64 letters, digits, '_' or '-'"
        )
    return session_id


_SESSIONS = cast(Table, _SessionRow.__table__)
_MESSAGES = cast(Table, _MessageRow.__table__)


class ChatStore:
    """Chat sessions and their messages. Sessions are per user: another user's is invisible."""

    def __init__(self, engine: Engine) -> None:
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        #: For the statements of every chat turn: Core, without the ORM session's bookkeeping.
        self._engine = engine

    def create_session(self, user: str, title: str = "", *, session_id: str | None = None) -> str:
        """Start a session and return its id (a fresh one unless ``session_id`` is given)."""
        sid = _checked_id(session_id or uuid.uuid4().hex)
        now = utcnow()
        row = _SessionRow(id=sid, owner=user, title=title, created_at=now, updated_at=now)
        try:
            with self._sessions.begin() as db:
                db.add(row)
        except IntegrityError:
            raise UserError(f"chat session {sid!r} already exists") from None
        return sid

    def start_session(
        self,
        session_id: str,
        user: str,
        title: str,
        first: str,
        *,
        agent: str | None = None,
        spawn_id: str | None = None,
    ) -> None:
        """Create the session and its first (user) message in one transaction: one commit per new
        chat, and no empty session left behind when the turn is refused before it."""
        _checked_id(session_id)
        now = utcnow()
        session = {"id": session_id, "owner": user, "title": title}
        message = {"session_id": session_id, "role": "user", "content": first}
        try:
            with self._engine.begin() as db:
                db.execute(insert(_SESSIONS), {**session, "created_at": now, "updated_at": now})
                db.execute(
                    insert(_MESSAGES),
                    {**message, "agent": agent, "spawn_id": spawn_id, "created_at": now},
                )
        except IntegrityError:
            raise UserError(f"chat session {session_id!r} already exists") from None

    def get_session(self, session_id: str, user: str) -> ChatSession | None:
        """The session if it exists and belongs to ``user``; None otherwise (answer 404)."""
        with self._sessions() as db:
            row = db.get(_SessionRow, session_id)
        return _session(row) if row is not None and row.owner == user else None

    def list_sessions(self, user: str, *, limit: int = 100) -> list[ChatSession]:
        """``user``'s sessions, most recently active first."""
        query = (
            select(_SessionRow)
            .where(_SessionRow.owner == user)
            .order_by(_SessionRow.updated_at.desc(), _SessionRow.id)
            .limit(limit)
        )
        with self._sessions() as db:
            return [_session(row) for row in db.scalars(query)]

    def count_sessions(self, user: str) -> int:
        """How many sessions ``user`` keeps."""
        query = select(func.count()).select_from(_SESSIONS).where(_SESSIONS.c.owner == user)
        with self._engine.connect() as db:
            return int(db.scalar(query) or 0)

    def delete_session(self, session_id: str, user: str) -> bool:
        """Delete ``user``'s session and (by cascade) its messages; False if there was none."""
        query = delete(_SessionRow).where(_SessionRow.id == session_id, _SessionRow.owner == user)
        with self._sessions.begin() as db:
            return cast(CursorResult[Any], db.execute(query)).rowcount > 0

    def add_message(
        self,
        session_id: str,
        role: str,
        content: str,
        agent: str | None = None,
        spawn_id: str | None = None,
    ) -> ChatMessage:
        """Append a message and mark the session active. The caller has checked ownership."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
        now = utcnow()
        touch = update(_SessionRow).where(_SessionRow.id == session_id).values(updated_at=now)
        row = _MessageRow(
            session_id=session_id,
            role=role,
            content=content,
            agent=agent,
            spawn_id=spawn_id,
            created_at=now,
        )
        with self._sessions.begin() as db:
            if cast(CursorResult[Any], db.execute(touch)).rowcount == 0:
                raise NotFoundError("chat session", session_id)
            db.add(row)
        return _message(row)

    def messages(self, session_id: str) -> list[ChatMessage]:
        """The session's messages in the order they were added."""
        query = select(_MessageRow).where(_MessageRow.session_id == session_id)
        with self._sessions() as db:
            return [_message(row) for row in db.scalars(query.order_by(_MessageRow.id))]
