"""What one user, and one API process, may hold or start (``limits:`` in the config file).

- **Event streams** (every SSE endpoint): counted in this process, per user and in all
  (:class:`StreamSlots`). A slot is taken before a stream is answered and given back when the
  response ends, however it ends (the stream's end, a disconnect, an error, a cancellation).
- **Chat turns per minute**, per user, counted across the cluster in Redis
  (:class:`~workers.limits.RateWindow`), before anything of the turn is written.
- **Chat sessions per user**, counted in the database before a new one is made; far below the
  bound the count is reused for a few seconds (:class:`SessionCounts`).
- **Spawns per minute**, per user, counted where every spawn starts
  (:meth:`workers.client.SpawnClient.spawn`), so a coordinator's dispatches count too.

A request past a bound is refused with :class:`~workers.limits.LimitExceeded`, which
:mod:`coordinator.api.errors` answers 429 naming the limit, its value and the setting.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import redis

from coordinator.storage.chats import ChatStore
from registry.settings import ApiLimits
from workers.limits import LimitExceeded, RateWindow

__all__ = ["ApiLimiter", "SessionCounts", "StreamSlot", "StreamSlots"]


class StreamSlot:
    """One open stream's place in :class:`StreamSlots`; :meth:`release` it once, or more."""

    def __init__(self, slots: StreamSlots, user: str) -> None:
        self._slots, self.user = slots, user
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._slots._give_back(self.user)


class StreamSlots:
    """The event streams open in this process: at most ``per_user`` for one user and
    ``per_process`` in all."""

    def __init__(self, per_user: int, per_process: int) -> None:
        self.per_user, self.per_process = per_user, per_process
        self._by_user: dict[str, int] = {}
        self._total = 0
        self._lock = threading.Lock()

    def take(self, user: str) -> StreamSlot:
        """A slot for one more stream of ``user``'s, or :class:`LimitExceeded`."""
        with self._lock:
            held = self._by_user.get(user, 0)
            if held >= self.per_user:
                raise LimitExceeded(
                    "streams_per_user",
                    self.per_user,
                    f"{user!r} has {held} event streams open; close one first",
                )
            if self._total >= self.per_process:
                raise LimitExceeded(
                    "streams_per_process",
                    self.per_process,
                    f"this API process has {self._total} event streams open",
                )
            self._by_user[user] = held + 1
            self._total += 1
        return StreamSlot(self, user)

    def held(self, user: str | None = None) -> int:
        """Streams open: ``user``'s, or everyone's."""
        with self._lock:
            return self._total if user is None else self._by_user.get(user, 0)

    def _give_back(self, user: str) -> None:
        with self._lock:
            left = self._by_user.get(user, 0) - 1
            if left > 0:
                self._by_user[user] = left
            else:
                self._by_user.pop(user, None)
            self._total -= 1


class SessionCounts:
    """How many chat sessions each user keeps: the database's count as this process last read
    it, plus the sessions this process started since.

    Counting a user's sessions was a query on every new chat, the largest single cost of taking
    one in (bench/engine_load.py, profiled). Far from the bound the figure need not be exact: it
    is read again only once it is ``fresh_seconds`` old or within ``headroom`` of the bound
    (a tenth of it, at least 1), and near the bound every check reads the database. Sessions
    another API process starts are seen at the next read, so only while this process's figure
    was more than ``headroom`` below the bound can they take a user past it, by at most what
    they start within ``fresh_seconds``.
    """

    #: Users whose figure is kept; past it, the stale ones are forgotten.
    KEPT_USERS = 10_000

    def __init__(
        self, fresh_seconds: float = 5.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.fresh_seconds, self._clock = fresh_seconds, clock
        self._known: dict[str, tuple[int, float]] = {}  # user → (sessions, read at)
        self._lock = threading.Lock()

    def kept(self, chats: ChatStore, user: str, bound: int) -> int:
        """``user``'s sessions, from the database unless a fresh figure is far below ``bound``."""
        now = self._clock()
        with self._lock:
            known = self._known.get(user)
        if known is not None:
            count, read_at = known
            if now - read_at < self.fresh_seconds and count < bound - max(1, bound // 10):
                return count
        count = chats.count_sessions(user)
        with self._lock:
            if len(self._known) >= self.KEPT_USERS:
                self._forget_stale(now)
            self._known[user] = (count, now)
        return count

    def started(self, user: str) -> None:
        """One more session of ``user``'s was written by this process."""
        with self._lock:
            if (known := self._known.get(user)) is not None:
                self._known[user] = (known[0] + 1, known[1])

    def _forget_stale(self, now: float) -> None:
        for user, (_, read_at) in list(self._known.items()):
            if now - read_at >= self.fresh_seconds:
                del self._known[user]


class ApiLimiter:
    """The bounds of :class:`~registry.settings.ApiLimits` that the API itself checks
    (spawns are the spawn client's: :attr:`workers.client.SpawnClient.spawn_rate`)."""

    def __init__(self, limits: ApiLimits, client: redis.Redis, prefix: str = "ongrid:") -> None:
        self.limits = limits
        self.streams = StreamSlots(limits.streams_per_user, limits.streams_per_process)
        self.sessions = SessionCounts()
        self.turns = RateWindow(
            client,
            "turns",
            limits.turns_per_minute,
            limit_name="turns_per_minute",
            what="chat turns",
            prefix=prefix,
        )

    def check_new_session(self, chats: ChatStore, user: str) -> None:
        """:class:`LimitExceeded` if ``user`` keeps as many chat sessions as allowed."""
        bound = self.limits.sessions_per_user
        kept = self.sessions.kept(chats, user, bound)
        if kept >= bound:
            raise LimitExceeded(
                "sessions_per_user",
                bound,
                f"{user!r} keeps {kept} chat sessions; continue one of them",
            )
