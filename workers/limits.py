"""Per-user bounds on how fast things start, counted in Redis so they hold across the cluster.

A :class:`RateWindow` lets one user take at most ``limit`` starts (spawns, chat turns) per
window: a counter per user and kind (``{prefix}limits:{kind}:{user}``) that expires with its
window, checked and counted by one script, so every API process and worker on the same Redis
counts together and a check is one round trip. The window opens with the first start and
closes ``window`` seconds later (a fixed window: at most ``limit`` starts in it, and in the
worst case twice that across the edge of two windows).

A start over the bound is refused with :class:`LimitExceeded`, a
:class:`~registry.errors.UserError` that names the limit, its value and the setting that
raises it; the HTTP API answers it 429, a coordinator's ``spawn_agent`` gets it as an error
result.
"""

from __future__ import annotations

import math
from typing import Any

import redis

from registry.errors import UserError

__all__ = ["LimitExceeded", "RateWindow"]

# KEYS: the counter. ARGV: limit, window (ms). Returns -1 when counted, else the ms until the
# window closes. A counter without expiry (restored from a dump, set by hand) gets one, so no
# user stays refused for good.
_TAKE_LUA = """
local count = tonumber(redis.call('GET', KEYS[1]) or '0')
local left = redis.call('PTTL', KEYS[1])
if count > 0 and left < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  left = tonumber(ARGV[2])
end
if count >= tonumber(ARGV[1]) then
  return left
end
redis.call('INCR', KEYS[1])
if count == 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return -1
"""


class LimitExceeded(UserError):
    """A request past one of the ``limits`` settings; the HTTP API answers 429.

    ``limit`` is the field of :class:`~registry.settings.ApiLimits` (``streams_per_user``),
    ``value`` its value, ``retry_after`` the seconds until a rate limit lets the next one
    through (``None`` for a bound on what is held at once).
    """

    def __init__(
        self,
        limit: str,
        value: int,
        subject: str,
        *,
        per: str = "",
        retry_after: float | None = None,
    ) -> None:
        self.limit, self.value, self.retry_after = limit, value, retry_after
        bound = f"{value} {per}".strip()
        retry = f"; retry in {math.ceil(retry_after)} s" if retry_after is not None else ""
        super().__init__(f"{subject}: the limit is {bound} ({self.setting}){retry}")

    @property
    def setting(self) -> str:
        """The configuration key that sets the bound."""
        return f"limits.{self.limit}"


class RateWindow:
    """At most ``limit`` starts of ``kind`` per user in ``window`` seconds, on ``client``'s Redis.

    ``limit_name`` is the setting's field (``spawns_per_minute``), ``what`` the plural the
    refusal names (``spawns``).
    """

    def __init__(
        self,
        client: redis.Redis,
        kind: str,
        limit: int,
        *,
        limit_name: str,
        what: str,
        window: float = 60.0,
        prefix: str = "ongrid:",
    ) -> None:
        if limit < 1 or window <= 0:
            raise UserError(f"{limit_name} must be at least 1 per window, got {limit}")
        self.kind, self.limit, self.window = kind, limit, window
        self.limit_name, self.what, self.prefix = limit_name, what, prefix
        self._take = client.register_script(_TAKE_LUA)

    def key(self, user: str) -> str:
        return f"{self.prefix}limits:{self.kind}:{user}"

    def take(self, user: str) -> None:
        """Count one start of ``user``'s, or raise :class:`LimitExceeded` (nothing counted)."""
        window_ms = max(1, int(self.window * 1000))
        left: Any = self._take(keys=[self.key(user)], args=[self.limit, window_ms])
        if int(left) < 0:
            return
        per = "per minute" if self.window == 60 else f"per {self.window:g} s"
        raise LimitExceeded(
            self.limit_name,
            self.limit,
            f"too many {self.what} started by {user!r}",
            per=per,
            retry_after=max(1, math.ceil(int(left) / 1000)),
        )
