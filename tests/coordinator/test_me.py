"""What the console asks the API about its caller: who they are (``GET /api/v1/me``), the tool
bag a persona gets for a role (``GET /api/v1/skills?role=``), and whether a persona can be
edited (``editable`` and ``read_only_reason`` of ``GET /api/v1/agents``).

The real app, in-process (TestClient), on a Redis database claimed for this run (the integration
suite's lock files) and a SQLite file.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))


from coordinator.api import create_app  # noqa: E402
from registry.settings import Settings, TokenGrant, token_digest  # noqa: E402

#: alice administers (every permission), dave operates (approves), bob views.
TOKENS = {
    "alice": ("me-alice-admin-token-00001", "admin"),
    "dave": ("me-dave-operator-token-004", "operator"),
    "bob": ("me-bob-viewer-token-000002", "viewer"),
}
DISK_PERSONA = (
    "---\nname: disk_doctor\ndescription: Disks.\nwhen_to_use: When a disk fills up.\n"
    "tools: [host_*, query_promql]\n---\n# Disk doctor\n"
)


@pytest.fixture(scope="module")
def redis_url(claimed_redis_url: str) -> str:
    return claimed_redis_url


@pytest.fixture
def agents_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "agents"
    folder.mkdir()
    (folder / "disk_doctor.md").write_text(DISK_PERSONA, encoding="utf-8")
    return folder


@pytest.fixture
def client(tmp_path: Path, agents_dir: Path, redis_url: str) -> Iterator[TestClient]:
    settings = Settings(
        agents_dir=agents_dir,
        marketplace_root=tmp_path / "marketplace",
        redis_url=redis_url,
        database_url=f"sqlite:///{tmp_path / 'ongrid.db'}",
        data_dir=tmp_path / ".ongrid",
        token_grants={token_digest(t): TokenGrant(user=u, role=r) for u, (t, r) in TOKENS.items()},
    )
    with TestClient(create_app(settings, console_dist=tmp_path / "no-console")) as made:
        yield made


def as_user(user: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[user][0]}"}


def error_of(response: Any) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}, body
    return body["error"]  # type: ignore[no-any-return]


# -- who am I ----------------------------------------------------------------------------------


def test_me_names_the_user_role_permissions_and_the_roles_they_may_look_at(client: TestClient):
    admin = client.get("/api/v1/me", headers=as_user("alice"))
    assert admin.status_code == 200, admin.text
    assert admin.json() == {
        "user": "alice",
        "role": "admin",
        "permissions": {
            "edit_personas": True,
            "approve": True,
            "audit": True,
            "manage_plugins": True,
            "tools": ["*"],
        },
        "roles": ["admin", "operator", "viewer"],  # an editor sees every role's bag
    }
    viewer = client.get("/api/v1/me", headers=as_user("bob")).json()
    assert viewer["user"] == "bob" and viewer["role"] == "viewer"
    assert viewer["permissions"]["edit_personas"] is False
    assert viewer["permissions"]["approve"] is False and viewer["permissions"]["audit"] is False
    assert "host_probe" in viewer["permissions"]["tools"] and "*" not in viewer["permissions"]
    assert viewer["roles"] == ["viewer"]  # only their own
    operator = client.get("/api/v1/me", headers=as_user("dave")).json()
    assert operator["permissions"]["approve"] is True and operator["roles"] == ["operator"]


def test_me_needs_a_token(client: TestClient):
    missing = client.get("/api/v1/me")
    assert missing.status_code == 401 and error_of(missing)["code"] == "unauthorized"
    wrong = client.get("/api/v1/me", headers={"Authorization": "Bearer nobody-has-this-token"})
    assert wrong.status_code == 401 and error_of(wrong)["message"] == "invalid token"


# -- a role's tool bag -------------------------------------------------------------------------


def test_the_callers_own_role_is_the_default_and_may_be_named(client: TestClient):
    own = client.get("/api/v1/skills", params={"agent": "disk_doctor"}, headers=as_user("bob"))
    assert own.status_code == 200, own.text
    named = client.get(
        "/api/v1/skills", params={"agent": "disk_doctor", "role": "viewer"}, headers=as_user("bob")
    )
    assert named.status_code == 200 and named.json() == own.json()
    assert own.json()["role"] == "viewer"
    tools = {t["name"] for t in own.json()["tools"]}
    assert tools == {"host_probe", "query_promql"}  # the viewer's role has no host_bash
    dropped = {d["name"]: d["reason"] for d in own.json()["dropped"]}
    assert "'viewer'" in dropped["host_bash"]


def test_an_editor_sees_another_roles_bag_and_catalog(client: TestClient):
    params = {"agent": "disk_doctor", "role": "viewer"}
    bag = client.get("/api/v1/skills", params=params, headers=as_user("alice"))
    assert bag.status_code == 200, bag.text
    assert bag.json()["role"] == "viewer" and bag.json()["agent"] == "disk_doctor"
    assert {t["name"] for t in bag.json()["tools"]} == {"host_probe", "query_promql"}
    own = client.get("/api/v1/skills", params={"agent": "disk_doctor"}, headers=as_user("alice"))
    assert own.json()["role"] == "admin"
    assert "host_bash" in {t["name"] for t in own.json()["tools"]}

    catalog = client.get("/api/v1/skills", params={"role": "viewer"}, headers=as_user("alice"))
    assert catalog.status_code == 200 and catalog.json()["role"] == "viewer"
    assert catalog.json()["agent"] is None
    names = {t["name"] for t in catalog.json()["tools"]}
    assert "host_probe" in names and "bash" not in names
    viewer_own = client.get("/api/v1/skills", headers=as_user("bob")).json()
    assert catalog.json() == viewer_own


def test_another_role_without_edit_personas_is_403_and_an_unknown_one_404(client: TestClient):
    for params in ({"agent": "disk_doctor", "role": "admin"}, {"role": "admin"}):
        refused = client.get("/api/v1/skills", params=params, headers=as_user("dave"))
        assert refused.status_code == 403, refused.text
        message = error_of(refused)["message"]
        assert "'operator'" in message and "'admin'" in message and "edit_personas" in message
    # Not even whether the role exists: a role that is not theirs is refused first.
    unknown_to_them = client.get("/api/v1/skills", params={"role": "x"}, headers=as_user("dave"))
    assert unknown_to_them.status_code == 403
    unknown = client.get("/api/v1/skills", params={"role": "auditor"}, headers=as_user("alice"))
    assert unknown.status_code == 404, unknown.text
    error = error_of(unknown)
    assert error["code"] == "not_found" and "auditor" in error["message"]
    assert error["details"]["choices"] == ["admin", "operator", "viewer"]


# -- editable or read-only ---------------------------------------------------------------------


def _agent(client: TestClient, name: str) -> dict[str, Any]:
    found = client.get(f"/api/v1/agents/{name}", headers=as_user("alice"))
    assert found.status_code == 200, found.text
    return found.json()  # type: ignore[no-any-return]


def _refusals(client: TestClient, name: str) -> set[str]:
    """The messages a PATCH and a DELETE of ``name`` are refused with (409 each)."""
    headers = as_user("alice")
    patched = client.patch(f"/v1/agents/custom/{name}", json={"description": "x"}, headers=headers)
    deleted = client.delete(f"/v1/agents/custom/{name}", headers=headers)
    for response in (patched, deleted):
        assert response.status_code == 409, response.text
        assert error_of(response)["code"] == "read_only"
    return {error_of(patched)["message"], error_of(deleted)["message"]}


def test_builtin_and_disk_personas_say_why_they_are_read_only(client: TestClient, agents_dir: Path):
    for name, words in (
        ("generalist", "is builtin"),
        ("disk_doctor", f"is a disk persona ({agents_dir / 'disk_doctor.md'})"),
        ("disk_specialist", "is shipped with the runtime ("),  # from the package's agents
    ):
        agent = _agent(client, name)
        assert agent["editable"] is False, name
        reason = agent["read_only_reason"]
        assert words in reason and "save a user persona with the same name" in reason
        assert _refusals(client, name) == {reason}, name  # the 409 says the very same
    listed = client.get("/api/v1/agents", headers=as_user("bob")).json()
    assert all(a["editable"] is (a["read_only_reason"] is None) for a in listed)


def test_a_user_persona_is_editable_and_so_is_one_that_shadows_a_builtin(client: TestClient):
    headers = as_user("alice")
    for name in ("my_helper", "generalist"):
        body = {
            "name": name,
            "description": "Mine.",
            "when_to_use": "When I ask.",
            "body": f"# {name}\n",
        }
        created = client.post("/v1/agents/custom", json=body, headers=headers)
        assert created.status_code == 201, created.text
        assert (created.json()["editable"], created.json()["read_only_reason"]) == (True, None)
        agent = _agent(client, name)
        assert (agent["source"], agent["editable"], agent["read_only_reason"]) == (
            "user",
            True,
            None,
        )
    assert client.delete("/v1/agents/custom/generalist", headers=headers).status_code == 204
    assert _agent(client, "generalist")["editable"] is False  # the builtin is back
