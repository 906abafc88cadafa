"""Spawn records in Redis: what was asked, which persona version runs it, its checkpoint, its
outcome, and the lease that says which worker holds it.

Every write of a running spawn is fenced by its lease: a worker that lost its lease (it stalled,
another worker took over) cannot overwrite the newer attempt's checkpoint.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

import redis
from pydantic import BaseModel, Field

from workers.loop import LoopState

__all__ = ["LeaseLost", "SpawnRecord", "SpawnStatus", "SpawnStore"]

SpawnStatus = Literal["queued", "running", "waiting", "ok", "failed", "cancelled"]
FINAL_STATUSES = frozenset({"ok", "failed", "cancelled"})


class LeaseLost(Exception):
    """This worker no longer holds the spawn: another attempt owns it now."""


class SpawnRecord(BaseModel):
    spawn_id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    session_id: str
    persona: str
    prompt: str
    context: dict[str, Any] = Field(default_factory=dict)
    role: str = "admin"
    user: str = ""
    background: bool = False
    queue: str = ""
    reason: str = ""  # why this persona was chosen (the coordinator's matching hint)
    status: SpawnStatus = "queued"
    attempts: int = 0  # executions started by a worker, resumptions included
    lost_attempts: int = 0  # attempts whose worker died (or stalled) before reporting back
    persona_markdown: str = ""  # the persona version this spawn started with, pinned
    persona_source: str = ""
    model_id: str = ""
    state: LoopState | None = None
    result: str = ""
    error: str = ""
    created: float = Field(default_factory=time.time)
    updated: float = Field(default_factory=time.time)

    @property
    def finished(self) -> bool:
        return self.status in FINAL_STATUSES


_FENCED_SET = """
if redis.call('GET', KEYS[2]) == ARGV[2] then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[3])
  if ARGV[4] == '1' then
    redis.call('DEL', KEYS[2])
  end
  return 1
end
return 0
"""
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class SpawnStore:
    def __init__(
        self, client: redis.Redis, prefix: str = "ongrid:", retention: int = 7 * 86400
    ) -> None:
        self.r = client
        self.prefix = prefix
        self.retention = retention
        self._fenced_set = client.register_script(_FENCED_SET)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)

    def _key(self, spawn_id: str) -> str:
        return f"{self.prefix}spawn:{spawn_id}"

    def lease_key(self, spawn_id: str) -> str:
        return f"{self.prefix}lease:{spawn_id}"

    @property
    def active_key(self) -> str:
        return f"{self.prefix}spawns:active"

    def create(self, record: SpawnRecord) -> SpawnRecord:
        pipe = self.r.pipeline()
        pipe.set(self._key(record.spawn_id), record.model_dump_json(), ex=self.retention)
        pipe.sadd(self.active_key, record.spawn_id)
        pipe.execute()
        return record

    def get(self, spawn_id: str) -> SpawnRecord | None:
        raw = self.r.get(self._key(spawn_id))
        return SpawnRecord.model_validate_json(raw) if raw else None

    def save(self, record: SpawnRecord, token: str, *, release: bool = False) -> None:
        """Write ``record`` if ``token`` still holds the lease; else :class:`LeaseLost`.

        ``release``: give the lease back in the same atomic step (an attempt's last write).
        """
        record.updated = time.time()
        ok = self._fenced_set(
            keys=[self._key(record.spawn_id), self.lease_key(record.spawn_id)],
            args=[record.model_dump_json(), token, self.retention, "1" if release else "0"],
        )
        if not ok:
            raise LeaseLost(record.spawn_id)
        if record.finished:
            self.r.srem(self.active_key, record.spawn_id)

    def save_unfenced(self, record: SpawnRecord) -> None:
        """For writes by the caller side while no worker holds the spawn (decisions, cancel)."""
        record.updated = time.time()
        self.r.set(self._key(record.spawn_id), record.model_dump_json(), ex=self.retention)

    def acquire(self, spawn_id: str, ttl_ms: int) -> str | None:
        token = uuid.uuid4().hex
        if self.r.set(self.lease_key(spawn_id), token, nx=True, px=ttl_ms):
            return token
        return None

    def renew(self, spawn_id: str, token: str, ttl_ms: int) -> bool:
        return bool(self._renew(keys=[self.lease_key(spawn_id)], args=[token, ttl_ms]))

    def release(self, spawn_id: str, token: str) -> None:
        self._release(keys=[self.lease_key(spawn_id)], args=[token])

    def leased(self, spawn_id: str) -> bool:
        return bool(self.r.exists(self.lease_key(spawn_id)))

    def active(self) -> list[str]:
        return sorted(
            m.decode() if isinstance(m, bytes) else m for m in self.r.smembers(self.active_key)
        )

    def request_cancel(self, spawn_id: str) -> None:
        self.r.set(f"{self.prefix}cancel:{spawn_id}", "1", ex=self.retention)

    def cancel_requested(self, spawn_id: str) -> bool:
        return bool(self.r.exists(f"{self.prefix}cancel:{spawn_id}"))
