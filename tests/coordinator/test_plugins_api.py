"""The marketplace and plugin endpoints, and what an install changes in the rest of the API.

The real app in-process (TestClient) on a Redis database claimed for this module, a SQLite file
and a marketplace root in ``tmp_path`` (``ONGRID_MARKETPLACE_ROOT``); the marketplace is a real
folder whose plugin has a Claude Code agent, a skill and a skill manifest. Only a role with
``manage_plugins`` (admin, by default) may touch the plugin endpoints.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from fastapi.testclient import TestClient
from pydantic import BaseModel

from coordinator.api import create_app
from marketplace.mcp_catalog import McpToolPublisher
from registry.persona import PLUGIN_NAME_RESERVED
from registry.settings import Settings, TokenGrant, token_digest
from registry.tools import BaseTool, ToolClass

#: alice administers, dave operates (approves), bob views.
TOKENS = {
    "alice": ("plugins-alice-admin-token-01", "admin"),
    "dave": ("plugins-dave-operator-tok-04", "operator"),
    "bob": ("plugins-bob-viewer-token-002", "viewer"),
}
MANIFEST = {
    "tools": [
        {
            "name": "restart_unit_skill",
            "description": "Restart one systemd unit.",
            "class": "write",
            "parameters": {
                "type": "object",
                "properties": {"unit": {"type": "string"}},
                "required": ["unit"],
            },
            "run": {"command": "scripts/restart.sh", "interpreter": "sh", "args": ["{unit}"]},
        }
    ]
}
#: Every plugin endpoint, with a body that would be valid for an admin.
ENDPOINTS: list[tuple[str, str, dict[str, Any] | None]] = [
    ("GET", "/api/v1/marketplaces", None),
    ("POST", "/api/v1/marketplaces", {"source": "/nowhere"}),
    ("DELETE", "/api/v1/marketplaces/team", None),
    ("GET", "/api/v1/marketplaces/team/plugins", None),
    ("GET", "/api/v1/plugins", None),
    ("POST", "/api/v1/plugins", {"plugin": "ops@team"}),
    ("POST", "/api/v1/plugins/update", None),
    ("POST", "/api/v1/plugins/ops/update", None),
    ("DELETE", "/api/v1/plugins/ops", None),
]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def write_agent(plugin: Path, name: str, body: str) -> None:
    front = {"name": name, "description": f"Use this agent for {name}.", "tools": "host_probe"}
    write(plugin / "agents" / f"{name}.md", f"---\n{yaml.safe_dump(front)}---\n\n{body}\n")


@pytest.fixture
def market(tmp_path: Path) -> Path:
    """A marketplace folder ``team``: plugin ``ops`` in it, plugin ``remote`` on GitHub."""
    root = tmp_path / "market"
    plugin = root / "plugins" / "ops"
    write(plugin / ".claude-plugin" / "plugin.json", json.dumps({"name": "ops", "version": "1.2"}))
    write_agent(plugin, "x", "You are x.")
    skill = plugin / "skills" / "s"
    write(skill / "SKILL.md", "---\nname: s\ndescription: The s skill.\n---\n# S\n")
    write(skill / "scripts" / "restart.sh", '#!/bin/sh\necho restarted "$1"\n').chmod(0o755)
    write(skill / "ongrid-tools.yaml", json.dumps(MANIFEST))
    entries = [
        {"name": "ops", "source": "./plugins/ops", "description": "Ops tools."},
        {"name": "remote", "source": {"source": "url", "url": "https://github.com/acme/r.git"}},
    ]
    listing = {"name": "team", "owner": {"name": "Ops"}, "plugins": entries}
    write(root / ".claude-plugin" / "marketplace.json", json.dumps(listing))
    return root


@pytest.fixture(scope="module")
def redis_url(claimed_redis_url: str) -> str:
    return claimed_redis_url


@pytest.fixture
def marketplace_root(tmp_path: Path) -> Path:
    return tmp_path / "marketplace"


@pytest.fixture
def client(tmp_path: Path, redis_url: str, marketplace_root: Path) -> Iterator[TestClient]:
    (tmp_path / "agents").mkdir()
    environ = {
        "ONGRID_MARKETPLACE_ROOT": str(marketplace_root),
        "ONGRID_AGENTS_DIR": str(tmp_path / "agents"),
        "ONGRID_SHIPPED_AGENTS": "false",
        "REDIS_URL": redis_url,
        "ONGRID_DATABASE_URL": f"sqlite:///{tmp_path / 'ongrid.db'}",
        "ONGRID_DATA_DIR": str(tmp_path / ".ongrid"),
    }
    grants = {token_digest(t): TokenGrant(user=u, role=r) for u, (t, r) in TOKENS.items()}
    settings = Settings.load(environ).model_copy(update={"token_grants": grants})
    assert settings.marketplace_root == marketplace_root
    with TestClient(create_app(settings, console_dist=tmp_path / "no-console")) as made:
        made.headers["Authorization"] = f"Bearer {TOKENS['alice'][0]}"
        yield made


@pytest.fixture
def installed(client: TestClient, market: Path) -> dict[str, Any]:
    """``team`` added and ``ops`` installed, allowed to confirm writes (its manifest's tool is
    a write tool); the install's response."""
    assert client.post("/api/v1/marketplaces", json={"source": str(market)}).status_code == 201
    body = {"plugin": "ops@team", "allow_mode": "mutating-with-confirm"}
    response = client.post("/api/v1/plugins", json=body)
    assert response.status_code == 201, response.text
    return response.json()  # type: ignore[no-any-return]


