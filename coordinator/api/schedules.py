"""Scheduled investigations: list and read them, and (editors) create, change and delete them.

A schedule starts a background spawn of its persona at each due time (``ongrid beat`` sends the
due times, a worker starts the run). Schedules of the config file (``schedules:``) are read-only
here (409 saying so), as builtin personas are. A schedule runs as whoever created it: ``owner``
and ``role`` default to the caller's, and naming another user or role is refused (403).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Query, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from coordinator.api.deps import Caller, Editor, Services, Svc
from coordinator.api.errors import ApiError, Conflict
from coordinator.api.schemas import ErrorOut
from coordinator.auth import Forbidden, Principal
from coordinator.schedules import ScheduleBook
from coordinator.storage.schedules import ScheduleExists, StoredSchedule
from registry.budget import Budget
from registry.errors import NotFoundError, UserError
from registry.schedules import ScheduleSpec, cron_problem

__all__ = ["router"]

router = APIRouter(tags=["schedules"])

_RECENT = 5


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": ErrorOut} for code in (400, 401, 413, 422, 503, *codes)}


class ScheduleIn(BaseModel):
    """A new schedule. Exactly one of `cron` and `interval_seconds`."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Its id: lowercase letters, digits, '-' and '_'.")
    persona: str = Field(description="The persona each run spawns.")
    prompt: str = Field(description="The question each run asks.")
    context: dict[str, Any] = Field(default_factory=dict, description="The spawn context.")
    cron: str | None = Field(default=None, description="Five-field cron expression, UTC.")
    interval_seconds: float | None = Field(default=None, description="Or: every N seconds.")
    owner: str | None = Field(default=None, description="Default and only choice: the caller.")
    role: str | None = Field(default=None, description="Default and only choice: the caller's.")
    budget: Budget | None = Field(default=None, description="Each run's budget.")
    channels: list[str] = Field(default_factory=list, description="Notification channels.")
    enabled: bool = True


class SchedulePatch(BaseModel):
    """Fields to change; the others keep their values. Setting `cron` clears
    `interval_seconds` and the other way round."""

    model_config = ConfigDict(extra="forbid")

    persona: str | None = None
    prompt: str | None = None
    context: dict[str, Any] | None = None
    cron: str | None = None
    interval_seconds: float | None = None
    budget: Budget | None = None
    channels: list[str] | None = None
    enabled: bool | None = None


class RunOut(BaseModel):
    due_at: str
    spawn_id: str | None
    status: str = Field(description="`started`, `skipped` or `failed`.")
    reason: str
    created_at: str
    spawn_status: str | None = Field(
        default=None,
        description="Where a started run's spawn stands (`queued`, `running`, `ok`, `failed`, "
        "…); its answer is on the spawn's page, for those who may see it.",
    )


class ScheduleOut(BaseModel):
    name: str
    persona: str
    prompt: str
    context: dict[str, Any]
    cron: str | None
    interval_seconds: float | None
    owner: str
    role: str
    budget: Budget | None
    channels: list[str]
    enabled: bool
    cadence: str
    source: str = Field(description="`config` (read-only here) or `api`.")
    created_by: str
    created_at: str
    updated_at: str
    next_run_at: str | None = Field(description="Past: due now (the beat is late or down).")
    last_run: RunOut | None
    runs: list[RunOut] = Field(description="The most recent runs, newest first.")


def book(svc: Svc) -> ScheduleBook:
    """The schedules, once the database is reachable and migrated (503 otherwise)."""
    svc.database.ensure()
    return svc.schedules


def _spec(data: dict[str, Any]) -> ScheduleSpec:
    cron = data.get("cron")
    if cron is not None and (problem := cron_problem(" ".join(str(cron).split()))):
        raise UserError(f"cron: {problem}")
    try:
        return ScheduleSpec(**data)
    except ValidationError as exc:
        problems = [
            {
                "field": ".".join(str(p) for p in err["loc"]),
                "message": str(err["msg"]).removeprefix("Value error, "),
            }
            for err in exc.errors()
        ]
        summary = "; ".join(f"{p['field'] or 'body'}: {p['message']}" for p in problems)
        raise ApiError(
            f"invalid schedule: {summary}",
            {"problems": problems},
            status=422,
            code="invalid_schedule",
        ) from None


def _check_refs(svc: Services, spec: ScheduleSpec) -> None:
    svc.snapshot().get(spec.persona)  # 404 naming the personas that exist
    if spec.role and spec.role not in svc.settings.roles:
        raise NotFoundError("role", spec.role, sorted(svc.settings.roles))
    channels = svc.settings.notifications.channels
    if unknown := sorted(set(spec.channels) - set(channels)):
        raise NotFoundError("notification channel", unknown[0], sorted(channels))


