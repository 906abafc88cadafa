"""The tools a role may see (SPEC §4 step 1), or one persona's resolved bag for a role.

A caller sees their own role's view; another role's only with ``edit_personas`` (an editor
writes personas for every role and needs to see what each gets).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from coordinator.api.deps import Caller, Svc
from coordinator.api.schemas import ErrorOut, SkillsOut
from coordinator.auth import Forbidden, Principal
from registry.errors import NotFoundError
from registry.policy import matches_any, resolve_bag
from registry.settings import Settings
from registry.tools import AGENT_TOOL_NAME

__all__ = ["router"]

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut} for code in (400, 401, 403, 404, 422, 503)
}

router = APIRouter(tags=["skills"], responses=_ERRORS)


def _viewed_role(who: Principal, settings: Settings, asked: str | None) -> str:
    """The role whose view is asked for: the caller's own, or another for an editor."""
    if asked is None or asked == who.role:
        return who.role
    if not who.permissions.edit_personas:
        raise Forbidden(
            f"role {who.role!r} may see only its own tools, not role {asked!r}'s "
            "(another role's view needs a role with edit_personas: true)"
        )
    if asked not in settings.roles:
        raise NotFoundError("role", asked, list(settings.roles))
    return asked


@router.get("/api/v1/skills", response_model=SkillsOut)
def skills(
    who: Caller,
    svc: Svc,
    agent: Annotated[
        str | None, Query(description="A persona: list its resolved bag instead.")
    ] = None,
    role: Annotated[
        str | None,
        Query(
            description="The role whose view to list (default: the caller's). Another role "
            "needs `edit_personas` (403 otherwise); an unknown one is 404 naming the roles."
        ),
    ] = None,
) -> dict[str, Any]:
    """The tool catalog a role sees, with each tool's class; with `agent`, that persona's bag
    for the role, with the confirmation each tool needs."""
    viewed = _viewed_role(who, svc.settings, role)
    patterns = svc.settings.roles[viewed].tools
    snapshot = svc.snapshot()
    catalog = svc.catalog_for(snapshot)
    if agent is None:
        tools = [
            t.describe()
            for t in catalog
            if t.name != AGENT_TOOL_NAME and matches_any(t.name, patterns)
        ]
        return {"role": viewed, "agent": None, "tools": tools, "dropped": []}
    persona = snapshot.get(agent)
    bag = resolve_bag(persona, catalog, patterns, role=viewed)
    return {
        "role": viewed,
        "agent": persona.name,
        "tools": [entry.describe() for entry in bag],
        "dropped": [{"name": d.name, "reason": d.reason} for d in bag.dropped],
    }
