"""Personas: list and read them (every source), edit user personas, reload (SPEC §3, §6).

Builtin and disk personas are read-only here (409 saying why and what to do instead). Saving a
user persona under the name of a builtin or disk one shadows it: that is how a builtin is
overridden; deleting the user persona brings the original back. Every change is broadcast, so
the next spawn on any worker uses it.

Concurrent edits are settled by the database (:mod:`coordinator.storage.personas`): of several
creates of one name exactly one gets 201 and the others 409; concurrent PATCHes each apply their
fields to what the others left (none is lost; for one field the later write wins); of concurrent
DELETEs one gets 204 and the others 404.
"""

from __future__ import annotations

from typing import Any

import redis
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
from coordinator.storage.personas import PersonaBusy, PersonaExists
from registry.errors import FieldProblem, NotFoundError, PersonaError
from registry.lint import FindingKind, lint
from registry.parser import dump_persona, parse_persona, read_document
from registry.persona import Persona, Source
from workers.fleet import FleetReport, model_view, read_fleet
from workers.reload import broadcast_reload

__all__ = ["router"]


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": ErrorOut} for code in (400, 401, 413, 422, 503, *codes)}


router = APIRouter(tags=["agents"])


def _described(svc: Services, name: str) -> dict[str, Any]:
    snap = svc.registry.snapshot()
    return snap.describe(snap.get(name))


def _fleet(svc: Services) -> list[FleetReport]:
    """The live workers' reports; none when Redis cannot be read (models then show unchecked)."""
    try:
        return read_fleet(svc.client.redis, svc.settings.key_prefix)
    except redis.RedisError:
        return []


def _with_model(described: dict[str, Any], reports: list[FleetReport]) -> dict[str, Any]:
    """``described`` with the model the workers resolve for it, and its problem if any."""
    view = model_view(reports, described["name"])
    return {
        **described,
        "resolved_model": view.model,
        "model_problem": view.problem,
        "model_checked_by": view.checked_by,
    }


def _changed(svc: Services, name: str, notice: str | None = None) -> dict[str, Any]:
    """Tell every worker and API process, then describe the persona as it now stands."""
    version = broadcast_reload(svc.client.redis, svc.settings.key_prefix)
    described = _with_model(_described(svc, name), _fleet(svc))
    snapshot = svc.registry.snapshot()
    findings = [
        f.as_dict()
        for f in lint(snapshot, svc.catalog_for(snapshot), svc.settings)
        if f.persona == name
    ]
    return {**described, "notice": notice, "registry_version": version, "findings": findings}


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


def _patched(current: Persona, changes: dict[str, Any]) -> Persona:
    """``current`` with ``changes`` applied to its frontmatter and body, validated like a file."""
    data, body, _notes = read_document(dump_persona(current))
    data.update({k: v for k, v in changes.items() if k != "body"})
    if data.get("name") != current.name:
        raise PersonaError([FieldProblem("name", "cannot be changed; create a new persona")])
    return Persona.from_dict(data, body=changes.get("body", body))


# -- reading -----------------------------------------------------------------------------------


@router.get("/api/v1/agents", response_model=list[AgentOut], responses=_errors())
def list_agents(who: Caller, svc: Svc) -> list[dict[str, Any]]:
    """Every persona with its `source`, availability and what it shadows."""
    snap = svc.snapshot()
    reports = _fleet(svc)
    return [_with_model(snap.describe(snap.personas[name]), reports) for name in snap.names()]


@router.get("/api/v1/agents/warnings", response_model=list[WarningOut], responses=_errors())
def warnings(who: Caller, svc: Svc) -> list[dict[str, str]]:
    """Every load problem (`kind` `load`: the file or database row and why it was not loaded),
    then the lint findings of each persona, as `ongrid agents lint` reports them for every role:
    `missing_config` names settings unset on this API process; `model`, a model the live
    workers cannot use (what to set). The `missing_config` findings come last."""
    snapshot = svc.snapshot()
    reports = _fleet(svc)
    problems = {
        name: view.problem
        for name in snapshot.names()
        if (view := model_view(reports, name)).problem
    }
    findings = lint(snapshot, svc.catalog_for(snapshot), svc.settings, model_problems=problems)
    # Settings unset on this process last: a fresh install's many must not bury real problems.
    findings.sort(key=lambda f: f.kind is FindingKind.MISSING_CONFIG)
    return [f.as_dict() for f in findings]


