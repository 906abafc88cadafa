"""The coordinator's database, in one place: engine and migrations, user personas, chats.

- :mod:`~coordinator.storage.engine`: engines for SQLite and PostgreSQL, readiness, and
  :func:`~coordinator.storage.engine.upgrade` (Alembic, ``migrations/``);
- :mod:`~coordinator.storage.personas`: user personas (the store behind the registry's
  ``UserStore`` protocol);
- :mod:`~coordinator.storage.chats`: chat sessions and messages;
- :mod:`~coordinator.storage.audit`: the audit trail of approvals;
- :mod:`~coordinator.storage.plugins`: the marketplaces added and the plugins installed;
- :mod:`~coordinator.storage.cluster`: what processes announce to each other (``cluster_facts``);
- :mod:`~coordinator.storage.notifications`: the notification outbox;
- :mod:`~coordinator.storage.schedules`: scheduled investigations and their runs.

:mod:`registry` declares the store protocol and never imports this package.
"""

from __future__ import annotations

from sqlalchemy import MetaData

from coordinator.storage.audit import AUDIT_METADATA
from coordinator.storage.chats import CHAT_METADATA
from coordinator.storage.cluster import CLUSTER_METADATA
from coordinator.storage.notifications import NOTIFICATIONS_METADATA
from coordinator.storage.personas import AGENTS_METADATA
from coordinator.storage.plugins import PLUGINS_METADATA
from coordinator.storage.schedules import SCHEDULES_METADATA

__all__ = ["TARGET_METADATA"]

#: Everything the migrations manage.
TARGET_METADATA: list[MetaData] = [
    AGENTS_METADATA,
    CHAT_METADATA,
    AUDIT_METADATA,
    PLUGINS_METADATA,
    CLUSTER_METADATA,
    NOTIFICATIONS_METADATA,
    SCHEDULES_METADATA,
]
