"""A turn's final answer in the session history.

A user message carries the spawn id of the turn it started. When that spawn has finished, its
answer is stored once as the message after it: by the stream that sees the turn's
``task_notification``, or, for a client that never read the stream, lazily by the next
``GET`` of the history. A short Redis lock per spawn makes the two paths (in any API process)
store it exactly once.
"""

from __future__ import annotations

from contextlib import suppress

from redis.exceptions import LockError

from coordinator.storage.chats import ChatMessage, ChatStore
from workers.spawns import SpawnRecord, SpawnStore

__all__ = ["in_turn_order", "settle", "settle_all"]

#: How long one process may hold the lock of a spawn's answer (seconds).
LOCK_SECONDS = 10.0


def _answer(record: SpawnRecord) -> tuple[str, str]:
    """(role, content) of a finished spawn: its answer, or what ended it."""
    if record.status == "ok":
        return "assistant", record.result
    return "system", f"{record.persona} ended {record.status}: {record.error or record.result}"


def settle(chats: ChatStore, spawns: SpawnStore, session_id: str, spawn_id: str) -> bool:
    """Store the answer of turn ``spawn_id`` if it has finished and is not stored yet.
    Returns True when this call stored it."""
    record = spawns.get(spawn_id)
    if record is None or not record.finished or record.session_id != session_id:
        return False
    lock = spawns.r.lock(
        f"{spawns.prefix}answer-lock:{spawn_id}",
        timeout=LOCK_SECONDS,
        blocking_timeout=LOCK_SECONDS / 2,
    )
    if not lock.acquire():
        return False
    try:
        linked = [m for m in chats.messages(session_id) if m.spawn_id == spawn_id]
        is_turn = any(m.role == "user" for m in linked)
        if not is_turn or any(m.role != "user" for m in linked):
            return False
        role, content = _answer(record)
        chats.add_message(session_id, role, content, agent=record.persona, spawn_id=spawn_id)
        return True
    finally:
        # Held past its timeout: another process may hold it now, which is harmless.
        with suppress(LockError):
            lock.release()


def settle_all(chats: ChatStore, spawns: SpawnStore, session_id: str) -> None:
    """Store the answers of every finished turn of the session that has none yet."""
    messages = chats.messages(session_id)
    answered = {m.spawn_id for m in messages if m.role != "user"}
    for message in messages:
        if message.role == "user" and message.spawn_id and message.spawn_id not in answered:
            settle(chats, spawns, session_id, message.spawn_id)


def in_turn_order(messages: list[ChatMessage]) -> list[ChatMessage]:
    """Each question followed by its answer, even when an answer was stored late."""
    question = {m.spawn_id: m.id for m in messages if m.role == "user" and m.spawn_id}

    def key(message: ChatMessage) -> tuple[int, int]:
        if message.role != "user" and message.spawn_id in question:
            return question[message.spawn_id], message.id
        return message.id, -1

    return sorted(messages, key=key)
