"""Registry reload broadcast: a versioned counter in Redis plus a pub/sub nudge.

The counter is the truth: a process that missed the broadcast (it was down) sees a newer version
when it starts or at its next spawn and reloads then. The pub/sub message only makes live
processes reload at once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import cast

import redis

from registry.agent_registry import AgentRegistry, Snapshot
from workers.channels import scoped

__all__ = ["RegistryFollower", "broadcast_reload", "cluster_version"]

log = logging.getLogger(__name__)


def _keys(client: redis.Redis, prefix: str) -> tuple[str, str]:
    """The version key and the reload channel (scoped to the client's database: a stack on
    another database of the same server does not hear it)."""
    return f"{prefix}registry:version", scoped(client, prefix, "registry:reload")


def reload_channel(client: redis.Redis, prefix: str = "ongrid:") -> str:
    """The channel reloads are announced on, for ``client``'s database."""
    return _keys(client, prefix)[1]


def broadcast_reload(client: redis.Redis, prefix: str = "ongrid:") -> int:
    """Bump the registry version and tell every live process. Returns the new version."""
    version_key, channel = _keys(client, prefix)
    version = int(cast(int, client.incr(version_key)))
    client.publish(channel, str(version))
    return version


def cluster_version(client: redis.Redis, prefix: str = "ongrid:") -> int:
    """The cluster's registry version (0 before the first reload)."""
    return int(cast(bytes | None, client.get(_keys(client, prefix)[0])) or 0)


class RegistryFollower:
    """Keeps one process's registry at the cluster's registry version.

    ``seen`` is the version ``registry`` was loaded at; read it *before* loading, so a reload
    broadcast while the disk was being read is not taken as already applied. Default: now.
    """

    def __init__(
        self,
        client: redis.Redis,
        registry: AgentRegistry,
        prefix: str = "ongrid:",
        *,
        seen: int | None = None,
    ):
        self.r = client
        self.registry = registry
        self.prefix = prefix
        self.version_key, self.channel = _keys(client, prefix)
        self.seen = self._current() if seen is None else seen
        self._lock = threading.Lock()
        #: Called with each snapshot a reload of this follower built (the worker restarts its
        #: MCP servers from it); an error in it is logged, never raised.
        self.on_reload: Callable[[Snapshot], None] | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def _current(self) -> int:
        return cluster_version(self.r, self.prefix)

    def catch_up(self) -> bool:
        """Reload if the cluster moved on since we last looked. True when a reload happened."""
        current = self._current()
        with self._lock:
            if current == self.seen:
                return False
            snapshot = self.registry.reload()
            self.seen = current
            log.info("registry reloaded to cluster version %s", current)
        if self.on_reload is not None:
            try:
                self.on_reload(snapshot)
            except Exception:
                log.exception("after the reload to cluster version %s", current)
        return True

    def start(self) -> None:
        self._thread = threading.Thread(target=self._listen, name="registry-follower", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _listen(self) -> None:
        while not self._stop.is_set():
            try:
                pubsub = self.r.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(self.channel)
                self.catch_up()  # anything broadcast while we were not subscribed
                while not self._stop.is_set():
                    if pubsub.get_message(timeout=1.0):
                        self.catch_up()
            except redis.RedisError as exc:
                log.warning("registry follower lost Redis (%s); retrying", exc)
                self._stop.wait(1.0)