def as_user(user: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[user][0]}"}


def error_of(response: Any) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}, body
    return body["error"]  # type: ignore[no-any-return]


def agents_by_name(client: TestClient) -> dict[str, dict[str, Any]]:
    response = client.get("/api/v1/agents")
    assert response.status_code == 200, response.text
    return {a["name"]: a for a in response.json()}


# -- who may --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path", "body"), ENDPOINTS)
def test_viewers_and_operators_may_not_manage_plugins_and_nobody_without_a_token(
    client: TestClient, method: str, path: str, body: dict[str, Any] | None
) -> None:
    for user in ("bob", "dave"):
        refused = client.request(method, path, json=body, headers=as_user(user))
        assert refused.status_code == 403, refused.text
        error = error_of(refused)
        assert error["code"] == "forbidden" and "manage_plugins" in error["message"]
    anonymous = client.request(method, path, json=body, headers={"Authorization": ""})
    assert anonymous.status_code == 401 and error_of(anonymous)["code"] == "unauthorized"


def test_only_the_admin_role_has_manage_plugins_by_default(client: TestClient) -> None:
    assert client.get("/api/v1/me").json()["permissions"]["manage_plugins"] is True
    for user in ("bob", "dave"):
        me = client.get("/api/v1/me", headers=as_user(user)).json()
        assert me["permissions"]["manage_plugins"] is False


# -- marketplaces ---------------------------------------------------------------------------------


def test_adding_and_listing_a_marketplace(client: TestClient, market: Path) -> None:
    added = client.post("/api/v1/marketplaces", json={"source": str(market)})
    assert added.status_code == 201, added.text
    body = added.json()
    assert (body["name"], body["kind"], body["plugins"], body["problems"]) == (
        "team",
        "directory",
        2,
        [],
    )
    assert body["added_by"] == "alice" and body["location"] == str(market.resolve())
    listed = client.get("/api/v1/marketplaces")
    assert listed.status_code == 200
    assert [(m["name"], m["plugins"]) for m in listed.json()] == [("team", 2)]
    # Adding it again reads it again; a name of one's own is another marketplace.
    assert client.post("/api/v1/marketplaces", json={"source": str(market)}).status_code == 201
    renamed = client.post("/api/v1/marketplaces", json={"source": str(market), "name": "mine"})
    assert renamed.status_code == 201 and renamed.json()["name"] == "mine"
    assert [m["name"] for m in client.get("/api/v1/marketplaces").json()] == ["mine", "team"]


def test_a_bad_marketplace_source_is_a_400_naming_the_problem(
    client: TestClient, tmp_path: Path
) -> None:
    missing = client.post("/api/v1/marketplaces", json={"source": str(tmp_path / "nowhere")})
    assert missing.status_code == 400
    message = error_of(missing)["message"]
    assert str(tmp_path / "nowhere") in message and "not found" in message
    plain = tmp_path / "plain"
    plain.mkdir()
    not_a_market = client.post("/api/v1/marketplaces", json={"source": str(plain)})
    assert not_a_market.status_code == 400
    assert "no .claude-plugin/marketplace.json" in error_of(not_a_market)["message"]
    remote = client.post("/api/v1/marketplaces", json={"source": "https://github.com/a/b.git"})
    assert remote.status_code == 400
    assert "network sources are off" in error_of(remote)["message"]
    assert client.get("/api/v1/marketplaces").json() == []


