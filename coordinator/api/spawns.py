"""One spawn: its transcript (the tile's "open transcript") and decisions on its tool calls.

Who may see a spawn: its owner and the owner's approvers (``approvers`` in the settings). Every
spawn a caller may not see answers the same 404 as one that does not exist, whatever its state,
so nothing (not even the call ids it waits on) leaks to someone who guesses an id.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from coordinator.api.deps import Approver, Caller, Svc
from coordinator.api.errors import Conflict
from coordinator.api.schemas import (
    DecisionIn,
    DecisionOut,
    ErrorOut,
    PendingApprovalOut,
    TranscriptOut,
)
from coordinator.auth import Principal
from registry.errors import NotFoundError
from workers.messages import ToolCall, Usage
from workers.spawns import AlreadyDecided, NotWaiting, SpawnRecord

__all__ = ["approvals_router", "router", "visible_spawn"]

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
                "missing_context",
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


def visible_spawn(svc: Svc, spawn_id: str, who: Principal) -> SpawnRecord:
    """The spawn, if ``who`` may see it; otherwise the 404 of a spawn that does not exist."""
    record = svc.client.store.get(spawn_id)
    if record is None or who.user not in svc.settings.approvers_of(record.user):
        raise NotFoundError("spawn", spawn_id)
    return record


@router.get("/{spawn_id}", response_model=TranscriptOut)
def transcript(spawn_id: str, who: Caller, svc: Svc) -> dict[str, Any]:
    """Messages, tool calls and results, usage per model call and in total, status."""
    return _transcript(visible_spawn(svc, spawn_id, who))


@router.post("/{spawn_id}/decisions", response_model=DecisionOut)
def decide(spawn_id: str, body: DecisionIn, who: Approver, svc: Svc) -> DecisionOut:
    """Approve or deny a tool call that waits for confirmation; the spawn resumes once the call
    is settled (denied, or approved by as many people as it needs).

    Only the spawn's owner and the owner's approvers may decide, with a role that may approve.
    Concurrent decisions are each recorded or refused, never lost. When two people settle one
    call at the same instant, the first decision stands and the other gets 409
    ``already_decided`` naming who decided.
    """
    visible_spawn(svc, spawn_id, who)
    try:
        record = svc.client.decide(spawn_id, body.call_id, who.user, body.approve)
    except NotWaiting as exc:
        waiting: dict[str, Any] = {"status": exc.status, "waiting_on": exc.waiting_on}
        raise Conflict(str(exc), waiting, code="not_waiting") from None
    except AlreadyDecided as exc:
        decided: dict[str, Any] = {"decision": exc.decision, "decided_by": exc.decided_by}
        raise Conflict(str(exc), decided, code="already_decided") from None
    call = _pending_call(record, body.call_id)
    approvals = record.state.approvals if record.state else {}
    return DecisionOut(spawn_id=spawn_id, status=record.status, approvals=approvals, call=call)


def _pending_call(record: SpawnRecord, call_id: str) -> ToolCall:
    """The call a decision is about, as the model asked for it (its arguments included)."""
    state = record.state
    found = next((c for c in state.pending if c.id == call_id), None) if state else None
    if found is None:
        raise Conflict(
            f"spawn {record.spawn_id} has no pending call {call_id!r}", code="not_waiting"
        )
    return found


approvals_router = APIRouter(prefix="/api/v1/approvals", tags=["spawns"], responses=_ERRORS)


@approvals_router.get("", response_model=list[PendingApprovalOut])
def pending_approvals(who: Caller, svc: Svc) -> list[dict[str, Any]]:
    """The tool calls waiting for a decision that the caller may see, with their arguments."""
    out: list[dict[str, Any]] = []
    store = svc.client.store
    for spawn_id in store.active():
        record = store.get(spawn_id)
        if record is None or record.status != "waiting" or record.state is None:
            continue
        if who.user not in svc.settings.approvers_of(record.user):
            continue
        for call in record.state.pending:
            approval = record.state.approvals.get(call.id)
            if approval is None or approval.denied_by is not None:
                continue
            out.append(
                {
                    "spawn_id": record.spawn_id,
                    "session_id": record.session_id,
                    "owner": record.user,
                    "persona": record.persona,
                    "call": call,
                    "approved_by": approval.approved_by,
                }
            )
    return out
