"""Bearer tokens: who they speak for, and what a role may do."""

from __future__ import annotations

import pytest

from coordinator.auth import Forbidden, Unauthorized, authenticate, require
from registry.settings import Settings

CONFIG = """\
auth:
  tokens:
    alice-admin-token-000001: {user: alice, role: admin}
    victor-viewer-token-0002: {user: victor, role: viewer}
"""


@pytest.fixture
def settings(tmp_path) -> Settings:
    path = tmp_path / "ongrid.yaml"
    path.write_text(CONFIG)
    return Settings.load(environ={"ONGRID_CONFIG": str(path)})


def test_tokens_map_to_user_and_role(settings):
    alice = authenticate(settings, "Bearer alice-admin-token-000001")
    assert (alice.user, alice.role, alice.permissions.edit_personas) == ("alice", "admin", True)
    victor = authenticate(settings, "bearer   victor-viewer-token-0002 ")
    assert (victor.user, victor.role) == ("victor", "viewer")


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (None, "missing Authorization header"),
        ("", "missing Authorization header"),
        ("Basic YWxpY2U6cHc=", "malformed Authorization header"),
        ("Bearer ", "malformed Authorization header"),
        ("Bearer alice-admin-token-000002", "invalid token"),
        ("Bearer alice-admin-token-00000", "invalid token"),
    ],
)
def test_bad_or_missing_tokens_are_refused_without_echoing_them(settings, header, message):
    with pytest.raises(Unauthorized) as info:
        authenticate(settings, header)
    assert str(info.value).startswith(message)
    assert "alice-admin-token" not in str(info.value)


def test_no_tokens_configured_refuses_everyone():
    with pytest.raises(Unauthorized, match="invalid token"):
        authenticate(Settings.load(environ={}), "Bearer anything-at-all-000000")


def test_role_permissions(settings):
    require(authenticate(settings, "Bearer alice-admin-token-000001"), "edit_personas")
    viewer = authenticate(settings, "Bearer victor-viewer-token-0002")
    with pytest.raises(Forbidden, match="role 'viewer' may not edit personas"):
        require(viewer, "edit_personas")
    with pytest.raises(Forbidden, match="may not approve"):
        require(viewer, "approve")
