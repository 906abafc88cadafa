"""All leases of one worker process renewed together, in one Redis call per period.

A thread, not a coroutine: the engine's event loop may be saturated with CPU work (streamed
replies, tool output) for longer than a lease lasts, and a live worker must never lose a lease
because it is busy. The thread needs the GIL only for the moment it takes to send one script
call, whatever the number of spawns held.

A lease outlives several missed periods (the period is a fraction of its TTL), so a Redis error
is logged and the renewal tried again at the next period. A lease found gone or taken by
another attempt is reported once through ``on_lost`` and no longer renewed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import redis

from workers.spawns import SpawnStore

__all__ = ["LeaseKeeper"]

log = logging.getLogger(__name__)


class LeaseKeeper:
    """Renews the leases this process holds, every ``period_s`` seconds, to ``ttl_ms``.

    ``store``: a blocking store whose connection pool serves this thread alone (the engine's
    coroutines use their own ``redis.asyncio`` client). Call :meth:`drop` before the write that
    gives a lease back (the attempt's last save, or :meth:`SpawnStore.release`): a renewal
    between the two would report the released lease as lost.
    """

    def __init__(
        self,
        store: SpawnStore,
        ttl_ms: int,
        period_s: float,
        on_lost: Callable[[str], None],
    ) -> None:
        self.store, self.ttl_ms, self.period_s, self.on_lost = store, ttl_ms, period_s, on_lost
        self._held: dict[str, str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease-keeper", daemon=True)

    def hold(self, spawn_id: str, token: str) -> None:
        """Renew the lease ``token`` of ``spawn_id`` from the next period on."""
        with self._lock:
            self._held[spawn_id] = token

    def drop(self, spawn_id: str) -> None:
        """Stop renewing the lease of ``spawn_id``."""
        with self._lock:
            self._held.pop(spawn_id, None)

    def held(self) -> dict[str, str]:
        """The leases renewed now: spawn id → token."""
        with self._lock:
            return dict(self._held)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Renew no more; returns once the thread has ended."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def renew_now(self) -> list[str]:
        """One renewal of every held lease; the spawn ids found lost (each reported once)."""
        held = self.held()
        lost = self.store.renew_all(held, self.ttl_ms)
        reported = []
        for spawn_id in lost:
            with self._lock:
                # Dropped or held again under a new token meanwhile: not the lease that was lost.
                if self._held.get(spawn_id) != held[spawn_id]:
                    continue
                del self._held[spawn_id]
            reported.append(spawn_id)
            try:
                self.on_lost(spawn_id)
            except Exception:  # noqa: BLE001 - one failing callback must not stop the renewals
                log.exception("lease of %s lost; its on_lost callback failed", spawn_id)
        return reported

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.renew_now()
            except redis.RedisError as exc:
                count = len(self._held)
                log.warning("renewal of %d leases failed, trying again next period: %s", count, exc)
