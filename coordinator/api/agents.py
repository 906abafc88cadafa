"""Personas: list and read them (every source), edit user personas, reload (SPEC §3, §6).

Builtin and disk personas are read-only here (409 saying why and what to do instead). Saving a
user persona under the name of a builtin or disk one shadows it: that is how a builtin is
overridden; deleting the user persona brings the original back. Every change is broadcast, so
the next spawn on any worker uses it.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from coordinator.api.deps import Caller, Editor, Services, Svc
from coordinator.api.errors import Conflict
from coordinator.api.schemas import (
    AgentChange,
    AgentOut,
    ErrorOut,
    PersonaIn,
    PersonaPatch,
    ReloadOut,
    WarningOut,
)
from coordinator.catalog import COORDINATOR
from registry.errors import FieldProblem, PersonaError
from registry.parser import parse_persona
from registry.persona import Persona, Source
from workers.reload import broadcast_reload

__all__ = ["router"]


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": ErrorOut} for code in (400, 401, 413, 422, 503, *codes)}


router = APIRouter(tags=["agents"])


def _described(svc: Services, name: str) -> dict[str, Any]:
    snap = svc.registry.snapshot()
    return snap.describe(snap.get(name))


def _changed(svc: Services, name: str, notice: str | None = None) -> dict[str, Any]:
    """Tell every worker and API process, then describe the persona as it now stands."""
    version = broadcast_reload(svc.client.redis)
    return {**_described(svc, name), "notice": notice, "registry_version": version}


def _persona_from(body: PersonaIn) -> Persona:
    """Validate like a file: the same checks, and the stored text must read back the same."""
    data = body.model_dump(mode="json", exclude_unset=True)
    text = data.pop("body", "")
    if data.get("name") == COORDINATOR:
        raise PersonaError([FieldProblem("name", f"{COORDINATOR!r} is reserved")])
    persona = Persona.from_dict(data, body=text)
    if parse_persona(persona.to_markdown()).persona != persona:
        raise PersonaError([FieldProblem("", "does not survive being stored; simplify values")])
    return persona


def _stored(svc: Services, name: str) -> bool:
    """Whether the database holds a user persona of that name (even one that no longer loads)."""
    try:
        return svc.users.get(name) is not None
    except PersonaError:
        return True


def _patch_changes(body: PersonaPatch) -> dict[str, Any]:
    """The fields sent; ``null`` means the field's default (a required field cannot be null)."""
    changes = body.model_dump(mode="json", exclude_unset=True)
    for key, value in list(changes.items()):
        field = Persona.model_fields.get(key)
        if value is not None or field is None or key == "body":
            continue
        if field.is_required():
            raise PersonaError([FieldProblem(key, "is required and cannot be null")])
        changes[key] = field.get_default(call_default_factory=True)
    if changes.get("body", "") is None:
        changes["body"] = ""
    return changes


# -- reading -----------------------------------------------------------------------------------


@router.get("/api/v1/agents", response_model=list[AgentOut], responses=_errors())
def list_agents(who: Caller, svc: Svc) -> list[dict[str, Any]]:
    """Every persona with its `source`, availability and what it shadows."""
    snap = svc.snapshot()
    return [snap.describe(snap.personas[name]) for name in snap.names()]


@router.get("/api/v1/agents/warnings", response_model=list[WarningOut], responses=_errors())
def warnings(who: Caller, svc: Svc) -> list[dict[str, str]]:
    """Every load problem: the file (or database row) and why it was not loaded."""
    return [w.as_dict() for w in svc.snapshot().warnings]


@router.post("/api/v1/agents/reload", response_model=ReloadOut, responses=_errors(403))
def reload(who: Editor, svc: Svc) -> ReloadOut:
    """Re-read disk and database here and broadcast the reload to every worker and API."""
    snap = svc.registry.reload()
    version = broadcast_reload(svc.client.redis)
    return ReloadOut(
        registry_version=version, agents=len(snap.personas), warnings=len(snap.warnings)
    )


@router.get("/api/v1/agents/{name}", response_model=AgentOut, responses=_errors(404))
def get_agent(name: str, who: Caller, svc: Svc) -> dict[str, Any]:
    """One persona (404 lists the names that exist)."""
    snap = svc.snapshot()
    return snap.describe(snap.get(name))


# -- editing user personas ---------------------------------------------------------------------


@router.post(
    "/v1/agents/custom", status_code=201, response_model=AgentChange, responses=_errors(403, 409)
)
def create_agent(body: PersonaIn, who: Editor, svc: Svc, response: Response) -> dict[str, Any]:
    """Save a user persona. A builtin or disk persona of that name is shadowed (overridden)."""
    persona = _persona_from(body)
    snap = svc.snapshot()
    existing = snap.personas.get(persona.name)
    if (existing is not None and existing.source is Source.USER) or _stored(svc, persona.name):
        raise Conflict(
            f"agent {persona.name!r} already exists as a user persona: change it with "
            f"PATCH /v1/agents/custom/{persona.name}, or DELETE it first",
            {"name": persona.name},
        )
    svc.registry.replace(persona, who.user)
    notice = None
    if existing is not None:
        where = f" ({existing.path})" if existing.path else ""
        notice = (
            f"shadows the {existing.source} persona {persona.name!r}{where}; delete this user "
            "persona to restore it"
        )
    response.headers["Location"] = f"/api/v1/agents/{persona.name}"
    return _changed(svc, persona.name, notice)


@router.patch(
    "/v1/agents/custom/{name}", response_model=AgentChange, responses=_errors(403, 404, 409)
)
def patch_agent(name: str, body: PersonaPatch, who: Editor, svc: Svc) -> dict[str, Any]:
    """Change fields of a user persona; builtin and disk personas are read-only (409)."""
    svc.snapshot()
    svc.registry.patch(name, _patch_changes(body), who.user)
    return _changed(svc, name)


@router.delete(
    "/v1/agents/custom/{name}",
    status_code=204,
    response_class=Response,
    responses=_errors(403, 404, 409),
)
def delete_agent(name: str, who: Editor, svc: Svc) -> Response:
    """Delete a user persona; a builtin or disk persona it shadowed is visible again."""
    svc.snapshot()
    svc.registry.delete(name)
    broadcast_reload(svc.client.redis)
    return Response(status_code=204)
