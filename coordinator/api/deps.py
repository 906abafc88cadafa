"""What the endpoints are handed: the app's services and the caller.

:class:`Services` is built once by :func:`coordinator.api.app.create_app` and hangs on
``app.state``; FastAPI dependencies below give endpoints the pieces they need. The database may
be down when the API starts: the app still starts, ``/readyz`` says why it is not ready, the
registry keeps serving builtin and disk personas (and the last user personas it read), and the
schema is migrated on first contact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import redis
from anyio import CapacityLimiter
from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from coordinator.api.limits import ApiLimiter
from coordinator.api.stream_hub import StreamHub
from coordinator.audit_follower import AuditFollower
from coordinator.auth import Principal, authenticate, require
from coordinator.notify.sender import NotificationSender
from coordinator.plugin_manager import PluginManager
from coordinator.schedules import ScheduleBook
from coordinator.storage.audit import AuditStore
from coordinator.storage.chats import ChatSession, ChatStore
from coordinator.storage.engine import Database
from coordinator.storage.notifications import NotificationStore
from coordinator.storage.personas import GuardedUserStore
from marketplace.catalog import spawn_catalog
from marketplace.mcp_catalog import described_mcp_tools
from registry.agent_registry import AgentRegistry, Snapshot
from registry.errors import NotFoundError
from registry.settings import Settings
from registry.tools import ToolCatalog
from workers.celery_app import DEFAULT_REDIS_URL
from workers.client import SpawnClient
from workers.reload import RegistryFollower

__all__ = [
    "Approver",
    "Auditor",
    "Caller",
    "Editor",
    "Services",
    "Svc",
    "caller",
    "owned_session",
    "services",
    "snapshot",
]


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
    #: The audit trail of approvals, and what copies the approval feed into it.
    audit: AuditStore
    audit_follower: AuditFollower
    #: Scheduled investigations and their beat entries.
    schedules: ScheduleBook
    #: Marketplaces and installed plugins (admin operations).
    plugins: PluginManager
    #: The one pub/sub connection and read pool of every event stream of this process.
    hub: StreamHub
    #: The per-user and per-process bounds the API checks (``limits:``).
    limits: ApiLimiter
    #: The threads that start chat turns (``intake_threads`` at once).
    intake: CapacityLimiter
    #: The notification outbox, and the sender that fills and delivers it (elected).
    notifications: NotificationStore
    notifier: NotificationSender

    @property
    def redis_url(self) -> str:
        return self.settings.redis_url or DEFAULT_REDIS_URL

    def snapshot(self) -> Snapshot:
        """The registry at the cluster's version (reloads first if a broadcast was missed)."""
        self.follower.catch_up()
        return self.registry.snapshot()

    def catalog_for(self, snapshot: Snapshot) -> ToolCatalog:
        """The tools a spawn could be given under ``snapshot``: the code tools, the skill and
        manifest tools of its bundles, and the tools the workers reported for its MCP servers
        (described only: the API runs no MCP server)."""
        servers = getattr(snapshot.bundle, "mcp_servers", None) or {}
        mcp = described_mcp_tools(self.probe, servers, self.settings.key_prefix)
        return spawn_catalog(self.catalog, snapshot.bundle, mcp)

    def close(self) -> None:
        self.notifier.stop()
        self.audit_follower.stop()
        self.client.redis.close()
        self.probe.close()
        self.database.engine.dispose()


# Dependencies that only compute are ``async def``: FastAPI runs a plain ``def`` dependency in its
# thread pool, and that hop cost more CPU than the work itself (profiled on the chat path). Those
# that read the database or Redis stay ``def``, off the event loop.


async def services(request: Request) -> Services:
    return request.app.state.services  # type: ignore[no-any-return]


Svc = Annotated[Services, Depends(services)]

#: Documents the scheme in OpenAPI; the header itself is checked by :func:`authenticate`.
_bearer = HTTPBearer(
    auto_error=False, description="`Authorization: Bearer <token>`; tokens come from ONGRID_CONFIG."
)


async def caller(
    request: Request,
    svc: Svc,
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)],
) -> Principal:
    """The authenticated user (401 otherwise)."""
    return authenticate(svc.settings, request.headers.get("authorization"))


Caller = Annotated[Principal, Depends(caller)]


async def editor(principal: Caller) -> Principal:
    """A caller whose role may edit personas (403 otherwise)."""
    require(principal, "edit_personas")
    return principal


async def approver(principal: Caller) -> Principal:
    """A caller whose role may approve tool calls (403 otherwise)."""
    require(principal, "approve")
    return principal


async def auditor(principal: Caller) -> Principal:
    """A caller whose role may read the audit trail (403 otherwise)."""
    require(principal, "audit")
    return principal


Editor = Annotated[Principal, Depends(editor)]
Approver = Annotated[Principal, Depends(approver)]
Auditor = Annotated[Principal, Depends(auditor)]


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
