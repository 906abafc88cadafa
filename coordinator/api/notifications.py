"""``GET /api/v1/notifications``: the deliveries of notifications and where each stands.

For people who may read the audit trail (admins): a delivery names whose spawn it is about,
never its body (answers and arguments stay with the spawn). What is configured, and how the
sender delivers, is in :mod:`coordinator.notify`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from starlette.concurrency import run_in_threadpool

from coordinator.api.deps import Auditor, Svc
from coordinator.api.schemas import ErrorOut, NotificationOut

__all__ = ["router"]

router = APIRouter(
    prefix="/api/v1/notifications",
    tags=["notifications"],
    responses={code: {"model": ErrorOut} for code in (401, 403, 422, 503)},
)


@router.get("", response_model=list[NotificationOut])
async def list_notifications(
    _who: Auditor,
    svc: Svc,
    status: Literal["pending", "sent", "failed"] | None = None,
    channel: Annotated[str | None, Query(max_length=255)] = None,
    spawn_id: Annotated[str | None, Query(max_length=255)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[dict[str, Any]]:
    """The newest deliveries, newest first: channel, event, spawn, status, attempts, the
    receiver's last answer and when a pending one is tried next."""
    await run_in_threadpool(svc.database.ensure)
    rows = await run_in_threadpool(
        svc.notifications.list, status=status, channel=channel, spawn_id=spawn_id, limit=limit
    )
    return [row.as_dict() for row in rows]
