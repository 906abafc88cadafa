"""Liveness and readiness probes; no token needed.

Ready means a chat can be answered: Redis and the database answer, and each of the runtime's
queues has a live consumer (a worker advertising it, :mod:`workers.consumers`). A queue nobody
consumes would take a turn and never run it, so the probe names it and the command to run.

The probe also summarises the fleet (:mod:`coordinator.api.workers`): how many workers report,
and those that lag the cluster's registry or run other personas. That section never makes the
API unready: a worker whose disk personas differ still answers chats.
"""

from __future__ import annotations

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from coordinator.api.deps import Services, Svc
from coordinator.api.schemas import ErrorOut, HealthOut, ReadyOut
from coordinator.api.workers import assess
from coordinator.storage.engine import DatabaseUnavailable
from registry.errors import UserError
from workers.celery_app import QUEUES
from workers.consumers import NoConsumer, live_consumers

__all__ = ["FleetSummaryOut", "QueueOut", "ReadinessOut", "router"]

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=HealthOut)
async def healthz() -> HealthOut:
    """The process is up and serving (checks nothing else)."""
    return HealthOut()


class QueueOut(BaseModel):
    consumers: int = Field(description="Live workers consuming the queue.")
    workers: list[str] = Field(description="Each of them, as `<hostname> pid <pid>`.")


class FleetSummaryOut(BaseModel):
    """The fleet at a glance (``GET /api/v1/workers`` has the whole view); informational."""

    workers: int = Field(default=0, description="Live worker processes that report.")
    consistent: bool = Field(
        default=False, description="No worker and not this API process is flagged."
    )
    flagged: dict[str, list[str]] = Field(
        default_factory=dict, description="Each flagged worker, by member, with its flags."
    )
    api: list[str] = Field(default_factory=list, description="Flags of this API process.")
    error: str | None = Field(default=None, description="Why the fleet could not be read.")


class ReadinessOut(ReadyOut):
    queues: dict[str, QueueOut] = Field(
        default_factory=dict,
        description="Each queue of the runtime with its live consumers (empty while Redis is "
        "down); a queue with none is a failed check of its own name in `checks`.",
    )
    fleet: FleetSummaryOut = Field(
        default_factory=FleetSummaryOut,
        description="Workers that lag or run other personas; never a reason to be unready.",
    )


def _fleet(svc: Services) -> FleetSummaryOut:
    try:
        assessment = assess(svc)
    except Exception as exc:  # noqa: BLE001 - the summary says why, readiness is untouched
        return FleetSummaryOut(error=f"cannot read the fleet: {exc}")
    return FleetSummaryOut(
        workers=len(assessment.workers),
        consistent=assessment.consistent,
        flagged=assessment.flagged,
        api=list(assessment.api_flags),
    )


def _readiness(svc: Services, required: list[str]) -> ReadinessOut:
    checks: dict[str, str] = {}
    queues: dict[str, QueueOut] = {}
    try:
        svc.probe.ping()
        checks["redis"] = "ok"
    except Exception as exc:  # noqa: BLE001 - any failure means "not ready", with why
        checks["redis"] = f"unreachable: {exc}"
    try:
        svc.database.ready()
        checks["database"] = "ok"
    except DatabaseUnavailable as exc:
        checks["database"] = str(exc)
    try:
        found = live_consumers(svc.probe, QUEUES.values(), svc.settings.key_prefix)
    except Exception as exc:  # noqa: BLE001 - as above
        found = {}
        checks.update(dict.fromkeys(QUEUES.values(), f"unknown: cannot read Redis: {exc}"))
    for queue, workers in found.items():
        queues[queue] = QueueOut(consumers=len(workers), workers=workers)
        checks[queue] = "ok" if workers else str(NoConsumer(queue))
    ok = all(value == "ok" for name, value in checks.items() if name not in QUEUES.values())
    ok = ok and all(checks.get(queue) == "ok" for queue in required)
    # Only after Redis answered the bounded ping: reading the fleet goes through clients
    # without that bound, and the probe must answer even when Redis is cut off.
    fleet = (
        _fleet(svc)
        if checks["redis"] == "ok"
        else FleetSummaryOut(error=f"cannot read the fleet: Redis {checks['redis']}")
    )
    return ReadinessOut(
        status="ok" if ok else "unavailable", checks=checks, queues=queues, fleet=fleet
    )


@router.get(
    "/readyz",
    response_model=ReadinessOut,
    responses={
        400: {"model": ErrorOut, "description": "`queues` names a queue that does not exist."},
        503: {
            "model": ReadinessOut,
            "description": "A dependency is down or a queue has no consumer; `checks` says which.",
        },
    },
)
async def readyz(
    svc: Svc,
    queues: str | None = Query(
        default=None,
        description="The queues that must have a live consumer, comma-separated (default: "
        "every queue but the `autoscaled_queues`; empty: none, for an orchestrator that checks "
        "the API alone). Each queue is still listed and checked either way.",
    ),
) -> JSONResponse:
    """Ready when Redis answers PING, the database answers (and is migrated) and every queue
    (or those of `queues`) has a live consumer. The `fleet` section lists workers that lag or
    run other personas; it never turns the answer into 503 (such a worker still answers
    chats)."""
    if queues is None:
        autoscaled = svc.settings.autoscaled_queues
        required = [q for q in QUEUES.values() if q not in autoscaled]
    else:
        required = [q for q in queues.split(",") if q]
    unknown = sorted(set(required) - set(QUEUES.values()))
    if unknown:
        named = ", ".join(repr(q[:40]) for q in unknown[:3])
        raise UserError(f"readyz: unknown queue(s) {named}; known: {', '.join(QUEUES.values())}")
    body = await run_in_threadpool(_readiness, svc, required)
    return JSONResponse(body.model_dump(), status_code=200 if body.status == "ok" else 503)
