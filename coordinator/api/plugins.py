"""Marketplaces and plugins (admin only: a role with ``manage_plugins``).

Adding a marketplace reads it (a directory, or a git repository cloned into the marketplace
root); installing copies a plugin into the marketplace root, records it in the database and
broadcasts a reload (:mod:`coordinator.plugin_manager`). Nothing from a bundle runs here.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Response
from pydantic import BaseModel, ConfigDict, Field

from coordinator.api.deps import Caller, Svc
from coordinator.api.errors import Conflict
from coordinator.api.schemas import ErrorOut
from coordinator.auth import Principal, require
from coordinator.plugin_manager import Conflict as PluginConflict
from registry.persona import PermissionMode

__all__ = ["router"]

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut} for code in (400, 401, 403, 404, 409, 422, 503)
}

router = APIRouter(tags=["plugins"], responses=_ERRORS)


def plugin_admin(principal: Caller) -> Principal:
    """A caller whose role may manage plugins (403 otherwise)."""
    require(principal, "manage_plugins")
    return principal


Admin = Annotated[Principal, Depends(plugin_admin)]


class MarketplaceIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source: str = Field(
        min_length=1,
        max_length=4096,
        description="A directory holding .claude-plugin/marketplace.json, or a git repository "
        "(a local path or file:// URL; a remote URL only with plugins_allow_network).",
    )
    name: str = Field(default="", max_length=64, description="Default: the marketplace's own.")


class PluginIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    plugin: str = Field(
        min_length=3, max_length=200, description="`PLUGIN@MARKETPLACE`, e.g. `plugin-dev@acme`."
    )
    allow_mode: PermissionMode = Field(
        default=PermissionMode.READ_ONLY,
        description="The most the plugin's personas may do; a persona never gets more than it "
        "declares, and one that declares nothing gets this.",
    )
    mcp: bool = Field(default=True, description="Start the plugin's MCP servers on the workers.")
    network: bool = Field(
        default=False,
        description="Let its skill scripts that declare `network: true` and its MCP servers reach "
        "the network, through the workers' egress proxy (never the runtime's own services).",
    )
    writable: bool = Field(
        default=False, description="Give its MCP servers a writable folder of their own."
    )


class _Out(BaseModel):
    # Views carry a few more keys than documented here (e.g. the install record's entry); they
    # are left out of the response rather than refused.
    model_config = ConfigDict(extra="ignore")


class ProblemOut(_Out):
    plugin: str
    reason: str


class MarketplaceOut(_Out):
    """A marketplace added, as the database records it and as it reads now."""

    name: str
    source: str = Field(description="What was given: a directory or a git repository.")
    kind: str = Field(description="`directory` (read in place) or `git` (cloned).")
    location: str = Field(description="Where it is read from.")
    ref: str = Field(description="The clone's commit, or `sha256:` of marketplace.json.")
    added_by: str = ""
    added_at: str | None = None
    owner: dict[str, Any] = Field(default_factory=dict)
    description: str = ""
    plugins: int | None = Field(default=None, description="How many plugins it lists.")
    problems: list[ProblemOut] = Field(
        default_factory=list, description="Entries left out, and why (e.g. a `..` in a source)."
    )
    error: str | None = Field(default=None, description="Why it cannot be read now, if so.")


class OfferedPluginOut(_Out):
    """A plugin a marketplace lists."""

    name: str
    marketplace: str
    description: str = ""
    version: str = ""
    category: str = ""
    source: str = ""
    reachable: bool
    unreachable_reason: str | None = Field(
        default=None, description="Why it cannot be installed (a remote source without network…)."
    )
    installed: str | None = Field(
        default=None, description="The installed version, when installed from this marketplace."
    )


class InstalledPluginOut(_Out):
    """An installed plugin: where it came from and what it brought."""

    name: str
    marketplace: str
    version: str
    source: str
    ref: str
    content_hash: str = Field(description="SHA-256 of the files copied.")
    path: str = Field(description="The installed directory.")
    allowed_mode: PermissionMode
    mcp: bool
    network: bool = False
    writable: bool = False
    grants: list[str] = Field(
        default_factory=list, description="What the install lets it do, one line each."
    )
    installed_by: str = ""
    installed_at: str | None = None
    agents: list[str] = Field(default_factory=list, description="`<plugin>:<agent>` names.")
    skills: list[str] = Field(default_factory=list, description="`<plugin>:<skill>` names.")
    tools: list[str] = Field(
        default_factory=list, description="Tools of its skill manifests (`<plugin>__<tool>`)."
    )
    mcp_servers: list[str] = Field(default_factory=list)
    unused: list[str] = Field(
        default_factory=list, description="Parts kept but never run (commands, hooks…)."
    )
    warnings: list[str] = Field(default_factory=list)
    error: str | None = Field(default=None, description="Why its copy cannot be read, if so.")


class InstallOut(InstalledPluginOut):
    changed: bool = Field(description="False when the same content was installed already.")
    registry_version: int = Field(description="The reload broadcast (0 when nothing changed).")


class UpdateOut(_Out):
    name: str
    updated: bool
    version: str | None = None
    content_hash: str | None = None
    error: str | None = None


def _conflicts(call: Any) -> Any:
    try:
        return call()
    except PluginConflict as exc:
        raise Conflict(str(exc)) from None


@router.get("/api/v1/marketplaces", response_model=list[MarketplaceOut])
def list_marketplaces(_who: Admin, svc: Svc) -> list[dict[str, Any]]:
    """The marketplaces added, with their plugin count and the entries that cannot be read."""
    return svc.plugins.marketplaces()


@router.post("/api/v1/marketplaces", status_code=201, response_model=MarketplaceOut)
def add_marketplace(body: MarketplaceIn, who: Admin, svc: Svc) -> dict[str, Any]:
    """Add a marketplace, or read an added one again (a git one is cloned again); 409 when
    the name is taken by a marketplace of another source."""
    return dict(
        _conflicts(lambda: svc.plugins.add_marketplace(body.source, name=body.name, user=who.user))
    )


@router.delete("/api/v1/marketplaces/{name}", status_code=204, response_class=Response)
def remove_marketplace(name: str, _who: Admin, svc: Svc) -> Response:
    """Forget a marketplace (409 while plugins installed from it remain)."""
    _conflicts(lambda: svc.plugins.remove_marketplace(name))
    return Response(status_code=204)


@router.get("/api/v1/marketplaces/{name}/plugins", response_model=list[OfferedPluginOut])
def marketplace_plugins(name: str, _who: Admin, svc: Svc) -> list[dict[str, Any]]:
    """Every plugin of the marketplace: reachable (or why not) and whether it is installed."""
    return svc.plugins.available(name)


@router.get("/api/v1/plugins", response_model=list[InstalledPluginOut])
def list_plugins(_who: Admin, svc: Svc) -> list[dict[str, Any]]:
    """The installed plugins: where each came from and what it brought."""
    return svc.plugins.installed()


@router.post("/api/v1/plugins", status_code=201, response_model=InstallOut)
def install_plugin(body: PluginIn, who: Admin, svc: Svc, response: Response) -> dict[str, Any]:
    """Install (or re-install: an update) a plugin; 200 when nothing changed."""
    outcome = _conflicts(
        lambda: svc.plugins.install(
            body.plugin,
            allow_mode=body.allow_mode.value,
            mcp=body.mcp,
            network=body.network,
            writable=body.writable,
            user=who.user,
        )
    )
    if not outcome.changed:
        response.status_code = 200
    svc.snapshot()  # this process reloads now, not at its next request
    return dict(outcome.as_dict())


@router.post("/api/v1/plugins/update", response_model=list[UpdateOut])
def update_plugins(who: Admin, svc: Svc) -> list[dict[str, Any]]:
    """Install every plugin again from its marketplace, keeping its options."""
    results = svc.plugins.update(user=who.user)
    svc.snapshot()
    return results


@router.post("/api/v1/plugins/{name}/update", response_model=list[UpdateOut])
def update_plugin(name: str, who: Admin, svc: Svc) -> list[dict[str, Any]]:
    """Install one plugin again from its marketplace."""
    results = svc.plugins.update(name, user=who.user)
    svc.snapshot()
    return results


@router.delete("/api/v1/plugins/{name}", status_code=204, response_class=Response)
def remove_plugin(name: str, _who: Admin, svc: Svc) -> Response:
    """Uninstall: the files, the record, and a reload broadcast."""
    svc.plugins.remove(name)
    svc.snapshot()
    return Response(status_code=204)
