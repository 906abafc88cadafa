"""Bearer-token authentication and the permissions a role carries.

Tokens live in the settings only as SHA-256 digests. A presented token is hashed and compared with
every known digest using :func:`hmac.compare_digest`, without stopping at the first match, so the
time taken does not depend on which token (or how much of one) was right. Tokens are never logged.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from registry.errors import OngridError
from registry.settings import RoleConfig, Settings, token_digest

__all__ = ["Forbidden", "Principal", "Unauthorized", "authenticate", "require"]


class Unauthorized(OngridError):
    """No token, a malformed header, or a token nobody was given (HTTP 401)."""


class Forbidden(OngridError):
    """A known user whose role may not do this (HTTP 403)."""


@dataclass(frozen=True)
class Principal:
    user: str
    role: str
    permissions: RoleConfig


def _bearer(header: str | None) -> str:
    if not header:
        raise Unauthorized("missing Authorization header: send 'Authorization: Bearer <token>'")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("malformed Authorization header: expected 'Bearer <token>'")
    return token.strip()


def authenticate(settings: Settings, header: str | None) -> Principal:
    """The user and role behind an ``Authorization`` header, or :class:`Unauthorized`."""
    presented = token_digest(_bearer(header))
    found = None
    for digest, grant in settings.token_grants.items():
        if hmac.compare_digest(presented, digest):
            found = grant  # keep looping: constant work whichever entry matches
    if found is None:
        raise Unauthorized("invalid token")
    return Principal(found.user, found.role, settings.roles[found.role])


def require(principal: Principal, permission: str) -> None:
    """Raise :class:`Forbidden` unless the principal's role grants ``permission``."""
    if not getattr(principal.permissions, permission):
        raise Forbidden(
            f"role {principal.role!r} may not {permission.replace('_', ' ')} "
            f"(needs a role with {permission}: true)"
        )
