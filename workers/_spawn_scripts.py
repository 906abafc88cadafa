"""The Lua scripts of the spawn stores (:mod:`workers.spawns`) and the reaper.

Each script is one atomic step a plain transaction cannot take: a write fenced by a lease
token, or a deadline taken from the Redis server's clock (``TIME``), so hosts with skewed clocks
agree on when a lease expires.
"""

from __future__ import annotations

__all__ = [
    "COMPARE_AND_DELETE",
    "COMPARE_AND_PEXPIRE",
    "EXPIRED_APPROVALS",
    "EXPIRED_LEASES",
    "FORGET_EXPIRED",
    "LEASE_DEADLINE",
    "RELEASE",
    "RENEW_ALL",
    "SAVE",
]

#: The Redis server's clock in milliseconds; every deadline is taken from it.
_NOW_MS = "local t = redis.call('TIME')\nlocal now = t[1] * 1000 + math.floor(t[2] / 1000)\n"

#: KEYS: record, lease, messages, lease deadlines, active set, cancel request. ARGV: record
#: JSON, token, retention (s), release (1/0), finished (1/0), spawn id, replace the list (1/0),
#: messages. Returns 0 (the lease is not the token's: nothing written), 1 (written) or 2
#: (written, and a cancel of the spawn was requested: the checkpoint's look at it costs no
#: round trip of its own).
SAVE = """
if redis.call('GET', KEYS[2]) ~= ARGV[2] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[3])
if ARGV[7] == '1' then
  redis.call('DEL', KEYS[3])
end
for i = 8, #ARGV, 1000 do
  redis.call('RPUSH', KEYS[3], unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
redis.call('EXPIRE', KEYS[3], ARGV[3])
if ARGV[4] == '1' then
  redis.call('DEL', KEYS[2])
end
if ARGV[4] == '1' or ARGV[5] == '1' then
  redis.call('ZREM', KEYS[4], ARGV[6])
end
if ARGV[5] == '1' then
  redis.call('SREM', KEYS[5], ARGV[6])
end
if redis.call('EXISTS', KEYS[6]) == 1 then
  return 2
end
return 1
"""
#: KEYS: lease deadlines, then one lease key per spawn. ARGV: ttl (ms), then spawn id and token
#: of each lease key in turn. Returns the spawn ids whose lease is not (any more) that token's.
RENEW_ALL = (
    _NOW_MS
    + """
local deadline = now + tonumber(ARGV[1])
local lost = {}
for i = 2, #KEYS do
  local spawn_id, token = ARGV[2 * i - 2], ARGV[2 * i - 1]
  if redis.call('GET', KEYS[i]) == token then
    redis.call('PEXPIRE', KEYS[i], ARGV[1])
    redis.call('ZADD', KEYS[1], deadline, spawn_id)
  else
    lost[#lost + 1] = spawn_id
  end
end
return lost
"""
)
#: KEYS: lease deadlines. ARGV: ttl (ms), spawn id. Queued in the claim's ``MULTI``.
LEASE_DEADLINE = _NOW_MS + "redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), ARGV[2])\n"
#: KEYS: lease, lease deadlines. ARGV: token, spawn id.
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[2], ARGV[2])
  return 1
end
return 0
"""
#: KEYS: a key. ARGV: the value it must hold, ttl (ms).
COMPARE_AND_PEXPIRE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
#: KEYS: a key. ARGV: the value it must hold.
COMPARE_AND_DELETE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
#: KEYS: lease deadlines. ARGV: how many at most. Returns Redis time (ms), then the spawn ids
#: whose deadline has passed, earliest first.
EXPIRED_LEASES = (
    _NOW_MS + "return {now, redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, ARGV[1])}"
)
#: KEYS: approval deadlines. ARGV: how many at most. Returns Redis time (unix seconds, as a
#: string: Lua numbers reach the client as integers), then the members whose deadline has
#: passed, earliest first.
EXPIRED_APPROVALS = """
local t = redis.call('TIME')
local now = string.format('%d.%06d', t[1], t[2])
return {now, redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, ARGV[1])}
"""
#: KEYS: lease (or approval) deadlines. ARGV: a time (ms; seconds for approvals), then members:
#: each is removed if its deadline is still at or before that time (a claim, a renewal or a
#: new request since then moved it: it stays).
FORGET_EXPIRED = """
local removed = 0
for i = 2, #ARGV do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) <= tonumber(ARGV[1]) then
    removed = removed + redis.call('ZREM', KEYS[1], ARGV[i])
  end
end
return removed
"""