def test_a_marketplace_body_is_checked_before_anything_is_read(
    client: TestClient, market: Path
) -> None:
    unknown = client.post("/api/v1/marketplaces", json={"source": str(market), "url": "x"})
    assert unknown.status_code == 422
    error = error_of(unknown)
    assert error["code"] == "invalid_request"
    assert error["details"]["problems"][0]["field"] == "url"
    assert client.post("/api/v1/marketplaces", json={}).status_code == 422
    assert client.post("/api/v1/marketplaces", json={"source": ""}).status_code == 422
    assert client.get("/api/v1/marketplaces").json() == []


def test_a_marketplaces_plugins_say_whether_they_can_be_installed(
    client: TestClient, market: Path
) -> None:
    client.post("/api/v1/marketplaces", json={"source": str(market)})
    response = client.get("/api/v1/marketplaces/team/plugins")
    assert response.status_code == 200, response.text
    plugins = {p["name"]: p for p in response.json()}
    assert plugins["ops"]["reachable"] is True and plugins["ops"]["unreachable_reason"] is None
    assert plugins["ops"]["installed"] is None and plugins["ops"]["description"] == "Ops tools."
    remote = plugins["remote"]
    assert remote["reachable"] is False
    assert "https://github.com/acme/r.git" in remote["unreachable_reason"]
    assert "plugins_allow_network" in remote["unreachable_reason"]
    unknown = client.get("/api/v1/marketplaces/nope/plugins")
    assert unknown.status_code == 404 and error_of(unknown)["details"]["choices"] == ["team"]


# -- plugins ---------------------------------------------------------------------------------------


def test_installing_twice_is_201_then_200_unchanged(
    client: TestClient, installed: dict[str, Any], marketplace_root: Path
) -> None:
    assert installed["changed"] is True and installed["name"] == "ops"
    assert installed["agents"] == ["ops:x"] and installed["skills"] == ["ops:s"]
    assert installed["tools"] == ["ops__restart_unit_skill"]
    assert installed["installed_by"] == "alice"
    assert installed["allowed_mode"] == "mutating-with-confirm"
    assert (installed["network"], installed["writable"]) == (False, False)
    assert any(g.startswith("no network") for g in installed["grants"]), installed["grants"]
    assert Path(installed["path"]).parent == marketplace_root / "plugins" / "ops"
    again = client.post(
        "/api/v1/plugins", json={"plugin": "ops@team", "allow_mode": "mutating-with-confirm"}
    )
    assert again.status_code == 200, again.text
    assert again.json()["changed"] is False
    assert again.json()["content_hash"] == installed["content_hash"]
    listed = client.get("/api/v1/marketplaces/team/plugins").json()
    assert next(p for p in listed if p["name"] == "ops")["installed"] == "1.2"


def test_the_installed_plugins_show_their_agents_and_skills(
    client: TestClient, installed: dict[str, Any]
) -> None:
    response = client.get("/api/v1/plugins")
    assert response.status_code == 200
    (plugin,) = response.json()
    assert plugin["name"] == "ops" and plugin["marketplace"] == "team"
    assert plugin["agents"] == ["ops:x"] and plugin["skills"] == ["ops:s"]
    assert plugin["tools"] == ["ops__restart_unit_skill"] and plugin["version"] == "1.2"
    assert plugin["content_hash"] == installed["content_hash"] and plugin["error"] is None


def test_a_read_only_install_leaves_out_the_tools_above_read_and_says_why(
    client: TestClient, market: Path
) -> None:
    assert client.post("/api/v1/marketplaces", json={"source": str(market)}).status_code == 201
    response = client.post("/api/v1/plugins", json={"plugin": "ops@team", "network": True})
    assert response.status_code == 201, response.text
    plugin = response.json()
    assert plugin["tools"] == [] and plugin["allowed_mode"] == "read-only"
    assert plugin["network"] is True
    assert any(g.startswith("network: ") and "egress proxy" in g for g in plugin["grants"])
    (why,) = [w for w in plugin["warnings"] if "ops__restart_unit_skill" in w]
    assert "its class write is more than the install allows (allowed mode read-only)" in why
    warnings = client.get("/api/v1/agents/warnings").json()
    assert any("ops__restart_unit_skill" in w["reason"] for w in warnings), warnings
    names = {t["name"] for t in client.get("/api/v1/skills").json()["tools"]}
    assert not any(n.endswith("restart_unit_skill") for n in names)
    assert client.get("/api/v1/plugins").json()[0]["network"] is True


