"""One spawn: its transcript (the tile's "open transcript") and decisions on its tool calls.

Who may see a spawn: its owner and the owner's approvers (``approvers`` in the settings). Every
spawn a caller may not see answers the same 404 as one that does not exist, whatever its state,
so nothing (not even the call ids it waits on) leaks to someone who guesses an id.

Every decision on an existing spawn goes to the audit trail (``approval_audit``): the ones
taken, and the ones refused with their reason (a role without ``approve``, a caller who may not
see the spawn, and each 409 of :mod:`workers._decisions`). A decision is taken only once the
database has answered (503 otherwise), so only a database lost in the instant between the
decision and its row leaves one unrecorded (logged as an error); a refusal is answered even
while the database is down.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter
from sqlalchemy.exc import SQLAlchemyError

from coordinator.api.deps import Caller, Services, Svc
from coordinator.api.errors import Conflict
from coordinator.api.schemas import DecisionIn, DecisionOut, ErrorOut, TranscriptOut
from coordinator.auth import Forbidden, Principal, require
from coordinator.storage.audit import Action, AuditEntry
from coordinator.storage.columns import utcnow
from coordinator.storage.engine import DatabaseUnavailable
from registry.errors import NotFoundError
from workers.loop import Approval
from workers.messages import ToolCall, Usage
from workers.spawns import DecisionRefused, SpawnRecord

__all__ = ["router", "visible_spawn"]

log = logging.getLogger(__name__)

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
    failed = set(record.state.failed_calls)
    return [
        {
            "call_id": c.id,
            "name": c.name,
            "arguments": c.arguments,
            "result": results.get(c.id),
            "is_error": c.id in failed,
        }
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
                "parent_spawn_id",
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
                "budget",
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
def decide(spawn_id: str, body: DecisionIn, who: Caller, svc: Svc) -> DecisionOut:
    """Approve or deny a tool call that waits for confirmation, naming the `args_hash` of its
    `confirmation_required`; the spawn resumes once the call is settled (denied, or approved by
    as many different people as it needs: a destructive call needs two, in two requests).

    Only the spawn's owner and the owner's approvers may decide, with a role that may approve
    (403 otherwise, saying so). Refused with 409 and a code of its own: `hash_mismatch` (the
    hash of another call or other arguments), `expired` (the request's deadline passed),
    `replayed` (this person decided the call already: a second signature must be someone
    else's), `already_decided` (someone else settled it first; names who), `not_waiting`.
    Concurrent decisions are each recorded or refused, never lost.
    """
    record = svc.client.store.get(spawn_id)
    try:
        require(who, "approve")
    except Forbidden as exc:
        _audit_refusal(svc, record, body, who, "forbidden", str(exc))
        raise
    if record is None or who.user not in svc.settings.approvers_of(record.user):
        why = f"{who.user} is neither the owner of the spawn nor one of the owner's approvers"
        _audit_refusal(svc, record, body, who, "not_found", why)
        raise NotFoundError("spawn", spawn_id)
    svc.database.ensure()  # no decision the audit trail could not record
    try:
        record, settled = svc.client.decide(
            spawn_id, body.call_id, who.user, body.approve, body.args_hash
        )
    except DecisionRefused as exc:
        _audit_refusal(svc, record, body, who, exc.code, str(exc))
        raise Conflict(str(exc), exc.details, code=exc.code) from None
    call = _pending_call(record, body.call_id)
    approvals = record.state.approvals if record.state else {}
    approval = approvals[body.call_id]
    message = _next_step(approval, who.user, body.approve, settled)
    action: Action = "approved" if body.approve else "denied"
    _audit(svc, record, call, approval.args_hash, who, action, message)
    return DecisionOut(
        spawn_id=spawn_id,
        status=record.status,
        approvals=approvals,
        call=call,
        args_hash=approval.args_hash,
        settled=settled,
        approved_by=approval.approved_by,
        needed=approval.needed,
        message=message,
    )


def _next_step(approval: Approval, user: str, approve: bool, settled: bool) -> str:
    if not approve:
        return f"denied by {user}: the spawn resumes and the model is told the call was denied"
    if settled:
        return f"approved by {' and '.join(approval.approved_by)}: the spawn resumes"
    left = approval.needed - len(set(approval.approved_by))
    return f"approved by {user}; {left} more approval from someone else is needed"


def _pending_call(record: SpawnRecord, call_id: str) -> ToolCall:
    """The call a decision is about, as the model asked for it (its arguments included)."""
    state = record.state
    found = next((c for c in state.pending if c.id == call_id), None) if state else None
    if found is None:
        raise Conflict(
            f"spawn {record.spawn_id} has no pending call {call_id!r}", code="not_waiting"
        )
    return found


def _audit(
    svc: Services,
    record: SpawnRecord,
    call: ToolCall | None,
    args_hash: str,
    who: Principal,
    action: Action,
    outcome: str,
) -> None:
    entry = AuditEntry(
        at=utcnow(),
        spawn_id=record.spawn_id,
        session_id=record.session_id,
        call_id=call.id if call is not None else "",
        tool=call.name if call is not None else "",
        args_hash=args_hash,
        actor=who.user,
        role=who.role,
        action=action,
        outcome=outcome,
    )
    try:
        svc.audit.add(entry)
    except (DatabaseUnavailable, SQLAlchemyError) as exc:
        log.error("audit: could not record %s of %s by %s: %s", action, call, who.user, exc)


def _audit_refusal(
    svc: Services,
    record: SpawnRecord | None,
    body: DecisionIn,
    who: Principal,
    code: str,
    reason: str,
) -> None:
    """Record a refused decision on an existing spawn (the hash as the caller sent it)."""
    if record is None:
        return  # nothing to decide on: not an event of any spawn
    state = record.state
    made = [*state.pending, *(c for m in state.messages for c in m.tool_calls)] if state else []
    call = next((c for c in made if c.id == body.call_id), ToolCall(id=body.call_id, name=""))
    try:
        svc.database.ensure()
    except DatabaseUnavailable as exc:
        log.error("audit: could not record a refused decision by %s: %s", who.user, exc)
        return
    _audit(svc, record, call, body.args_hash, who, "refused", f"{code}: {reason}")