def _as_caller(who: Principal, owner: str | None, role: str | None) -> tuple[str, str]:
    for field, given, own in (("owner", owner, who.user), ("role", role, who.role)):
        if given not in (None, own):
            raise Forbidden(
                f"{field} {given!r} is not yours: a schedule of the API runs as the user who "
                f"creates it ({who.user!r}, role {who.role!r}); the config file's name any"
            )
    return who.user, who.role


def _writable(stored: StoredSchedule | None, name: str) -> StoredSchedule:
    if stored is None:
        raise NotFoundError("schedule", name)
    if stored.source == "config":
        raise Conflict(
            f"schedule {name!r} comes from the config file (schedules: in ONGRID_CONFIG); "
            "change it there and restart the API",
            {"name": name},
            code="read_only",
        )
    return stored


Book = Depends(book)


def _with_outcomes(svc: Services, view: dict[str, Any]) -> dict[str, Any]:
    """``view`` with each started run's spawn status (not its answer: that stays on the spawn's
    page, which shows it only to those who may see the owner's work)."""
    records: dict[str, str | None] = {}
    for run in [*view["runs"], *([view["last_run"]] if view["last_run"] else [])]:
        spawn_id = run.get("spawn_id")
        if spawn_id and run["status"] == "started":
            if spawn_id not in records:
                record = svc.client.store.get(spawn_id)
                records[spawn_id] = record.status if record is not None else None
            run["spawn_status"] = records[spawn_id]
    return view


@router.get("/api/v1/schedules", response_model=list[ScheduleOut], responses=_errors())
def list_schedules(who: Caller, svc: Svc, schedules: ScheduleBook = Book) -> list[dict[str, Any]]:
    """Every schedule with its next due time, its last run and its few most recent ones."""
    return [
        _with_outcomes(svc, schedules.view(item, _RECENT).as_dict())
        for item in schedules.store.list()
    ]


@router.get("/api/v1/schedules/{name}", response_model=ScheduleOut, responses=_errors(404))
def get_schedule(
    name: str,
    who: Caller,
    svc: Svc,
    schedules: ScheduleBook = Book,
    runs: int = Query(default=20, ge=1, le=500, description="How many recent runs."),
) -> dict[str, Any]:
    """One schedule with its recent runs (newest first)."""
    stored = schedules.store.get(name)
    if stored is None:
        raise NotFoundError("schedule", name)
    return _with_outcomes(svc, schedules.view(stored, runs).as_dict())


@router.post(
    "/api/v1/schedules",
    status_code=201,
    response_model=ScheduleOut,
    responses=_errors(403, 404, 409),
)
def create_schedule(
    body: ScheduleIn, who: Editor, svc: Svc, response: Response, schedules: ScheduleBook = Book
) -> dict[str, Any]:
    """Add a schedule (409 if one of that name exists) and install it in the beat."""
    data = body.model_dump(exclude_unset=True)
    data["owner"], data["role"] = _as_caller(who, body.owner, body.role)
    spec = _spec(data)
    _check_refs(svc, spec)
    try:
        stored = schedules.store.create(spec, who.user)
    except ScheduleExists as exc:
        raise Conflict(str(exc), {"name": spec.name}) from None
    schedules.sync(spec)
    response.headers["Location"] = f"/api/v1/schedules/{spec.name}"
    return schedules.view(stored, _RECENT).as_dict()


@router.patch(
    "/api/v1/schedules/{name}", response_model=ScheduleOut, responses=_errors(403, 404, 409)
)
def patch_schedule(
    name: str, body: SchedulePatch, who: Editor, svc: Svc, schedules: ScheduleBook = Book
) -> dict[str, Any]:
    """Change fields of a schedule of the API (one of the config file's: 409)."""
    _writable(schedules.store.get(name), name)
    changes = body.model_dump(exclude_unset=True)
    if changes.get("cron") is not None:
        changes.setdefault("interval_seconds", None)
    if changes.get("interval_seconds") is not None:
        changes.setdefault("cron", None)

    def change(current: ScheduleSpec) -> ScheduleSpec:
        spec = _spec({**current.model_dump(), **changes})
        _check_refs(svc, spec)
        return spec

    _before, after = schedules.store.update(name, change)
    schedules.sync(after.spec)
    return schedules.view(after, _RECENT).as_dict()


@router.delete(
    "/api/v1/schedules/{name}",
    status_code=204,
    response_class=Response,
    responses=_errors(403, 404, 409),
)
def delete_schedule(name: str, who: Editor, schedules: ScheduleBook = Book) -> Response:
    """Delete a schedule of the API and its runs; the beat forgets it."""
    _writable(schedules.store.get(name), name)
    schedules.entries.remove(name)
    if not schedules.store.delete(name):
        raise NotFoundError("schedule", name)
    return Response(status_code=204)
