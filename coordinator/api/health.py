"""Liveness and readiness probes; no token needed."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from coordinator.api.deps import Services, Svc
from coordinator.api.schemas import HealthOut, ReadyOut
from coordinator.storage.engine import DatabaseUnavailable

__all__ = ["router"]

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=HealthOut)
async def healthz() -> HealthOut:
    """The process is up and serving (checks nothing else)."""
    return HealthOut()


def _checks(svc: Services) -> dict[str, str]:
    checks: dict[str, str] = {}
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
    return checks


@router.get(
    "/readyz",
    response_model=ReadyOut,
    responses={
        503: {"model": ReadyOut, "description": "A dependency is down; `checks` says which."}
    },
)
async def readyz(svc: Svc) -> JSONResponse:
    """Ready when Redis answers PING and the database answers (and is migrated)."""
    checks = await run_in_threadpool(_checks, svc)
    ok = all(value == "ok" for value in checks.values())
    body = ReadyOut(status="ok" if ok else "unavailable", checks=checks)
    return JSONResponse(body.model_dump(), status_code=200 if ok else 503)
