"""One spawn: its transcript (the tile's "open transcript") and decisions on its tool calls."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from coordinator.api.deps import Approver, Caller, Svc
from coordinator.api.errors import Conflict
from coordinator.api.schemas import DecisionIn, DecisionOut, ErrorOut, TranscriptOut
from registry.errors import NotFoundError
from workers.messages import Usage
from workers.spawns import SpawnRecord

__all__ = ["router"]

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut} for code in (400, 401, 403, 404, 409, 413, 422, 503)
}

router = APIRouter(prefix="/api/v1/spawns", tags=["spawns"], responses=_ERRORS)


def _tool_calls(record: SpawnRecord) -> list[dict[str, Any]]:
    """Each tool call the model made, with the result it got back (if any yet)."""
    if record.state is None:
        return []
    results = {
        m.tool_call_id: m.content
        for m in record.state.messages
        if m.role == "tool" and m.tool_call_id
    }
    return [
        {"call_id": c.id, "name": c.name, "arguments": c.arguments, "result": results.get(c.id)}
        for m in record.state.messages
        for c in m.tool_calls
    ]


def _transcript(record: SpawnRecord) -> dict[str, Any]:
    state = record.state
    return {
        **record.model_dump(
            include={
                "spawn_id",
                "session_id",
                "persona",
                "persona_source",
                "status",
                "background",
                "attempts",
                "prompt",
                "context",
                "result",
                "error",
                "created",
                "updated",
            }
        ),
        "model": record.model_id,
        "messages": state.messages if state else [],
        "tool_calls": _tool_calls(record),
        "usage": {
            "total": state.usage if state else Usage(),
            "turns": state.turn_usage if state else [],
        },
        "pending": state.pending if state else [],
        "approvals": state.approvals if state else {},
    }


@router.get("/{spawn_id}", response_model=TranscriptOut)
def transcript(spawn_id: str, who: Caller, svc: Svc) -> dict[str, Any]:
    """Messages, tool calls and results, usage per model call and in total, status."""
    record = svc.client.store.get(spawn_id)
    if record is None or record.user != who.user:  # another user's spawn is not there for you
        raise NotFoundError("spawn", spawn_id)
    return _transcript(record)


@router.post("/{spawn_id}/decisions", response_model=DecisionOut)
def decide(spawn_id: str, body: DecisionIn, who: Approver, svc: Svc) -> DecisionOut:
    """Approve or deny a tool call that waits for confirmation; the spawn then resumes."""
    record = svc.client.store.get(spawn_id)
    if record is None:
        raise NotFoundError("spawn", spawn_id)
    waiting = record.state.approvals if record.state else {}
    if record.status != "waiting" or body.call_id not in waiting:
        raise Conflict(
            f"spawn {spawn_id} is not waiting for a decision on {body.call_id!r}",
            {"status": record.status, "waiting_on": sorted(waiting)},
            code="not_waiting",
        )
    decided = svc.client.decide(spawn_id, body.call_id, who.user, body.approve)
    approvals = decided.state.approvals if decided.state else {}
    return DecisionOut(spawn_id=spawn_id, status=decided.status, approvals=approvals)