@router.post("/api/v1/agents/reload", response_model=ReloadOut, responses=_errors(403))
def reload(who: Editor, svc: Svc) -> ReloadOut:
    """Re-read disk and database here and broadcast the reload to every worker and API."""
    snap = svc.registry.reload()
    version = broadcast_reload(svc.client.redis, svc.settings.key_prefix)
    return ReloadOut(
        registry_version=version, agents=len(snap.personas), warnings=len(snap.warnings)
    )


@router.get("/api/v1/agents/{name}", response_model=AgentOut, responses=_errors(404))
def get_agent(name: str, who: Caller, svc: Svc) -> dict[str, Any]:
    """One persona (404 lists the names that exist)."""
    snap = svc.snapshot()
    return _with_model(snap.describe(snap.get(name)), _fleet(svc))


# -- editing user personas ---------------------------------------------------------------------


# Canonical under /api/v1 like every other route; the source documents' /v1/agents/custom
# forms are served too, as they are pasted.
@router.post(
    "/api/v1/agents/custom",
    status_code=201,
    response_model=AgentChange,
    responses=_errors(403, 409),
)
@router.post(
    "/v1/agents/custom",
    status_code=201,
    response_model=AgentChange,
    responses=_errors(403, 409),
    include_in_schema=False,
)
def create_agent(body: PersonaIn, who: Editor, svc: Svc, response: Response) -> dict[str, Any]:
    """Save a new user persona (409 if one of that name exists). A builtin or disk persona of
    that name is shadowed (overridden)."""
    persona = _persona_from(body)
    existing = svc.snapshot().personas.get(persona.name)
    try:
        svc.users.create(persona.model_copy(update={"source": Source.USER, "path": None}), who.user)
    except PersonaExists as exc:
        raise Conflict(str(exc), {"name": persona.name}) from None
    svc.registry.reload()
    notice = None
    if existing is not None and existing.source is not Source.USER:
        where = f" ({existing.path})" if existing.path else ""
        notice = (
            f"shadows the {existing.source} persona {persona.name!r}{where}; delete this user "
            "persona to restore it"
        )
    response.headers["Location"] = f"/api/v1/agents/{persona.name}"
    return _changed(svc, persona.name, notice)


@router.patch(
    "/api/v1/agents/custom/{name}", response_model=AgentChange, responses=_errors(403, 404, 409)
)
@router.patch(
    "/v1/agents/custom/{name}",
    response_model=AgentChange,
    responses=_errors(403, 404, 409),
    include_in_schema=False,
)
def patch_agent(name: str, body: PersonaPatch, who: Editor, svc: Svc) -> dict[str, Any]:
    """Change fields of a user persona; builtin and disk personas are read-only (409).

    Applied to the stored row under its lock: concurrent PATCHes wait for each other and
    none overwrites another's fields (409 only if the row stayed locked past the store's lock
    timeout).
    """
    changes = _patch_changes(body)
    persona = svc.snapshot().get(name)  # 404 naming the agents that exist
    if persona.source is not Source.USER:
        # Refused before anything is written, with the message that says how to override it.
        svc.registry.patch(name, changes, who.user)
    try:
        svc.users.update(name, lambda current: _patched(current, changes), who.user)
    except NotFoundError:
        svc.registry.reload()
        raise NotFoundError("agent", name, svc.registry.snapshot().names()) from None
    except PersonaBusy as exc:
        raise Conflict(str(exc), {"name": name}, code="busy") from None
    svc.registry.reload()
    return _changed(svc, name)


@router.delete(
    "/api/v1/agents/custom/{name}",
    status_code=204,
    response_class=Response,
    responses=_errors(403, 404, 409),
)
@router.delete(
    "/v1/agents/custom/{name}",
    status_code=204,
    response_class=Response,
    responses=_errors(403, 404, 409),
    include_in_schema=False,
)
def delete_agent(name: str, who: Editor, svc: Svc) -> Response:
    """Delete a user persona; a builtin or disk persona it shadowed is visible again."""
    svc.snapshot()
    if not svc.users.delete(name):
        # Nothing of that name in the database: a builtin or disk persona is refused (409)
        # and a name that is neither, or one deleted meanwhile, is 404.
        snap = svc.registry.reload()
        if snap.get(name).source is Source.USER:
            raise NotFoundError("agent", name, snap.names())
        svc.registry.delete(name)
    svc.registry.reload()
    broadcast_reload(svc.client.redis, svc.settings.key_prefix)
    return Response(status_code=204)