def test_an_install_request_is_checked(client: TestClient, market: Path) -> None:
    client.post("/api/v1/marketplaces", json={"source": str(market)})
    mode = client.post("/api/v1/plugins", json={"plugin": "ops@team", "allow_mode": "root"})
    assert mode.status_code == 422 and error_of(mode)["details"]["problems"][0]["field"] == (
        "allow_mode"
    )
    extra = client.post("/api/v1/plugins", json={"plugin": "ops@team", "force": True})
    assert extra.status_code == 422
    malformed = client.post("/api/v1/plugins", json={"plugin": "ops-team"})
    assert malformed.status_code == 400
    assert "expected PLUGIN@MARKETPLACE" in error_of(malformed)["message"]
    unknown = client.post("/api/v1/plugins", json={"plugin": "opz@team"})
    assert unknown.status_code == 404
    assert "ops" in error_of(unknown)["details"]["choices"]
    unreachable = client.post("/api/v1/plugins", json={"plugin": "remote@team"})
    assert unreachable.status_code == 400
    assert "network sources are off" in error_of(unreachable)["message"]
    assert client.get("/api/v1/plugins").json() == []


def test_a_plugin_persona_is_listed_read_only_with_the_plugins_reason(
    client: TestClient, installed: dict[str, Any]
) -> None:
    agent = agents_by_name(client)["ops:x"]
    assert agent["source"] == "plugin" and agent["plugin"] == "ops"
    assert agent["editable"] is False
    assert "plugin 'ops'" in agent["read_only_reason"]
    # It declares no mode: it gets what the install allowed.
    assert agent["skills"] == ["ops:s"] and agent["permission_mode"] == "mutating-with-confirm"
    one = client.get("/api/v1/agents/ops:x")
    assert one.status_code == 200 and one.json()["source"] == "plugin"
    viewer = client.get("/api/v1/agents", headers=as_user("bob")).json()
    assert "ops:x" in {a["name"] for a in viewer}  # everyone sees it; only admins manage it


def test_a_plugin_persona_cannot_be_patched_or_deleted(
    client: TestClient, installed: dict[str, Any]
) -> None:
    patched = client.patch("/v1/agents/custom/ops:x", json={"description": "mine now"})
    assert patched.status_code == 409, patched.text
    assert error_of(patched)["code"] == "read_only"
    assert "plugin 'ops'" in error_of(patched)["message"]
    deleted = client.delete("/v1/agents/custom/ops:x")
    assert deleted.status_code == 409 and error_of(deleted)["code"] == "read_only"
    assert agents_by_name(client)["ops:x"]["description"] == "Use this agent for x."


def test_a_user_persona_may_not_take_the_plugin_name_form(client: TestClient) -> None:
    persona = {"name": "a:b", "description": "D.", "when_to_use": "W.", "body": "B."}
    refused = client.post("/v1/agents/custom", json=persona)
    assert refused.status_code == 422, refused.text
    error = error_of(refused)
    assert error["code"] == "invalid_request"
    assert error["details"]["problems"] == [
        {"in": "body", "field": "name", "message": PLUGIN_NAME_RESERVED}
    ]
    assert "a:b" not in agents_by_name(client)


def test_the_skills_listing_has_the_skill_tools_and_the_manifest_tools(
    client: TestClient, installed: dict[str, Any]
) -> None:
    response = client.get("/api/v1/skills")
    assert response.status_code == 200, response.text
    tools = {t["name"]: t for t in response.json()["tools"]}
    assert tools["load_skill"]["class"] == "read"
    assert tools["read_file_skill"]["class"] == "read"
    assert tools["ops__restart_unit_skill"]["class"] == "write"
    assert tools["ops__restart_unit_skill"]["bundle"] == "ops"
    assert tools["ops__restart_unit_skill"]["description"] == "Restart one systemd unit."
    # The plugin persona's bag: its whitelist, plus the skill tools its skills bring.
    bag = client.get("/api/v1/skills", params={"agent": "ops:x"}).json()
    assert sorted(t["name"] for t in bag["tools"]) == [
        "host_probe",
        "load_skill",
        "read_file_skill",
    ]


def test_a_marketplace_in_use_cannot_be_removed(
    client: TestClient, installed: dict[str, Any]
) -> None:
    refused = client.delete("/api/v1/marketplaces/team")
    assert refused.status_code == 409, refused.text
    assert "ops" in error_of(refused)["message"]
    assert [m["name"] for m in client.get("/api/v1/marketplaces").json()] == ["team"]
    assert client.delete("/api/v1/plugins/ops").status_code == 204
    assert client.delete("/api/v1/marketplaces/team").status_code == 204
    assert client.get("/api/v1/marketplaces").json() == []
    assert client.delete("/api/v1/marketplaces/team").status_code == 404


