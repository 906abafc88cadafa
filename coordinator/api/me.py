"""Who the caller is: ``GET /api/v1/me``, what the console signs in with."""

from __future__ import annotations

from fastapi import APIRouter

from coordinator.api.deps import Caller, Svc
from coordinator.api.schemas import ErrorOut, MeOut, PermissionsOut

__all__ = ["router"]

router = APIRouter(tags=["me"], responses={401: {"model": ErrorOut}})


@router.get("/api/v1/me", response_model=MeOut)
def me(who: Caller, svc: Svc) -> MeOut:
    """The token's user, role and permissions, and the roles the caller may look at: every
    configured role (in configuration order) for a caller who may edit personas, so they can
    see a persona's bag per role; else only their own."""
    granted = who.permissions
    roles = list(svc.settings.roles) if granted.edit_personas else [who.role]
    return MeOut(
        user=who.user,
        role=who.role,
        permissions=PermissionsOut.model_validate(granted, from_attributes=True),
        roles=roles,
    )
