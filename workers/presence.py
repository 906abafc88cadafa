"""Who is alive, in Redis: a sorted set whose members are processes and whose scores are the
moments, in Redis server time, their presence expires.

The queue advertisements (:mod:`workers.consumers`) and the fleet reports (:mod:`workers.fleet`)
are both kept this way: a live process renews its member, a dead one drops out when its score
passes, and a reader keeps the members whose score is still ahead of the server's clock. Server
time on both sides, so the clocks of the hosts never matter.
"""

from __future__ import annotations

from typing import Any

import redis

__all__ = ["RENEW_FRACTION", "live_members", "renew_member", "server_now"]

#: A presence is renewed every this fraction of its TTL, so it survives four missed renewals.
RENEW_FRACTION = 0.2


def server_now(reply: Any) -> float:
    """Redis ``TIME`` (seconds, microseconds) as seconds."""
    seconds, micros = reply
    return int(seconds) + int(micros) / 1e6


def renew_member(
    pipe: redis.client.Pipeline, key: str, member: str, now: float, ttl: float
) -> None:
    """Queue on ``pipe`` the renewal of ``member`` in ``key`` until ``now + ttl`` (server time)."""
    pipe.zadd(key, {member: now + ttl})
    pipe.zremrangebyscore(key, "-inf", now)  # the dead leave the set, not just the count
    pipe.pexpire(key, int(ttl * 3000))  # and the set leaves Redis with the last one


def live_members(found: list[tuple[bytes | str, float]], now: float) -> list[str]:
    """The members of a ``ZRANGE … WITHSCORES`` reply still present at ``now``, sorted."""
    return sorted(_text(m) for m, expires in found if expires > now)


def _text(member: bytes | str) -> str:
    return member.decode() if isinstance(member, bytes) else member
