"""One holder per cluster of a duty (the reaper, the notification sender), elected in Redis.

The key holds the holder's id with a TTL of a few periods, renewed by the holder each period
(only while it still holds it: a compare-and-expire); the others stand by, and the first to find
the key gone takes it. A holder that stalls longer than the TTL loses the duty and says so.
"""

from __future__ import annotations

import logging
import threading

import redis

from workers._spawn_scripts import COMPARE_AND_DELETE, COMPARE_AND_PEXPIRE

__all__ = ["Election"]

log = logging.getLogger(__name__)


class Election:
    """``member``'s candidacy for the duty ``key`` (``what`` names it in logs); ``ttl_ms``: how
    long the duty outlives its holder's last renewal."""

    def __init__(self, client: redis.Redis, key: str, member: str, ttl_ms: int, what: str) -> None:
        self.client, self.key, self.member = client, key, member
        self.ttl_ms, self.what = ttl_ms, what
        self._extend = client.register_script(COMPARE_AND_PEXPIRE)
        self._resign = client.register_script(COMPARE_AND_DELETE)
        self._held = threading.Event()

    @property
    def held(self) -> bool:
        return self._held.is_set()

    def hold(self) -> bool:
        """Renew the duty if held, else take it if free; whether ``member`` holds it now."""
        if self._held.is_set():
            if self._extend(keys=[self.key], args=[self.member, self.ttl_ms]):
                return True
            self._held.clear()
            log.warning(
                "%s of %s lost the leadership (it stalled too long)", self.what, self.member
            )
        if self.client.set(self.key, self.member, nx=True, px=self.ttl_ms):
            self._held.set()
            log.info("%s of %s is the leader", self.what, self.member)
            return True
        return False

    def resign(self) -> None:
        """Give the duty up at once (another candidate takes it at its next period)."""
        if self._held.is_set():
            try:
                self._resign(keys=[self.key], args=[self.member])
            except redis.RedisError as exc:
                log.warning("%s: could not resign the leadership: %s", self.what, exc)
        self._held.clear()
