"""Pub/sub channel names scoped to the Redis database their keys live in.

Redis keys belong to one database (the ``/N`` of the URL), but pub/sub channels are global to
the server: two stacks sharing a server on different databases would hear each other's registry
reloads and session wake-ups. Every channel the runtime publishes on therefore carries the
database number of the connection that names it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["database_of", "scoped"]


def database_of(client: Any) -> int:
    """The database number a (sync or asyncio) redis-py client works in."""
    return int(client.connection_pool.connection_kwargs.get("db") or 0)


def scoped(client: Any, prefix: str, name: str) -> str:
    """The channel ``{prefix}{name}`` for the database of ``client``: ``ongrid:db3:…``."""
    return f"{prefix}db{database_of(client)}:{name}"
