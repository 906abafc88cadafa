"""All leases of one worker process renewed together, in one Redis call per period.

A thread, not a coroutine: the engine's event loop may be saturated with CPU work (streamed
replies, tool output) for longer than a lease lasts, and a live worker must never lose a lease
because it is busy. The thread needs the GIL only for the moment it takes to send one script
call, whatever the number of spawns held.

A lease outlives several missed periods (the period is a fraction of its TTL), so a Redis error
is logged and the renewal tried again at the next period. A lease found gone or taken by
another attempt is reported once through ``on_lost`` and no longer renewed.

The keeper also fences its own process. Redis lets a lease expire TTL after the renewal that set
it ran, and no other worker can take the spawn before that; this process counts the same TTL
from the moment it *sent* that renewal, which is earlier. So once a lease has not been confirmed
for its TTL (less a margin for clocks that run at slightly different rates), a second thread, the
fence, reports it lost even though Redis cannot be asked: a worker cut off from Redis stops its
spawns, and makes no model or tool call for them (:class:`LeaseFence`), before another worker
can have resumed them. The renewal itself cannot extend a lease another attempt took: the script
checks the token.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import redis
from pydantic import BaseModel

from registry.errors import LeaseLost
from registry.tools import BaseTool, ToolContext, ToolResult
from workers.loop import RunTool
from workers.model import Model, ModelReply, ModelRequest
from workers.spawns import SpawnStore

__all__ = ["FENCE_MARGIN", "LeaseFence", "LeaseKeeper"]

#: The part of the TTL a lease is given up early by the fence, for clock-rate differences between
#: this host and Redis's and for the time between the check and the call it lets through.
FENCE_MARGIN = 0.15

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
        #: Seconds after it was last confirmed that a lease counts as lost here.
        self.valid_for = ttl_ms / 1000 * (1 - FENCE_MARGIN)
        self._held: dict[str, str] = {}
        #: When each lease was last confirmed: the monotonic time its claim or renewal was sent.
        self._confirmed: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease-keeper", daemon=True)
        self._fence = threading.Thread(target=self._watch, name="lease-fence", daemon=True)

    def hold(self, spawn_id: str, token: str, confirmed_at: float | None = None) -> None:
        """Renew the lease ``token`` of ``spawn_id`` from the next period on. ``confirmed_at``:
        the ``time.monotonic()`` at which the claim that took it was sent (default: now)."""
        with self._lock:
            self._held[spawn_id] = token
            self._confirmed[spawn_id] = time.monotonic() if confirmed_at is None else confirmed_at

    def drop(self, spawn_id: str) -> None:
        """Stop renewing the lease of ``spawn_id``."""
        with self._lock:
            self._held.pop(spawn_id, None)
            self._confirmed.pop(spawn_id, None)

    def held(self) -> dict[str, str]:
        """The leases renewed now: spawn id → token."""
        with self._lock:
            return dict(self._held)

    def valid(self, spawn_id: str) -> bool:
        """Whether this process may still act for ``spawn_id``: it holds the lease and has
        confirmed it recently enough that no other attempt can have taken it."""
        with self._lock:
            confirmed = self._confirmed.get(spawn_id)
        return confirmed is not None and time.monotonic() - confirmed < self.valid_for

    def start(self) -> None:
        self._thread.start()
        self._fence.start()

    def stop(self) -> None:
        """Renew no more; returns once the threads have ended."""
        self._stop.set()
        for thread in (self._thread, self._fence):
            if thread.is_alive():
                thread.join()

    def renew_now(self) -> list[str]:
        """One renewal of every held lease; the spawn ids found lost (each reported once)."""
        held = self.held()
        sent = time.monotonic()
        lost = set(self.store.renew_all(held, self.ttl_ms))
        with self._lock:
            for spawn_id, token in held.items():
                if spawn_id not in lost and self._held.get(spawn_id) == token:
                    self._confirmed[spawn_id] = max(self._confirmed.get(spawn_id, 0.0), sent)
        return self._report(held, lost)

    def _report(self, held: dict[str, str], lost: Any) -> list[str]:
        reported = []
        for spawn_id in sorted(lost):
            with self._lock:
                # Dropped or held again under a new token meanwhile: not the lease that was lost.
                if self._held.get(spawn_id) != held[spawn_id]:
                    continue
                del self._held[spawn_id]
                self._confirmed.pop(spawn_id, None)
            reported.append(spawn_id)
            try:
                self.on_lost(spawn_id)
            except Exception:  # noqa: BLE001 - one failing callback must not stop the renewals
                log.exception("lease of %s lost; its on_lost callback failed", spawn_id)
        return reported

    def fence_now(self) -> list[str]:
        """Report the leases not confirmed for :attr:`valid_for` seconds as lost."""
        now = time.monotonic()
        with self._lock:
            held = dict(self._held)
            stale = [s for s, at in self._confirmed.items() if now - at >= self.valid_for]
        for spawn_id in stale:
            log.warning(
                "lease of spawn %s not confirmed for %.1f s (Redis unreachable?): stopping this "
                "attempt before another worker may take the spawn over",
                spawn_id,
                self.valid_for,
            )
        return self._report(held, [s for s in stale if s in held])

    def _watch(self) -> None:
        # Not in the renewal thread: a renewal sent into a cut link can block far longer than
        # a lease lasts.
        every = min(0.25, self.valid_for / 20)
        while not self._stop.wait(every):
            self.fence_now()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.renew_now()
            except redis.RedisError as exc:
                count = len(self._held)
                log.warning("renewal of %d leases failed, trying again next period: %s", count, exc)


class LeaseFence:
    """Lets a spawn's model and tool calls through only while :meth:`LeaseKeeper.valid`.

    The check is made right before each call goes out, retries included: a call that was not
    sent before the lease lapsed here is never sent.
    """

    def __init__(self, keeper: LeaseKeeper, spawn_id: str) -> None:
        self.keeper, self.spawn_id = keeper, spawn_id

    def check(self) -> None:
        if not self.keeper.valid(self.spawn_id):
            raise LeaseLost(self.spawn_id)

    def model(self, inner: Model) -> Model:
        return _FencedModel(inner, self)

    def run_tool(self, inner: RunTool) -> RunTool:
        async def run(tool: BaseTool, arguments: BaseModel, context: ToolContext) -> ToolResult:
            self.check()
            return await inner(tool, arguments, context)

        return run


class _FencedModel:
    def __init__(self, inner: Model, fence: LeaseFence) -> None:
        self.inner, self.fence = inner, fence

    async def stream(self, request: ModelRequest) -> AsyncIterator[str | ModelReply]:
        self.fence.check()
        async for item in self.inner.stream(request):
            yield item
