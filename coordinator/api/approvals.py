"""What waits for people: the pending approvals, their live feed, and the audit trail.

- ``GET /api/v1/approvals``: the tool calls waiting for a decision the caller may see (they
  own the spawn or approve for its owner), with the hash a decision must name, the deadline,
  the requester, and the signatures so far;
- ``GET /api/v1/approvals/events``: the approval feed (:mod:`workers.approvals`) as Server-Sent
  Events, for a caller whose role may approve: each ``confirmation_required`` and each
  ``approval_decided`` of the spawns whose owner they approve for, from every session, a
  background spawn's included; resumable with ``Last-Event-ID`` (the feed's own numbering);
- ``GET /api/v1/audit/approvals``: the audit trail (requests, decisions, refusals, expiries),
  for a role with ``audit``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Query
from starlette.concurrency import run_in_threadpool

from coordinator.api._sse import EventStreamResponse, ResumeAfter, UntilIdle, follow
from coordinator.api.deps import Approver, Auditor, Caller, Svc
from coordinator.api.schemas import AuditEntryOut, ErrorOut, PendingApprovalOut
from workers.approvals import FEED
from workers.messages import ApprovalDecided, ConfirmationRequired, Event

__all__ = ["audit_router", "router"]

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut} for code in (401, 403, 404, 422, 429, 503)
}
_SSE_DOC: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Server-Sent Events: `id:` the feed's seq, `event:` "
        "`confirmation_required` or `approval_decided`, `data:` its JSON envelope (with the "
        "spawn's `session_id` and `spawn_id`).",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    }
}

router = APIRouter(prefix="/api/v1/approvals", tags=["approvals"], responses=_ERRORS)
audit_router = APIRouter(prefix="/api/v1/audit", tags=["approvals"], responses=_ERRORS)


@router.get("", response_model=list[PendingApprovalOut])
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
            if approval is None or approval.settled:
                continue
            out.append(
                {
                    "spawn_id": record.spawn_id,
                    "session_id": record.session_id,
                    "owner": record.user,
                    "persona": record.persona,
                    "call": call,
                    "args_hash": approval.args_hash,
                    "requested_by": approval.requested_by,
                    "expires_at": approval.expires_at,
                    "approved_by": approval.approved_by,
                    "needed": approval.needed,
                }
            )
    return out


def _owner(event: Event) -> str | None:
    if isinstance(event, ConfirmationRequired):
        return event.requested_by.user
    if isinstance(event, ApprovalDecided):
        return event.owner
    return None


@router.get("/events", status_code=200, response_class=EventStreamResponse, responses=_SSE_DOC)
async def approval_events(
    who: Approver,
    svc: Svc,
    start: ResumeAfter,
    until_idle: UntilIdle = None,
) -> EventStreamResponse:
    """Requests and decisions of the spawns the caller approves for, then live, until
    disconnect. Without `after` or `Last-Event-ID`, from the start of the feed's retention."""
    slot = svc.limits.streams.take(who.user)  # counted with the caller's other streams
    try:
        await svc.hub.client.ping()  # a 503 naming the cause rather than a mute stream
    except BaseException:
        slot.release()
        raise

    def mine(event: Event) -> bool:
        owner = _owner(event)
        return owner is not None and who.user in svc.settings.approvers_of(owner)

    def stream(stop: asyncio.Event) -> AsyncIterator[bytes]:
        return follow(svc.hub, svc.client.approvals, FEED, start, stop, idle=until_idle, keep=mine)

    return EventStreamResponse(stream, slot=slot)


@audit_router.get("/approvals", response_model=list[AuditEntryOut])
async def approval_audit(
    _who: Auditor,
    svc: Svc,
    spawn_id: Annotated[str | None, Query(max_length=255, description="Only this spawn's.")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[dict[str, Any]]:
    """The newest audit rows, newest first: who requested, approved, denied or was refused
    what (tool, arguments' hash), when, and the outcome; and the requests that expired."""
    await run_in_threadpool(svc.audit_follower.catch_up)  # everything published before now
    rows = await run_in_threadpool(svc.audit.list, spawn_id=spawn_id, limit=limit)
    return [row.as_dict() for row in rows]
