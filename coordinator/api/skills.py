"""The tools a caller may see (SPEC §4 step 1), or one persona's resolved bag."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from coordinator.api.deps import Caller, Svc
from coordinator.api.schemas import ErrorOut, SkillsOut
from registry.policy import matches_any, resolve_bag
from registry.tools import AGENT_TOOL_NAME

__all__ = ["router"]

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut} for code in (400, 401, 404, 422, 503)
}

router = APIRouter(tags=["skills"], responses=_ERRORS)


@router.get("/api/v1/skills", response_model=SkillsOut)
def skills(
    who: Caller,
    svc: Svc,
    agent: Annotated[
        str | None, Query(description="A persona: list its resolved bag instead.")
    ] = None,
) -> dict[str, Any]:
    """The tool catalog the caller's role sees, with each tool's class; with `agent`, that
    persona's bag for this role, with the confirmation each tool needs."""
    patterns = who.permissions.tools
    if agent is None:
        tools = [
            t.describe()
            for t in svc.catalog
            if t.name != AGENT_TOOL_NAME and matches_any(t.name, patterns)
        ]
        return {"role": who.role, "agent": None, "tools": tools, "dropped": []}
    persona = svc.snapshot().get(agent)
    bag = resolve_bag(persona, svc.catalog, patterns, role=who.role)
    return {
        "role": who.role,
        "agent": persona.name,
        "tools": [entry.describe() for entry in bag],
        "dropped": [{"name": d.name, "reason": d.reason} for d in bag.dropped],
    }
