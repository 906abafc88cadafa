"""What the endpoints are handed: the app's services, the caller, and the database checks.

:class:`Services` is built once by :func:`coordinator.api.app.create_app` and hangs on
``app.state``; FastAPI dependencies below give endpoints the pieces they need. The database may
be down when the API starts: the app still starts, ``/readyz`` says why it is not ready, the
registry keeps serving builtin and disk personas (and the last user personas it read), and the
schema is migrated on first contact.
"""

from __future__ import annotations

import builtins
import threading
from dataclasses import dataclass
from typing import Annotated

import redis
from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from coordinator.auth import Principal, authenticate, require
from coordinator.db import ChatSession, ChatStore, DatabaseUnavailable, check, upgrade
from registry.agent_registry import AgentRegistry, Snapshot
from registry.errors import NotFoundError
from registry.persona import Persona
from registry.settings import Settings
from registry.sql_store import SqlUserStore, StoredPersona
from registry.tools import ToolCatalog
from workers.celery_app import DEFAULT_REDIS_URL
from workers.client import SpawnClient
from workers.reload import RegistryFollower

__all__ = [
    "Caller",
    "Database",
    "Editor",
    "GuardedUserStore",
    "Services",
    "Svc",
    "caller",
    "owned_session",
    "services",
    "snapshot",
]


class Database:
    """The engine plus "is the schema there": migrated once, on first contact."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._migrated = False
        self._lock = threading.Lock()

    def ensure(self) -> None:
        """Reachable and migrated, or :class:`DatabaseUnavailable` naming the URL and why."""
        if self._migrated:
            return
        with self._lock:
            if self._migrated:
                return
            check(self.engine)
            try:
                upgrade(self.engine)
            except SQLAlchemyError as exc:
                reason = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or ["?"])[0]
                raise DatabaseUnavailable(f"database migration failed: {reason}") from exc
            self._migrated = True

    def ready(self) -> None:
        """For ``/readyz``: a live ``SELECT 1`` every time, then the migration if still due."""
        check(self.engine)
        self.ensure()


class GuardedUserStore:
    """A :class:`SqlUserStore` that outlives a database outage.

    While the database cannot be read, :meth:`list` returns the personas it read last and
    :meth:`problems` says so (it shows in ``GET /api/v1/agents/warnings``); writes fail with
    :class:`DatabaseUnavailable` (HTTP 503).
    """

    def __init__(self, store: SqlUserStore, database: Database) -> None:
        self._store, self._db = store, database
        self._last: builtins.list[Persona] = []
        self._outage: str | None = None

    def list(self) -> builtins.list[Persona]:
        try:
            self._db.ensure()
            personas = self._store.list()
        except (DatabaseUnavailable, SQLAlchemyError) as exc:
            self._outage = f"user personas could not be read ({exc}); showing the last ones read"
            return list(self._last)
        self._last, self._outage = personas, None
        return personas

    def problems(self) -> builtins.list[tuple[str, str]]:
        outage = [("*", self._outage)] if self._outage else []
        return self._store.problems() + outage

    def get(self, name: str) -> StoredPersona | None:
        self._db.ensure()
        return self._store.get(name)

    def upsert(self, persona: Persona, user: str = "") -> None:
        self._db.ensure()
        self._store.upsert(persona, user)

    def delete(self, name: str) -> bool:
        self._db.ensure()
        return self._store.delete(name)


@dataclass
class Services:
    """Everything the endpoints share; one per app."""

    settings: Settings
    database: Database
    users: GuardedUserStore
    registry: AgentRegistry
    follower: RegistryFollower
    chats: ChatStore
    client: SpawnClient
    catalog: ToolCatalog
    #: A Redis client with short timeouts, for the readiness probe.
    probe: redis.Redis

    @property
    def redis_url(self) -> str:
        return self.settings.redis_url or DEFAULT_REDIS_URL

    def snapshot(self) -> Snapshot:
        """The registry at the cluster's version (reloads first if a broadcast was missed)."""
        self.follower.catch_up()
        return self.registry.snapshot()

    def close(self) -> None:
        self.client.redis.close()
        self.probe.close()
        self.database.engine.dispose()


def services(request: Request) -> Services:
    return request.app.state.services  # type: ignore[no-any-return]


Svc = Annotated[Services, Depends(services)]

#: Documents the scheme in OpenAPI; the header itself is checked by :func:`authenticate`.
_bearer = HTTPBearer(
    auto_error=False, description="`Authorization: Bearer <token>`; tokens come from ONGRID_CONFIG."
)


def caller(
    request: Request,
    svc: Svc,
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)],
) -> Principal:
    """The authenticated user (401 otherwise)."""
    return authenticate(svc.settings, request.headers.get("authorization"))


Caller = Annotated[Principal, Depends(caller)]


def editor(principal: Caller) -> Principal:
    """A caller whose role may edit personas (403 otherwise)."""
    require(principal, "edit_personas")
    return principal


def approver(principal: Caller) -> Principal:
    """A caller whose role may approve tool calls (403 otherwise)."""
    require(principal, "approve")
    return principal


Editor = Annotated[Principal, Depends(editor)]
Approver = Annotated[Principal, Depends(approver)]


def snapshot(svc: Svc) -> Snapshot:
    return svc.snapshot()


def chats(svc: Svc) -> ChatStore:
    """The chat store, once the database is reachable and migrated (503 otherwise)."""
    svc.database.ensure()
    return svc.chats


Chats = Annotated[ChatStore, Depends(chats)]


def owned_session(session_id: str, principal: Caller, store: Chats) -> ChatSession:
    """The caller's session; another user's session is as unknown as a missing one (404)."""
    found = store.get_session(session_id, principal.user)
    if found is None:
        raise NotFoundError("chat session", session_id)
    return found


OwnedSession = Annotated[ChatSession, Depends(owned_session)]