def test_removing_a_plugin_takes_its_persona_and_tools_away(
    client: TestClient, installed: dict[str, Any], marketplace_root: Path
) -> None:
    removed = client.delete("/api/v1/plugins/ops")
    assert removed.status_code == 204 and removed.content == b""
    assert "ops:x" not in agents_by_name(client)
    names = {t["name"] for t in client.get("/api/v1/skills").json()["tools"]}
    assert "ops__restart_unit_skill" not in names
    assert client.get("/api/v1/plugins").json() == []
    assert sorted(p.name for p in marketplace_root.iterdir()) == [".lock"]
    unknown = client.delete("/api/v1/plugins/ops")
    assert unknown.status_code == 404 and error_of(unknown)["code"] == "not_found"


def test_update_reports_per_plugin_whether_it_changed(
    client: TestClient, installed: dict[str, Any], market: Path
) -> None:
    same = client.post("/api/v1/plugins/ops/update")
    assert same.status_code == 200, same.text
    assert same.json() == [
        {
            "name": "ops",
            "updated": False,
            "version": "1.2",
            "content_hash": installed["content_hash"],
            "error": None,
        }
    ]
    write_agent(market / "plugins" / "ops", "x", "You are the new x.")
    (changed,) = client.post("/api/v1/plugins/ops/update").json()
    assert changed["updated"] is True and changed["content_hash"] != installed["content_hash"]
    assert client.get("/api/v1/agents/ops:x").json()["body"].strip() == "You are the new x."
    (everything,) = client.post("/api/v1/plugins/update").json()
    assert everything["name"] == "ops" and everything["updated"] is False
    unknown = client.post("/api/v1/plugins/nope/update")
    assert unknown.status_code == 404 and error_of(unknown)["details"]["choices"] == ["ops"]


class _NoArguments(BaseModel):
    pass


class _ReportedTool(BaseTool):
    """A tool as a worker's MCP hub holds it: with the key of its server."""

    args_model = _NoArguments

    def __init__(self, server: str, name: str, tool_class: ToolClass) -> None:
        self.server_key = server
        self.name = f"mcp__{server}__{name}"
        self.description = f"The {name} tool."
        self.tool_class = tool_class

    def run(self, arguments: BaseModel, context: Any) -> Any:
        raise AssertionError("the API never runs an MCP tool")


def test_the_api_lists_the_mcp_tools_the_workers_reported(
    client: TestClient, tmp_path: Path, redis_url: str
) -> None:
    root = tmp_path / "mcp-market"
    plugin = root / "plugins" / "mcpkit"
    write_agent(plugin, "pager", "You page people.")
    servers = {"mcpServers": {"tickets": {"command": "/bin/false"}}}
    write(plugin / ".mcp.json", json.dumps(servers))
    listing = {
        "name": "mcp",
        "owner": {},
        "plugins": [{"name": "mcpkit", "source": "./plugins/mcpkit"}],
    }
    write(root / ".claude-plugin" / "marketplace.json", json.dumps(listing))
    assert client.post("/api/v1/marketplaces", json={"source": str(root)}).status_code == 201
    assert client.post("/api/v1/plugins", json={"plugin": "mcpkit@mcp"}).status_code == 201

    def listed() -> dict[str, str]:
        tools = client.get("/api/v1/skills").json()["tools"]
        return {t["name"]: t["class"] for t in tools if t["name"].startswith("mcp__")}

    assert listed() == {}  # no worker has reported the server's tools yet
    server = redis.Redis.from_url(redis_url)
    try:
        McpToolPublisher(server).publish(
            [
                _ReportedTool("mcpkit__tickets", "count", ToolClass.READ),
                _ReportedTool("mcpkit__tickets", "open", ToolClass.WRITE),
                _ReportedTool("elsewhere__gone", "stale", ToolClass.READ),
            ]
        )
        assert listed() == {
            "mcp__mcpkit__tickets__count": "read",
            "mcp__mcpkit__tickets__open": "write",
        }  # a server no installed plugin declares is not listed
        assert client.delete("/api/v1/plugins/mcpkit").status_code == 204
        assert listed() == {}
    finally:
        server.delete("ongrid:mcp:tools:mcpkit__tickets", "ongrid:mcp:tools:elsewhere__gone")
        server.close()
