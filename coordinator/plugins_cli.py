"""``ongrid plugins``: marketplaces and plugins from the command line.

These commands act on this host's marketplace root and the configured database directly, with the
authority of whoever may write them (an administrator of the host); the same operations over
HTTP need a role with ``manage_plugins``. Each change is broadcast as a registry reload.
"""

from __future__ import annotations

import sys
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from registry.errors import OngridError
from registry.persona import PermissionMode
from registry.settings import Settings

__all__ = ["plugins"]

_out = Console(highlight=False, soft_wrap=True)


def _manager(*, read_only: bool = False) -> Any:
    """The plugin manager of this host's settings. ``read_only`` (the listing commands): no
    database file or schema is created, and ``None`` when there is no database yet."""
    from coordinator.local_auth import with_local_redis
    from coordinator.plugin_manager import PluginManager
    from coordinator.storage.engine import Database, database_url, make_engine, open_read_only
    from coordinator.storage.plugins import PluginStore
    from workers.client import SpawnClient
    from workers.tools import default_catalog

    try:
        settings = with_local_redis(Settings.load())
    except OngridError as exc:
        raise click.ClickException(str(exc)) from None
    if read_only:
        engine = open_read_only(settings)
        if engine is None:
            return None
    else:
        database = Database(make_engine(database_url(settings)))
        try:
            database.ensure()
        except OngridError as exc:
            raise click.ClickException(str(exc)) from None
        engine = database.engine

    def broadcast() -> int:
        return SpawnClient(settings).reload()

    return PluginManager(
        settings.marketplace_root,
        PluginStore(engine),
        broadcast=broadcast,
        allow_network=settings.plugins_allow_network,
        reserved_tools=default_catalog(settings.tool_modules).names(),
        config_servers=settings.mcp_servers,
    )


def _run(call: Any) -> Any:
    from sqlalchemy.exc import SQLAlchemyError

    try:
        return call()
    except OngridError as exc:
        raise click.ClickException(str(exc)) from None
    except SQLAlchemyError as exc:
        reason = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or ["?"])[0]
        raise click.ClickException(
            f"the database cannot be read: {reason} (an older schema is migrated by `ongrid "
            "api`, or by any `ongrid plugins` command that changes something)"
        ) from None


def _listed(method: str, *args: Any) -> Any:
    """What a listing method of the manager returns; nothing when there is no database yet."""

    def call() -> Any:
        manager = _manager(read_only=True)
        return [] if manager is None else getattr(manager, method)(*args)

    return _run(call)


def _emit(data: Any) -> None:
    import json

    click.echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))


@click.group()
def plugins() -> None:
    """Install plugin marketplaces: personas, skills and MCP tools."""


@plugins.group()
def marketplace() -> None:
    """Add, list and remove marketplaces."""


@marketplace.command(name="add")
@click.argument("source")
@click.option("--name", default="", help="Name it (default: the marketplace's own name).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def marketplace_add(source: str, name: str, as_json: bool) -> None:
    """Add SOURCE: a directory with .claude-plugin/marketplace.json, or a git repository."""
    view = _run(lambda: _manager().add_marketplace(source, name=name))
    if as_json:
        _emit(view)
        return
    _out.print(f"marketplace {view['name']!r} added: {view['plugins']} plugins ({view['kind']})")
    for problem in view["problems"]:
        _out.print(f"  [yellow]unreadable entry[/] {problem['plugin']}: {problem['reason']}")


@marketplace.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def marketplace_list(as_json: bool) -> None:
    """The marketplaces added."""
    views = _listed("marketplaces")
    if as_json:
        _emit(views)
        return
    if not views:
        _out.print("no marketplace added (ongrid plugins marketplace add SOURCE)")
        return
    table = Table("name", "plugins", "kind", "source", "ref")
    for view in views:
        plugins_text = str(view.get("plugins", "")) if "error" not in view else "error"
        table.add_row(view["name"], plugins_text, view["kind"], view["source"], view["ref"][:12])
    _out.print(table)


@marketplace.command(name="remove")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def marketplace_remove(name: str, as_json: bool) -> None:
    """Forget marketplace NAME (its plugins must be removed first)."""
    _run(lambda: _manager().remove_marketplace(name))
    if as_json:
        _emit({"removed": name})
    else:
        _out.print(f"marketplace {name!r} removed")


@plugins.command(name="available")
@click.argument("marketplace_name", required=False, default="")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def available(marketplace_name: str, as_json: bool) -> None:
    """Every plugin the marketplaces offer, and why one cannot be installed."""
    rows = _listed("available", marketplace_name)
    if as_json:
        _emit(rows)
        return
    table = Table("plugin", "marketplace", "installed", "source / why not")
    for row in rows:
        why = (
            row.get("source", "")
            if row["reachable"]
            else f"unreachable: {row['unreachable_reason']}"
        )
        table.add_row(row["name"], row["marketplace"], row.get("installed") or "", why)
    _out.print(table)


@plugins.command(name="install")
@click.argument("ref")
@click.option(
    "--allow-mode",
    type=click.Choice([m.value for m in PermissionMode]),
    default=PermissionMode.READ_ONLY.value,
    show_default=True,
    help="The most the plugin's personas may do.",
)
@click.option("--no-mcp", is_flag=True, help="Do not start the plugin's MCP servers.")
@click.option(
    "--allow-network",
    is_flag=True,
    help="Let its skill scripts that declare network: true and its MCP servers reach the "
    "network, through the workers' egress proxy (never the runtime's own services).",
)
@click.option(
    "--allow-write", is_flag=True, help="Give its MCP servers a writable folder of their own."
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def install(
    ref: str, allow_mode: str, no_mcp: bool, allow_network: bool, allow_write: bool, as_json: bool
) -> None:
    """Install REF, given as PLUGIN@MARKETPLACE (again: with the options given now)."""
    outcome = _run(
        lambda: _manager().install(
            ref,
            allow_mode=allow_mode,
            mcp=not no_mcp,
            network=allow_network,
            writable=allow_write,
        )
    )
    view = outcome.as_dict()
    if as_json:
        _emit(view)
        return
    verb = "installed" if outcome.changed else "already installed, unchanged:"
    _out.print(f"{verb} {view['name']} {view['version'] or ''} ({view['content_hash'][:12]})")
    for key in ("agents", "skills", "tools", "mcp_servers"):
        if view[key]:
            _out.print(f"  {key.replace('_', ' ')}: {', '.join(view[key])}")
    for grant in view["grants"]:
        _out.print(f"  grants: {grant}")
    if view["unused"]:
        _out.print(f"  kept, not used by Ongrid: {', '.join(view['unused'])}")
    for warning in view["warnings"]:
        _out.print(f"  [yellow]warning[/] {warning}")


@plugins.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_installed(as_json: bool) -> None:
    """The installed plugins."""
    views = _listed("installed")
    if as_json:
        _emit(views)
        return
    if not views:
        _out.print("no plugin installed (ongrid plugins install PLUGIN@MARKETPLACE)")
        return
    table = Table("plugin", "version", "marketplace", "mode", "grants", "agents", "skills", "tools")
    for view in views:
        granted = [g for g in ("network", "writable") if view.get(g)]
        table.add_row(
            view["name"],
            view["version"],
            view["marketplace"],
            view["allowed_mode"],
            ", ".join(granted) or "none",
            str(len(view.get("agents", []))),
            str(len(view.get("skills", []))),
            str(len(view.get("tools", [])) + len(view.get("mcp_servers", []))),
        )
    _out.print(table)


@plugins.command(name="remove")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def remove(name: str, as_json: bool) -> None:
    """Uninstall plugin NAME."""
    version = _run(lambda: _manager().remove(name))
    if as_json:
        _emit({"removed": name, "registry_version": version})
    else:
        _out.print(f"plugin {name!r} removed (cluster registry version {version})")


@plugins.command(name="update")
@click.argument("name", required=False, default="")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def update(name: str, as_json: bool) -> None:
    """Install again from its marketplace every plugin, or plugin NAME."""
    results = _run(lambda: _manager().update(name))
    if as_json:
        _emit(results)
    else:
        for row in results:
            if row.get("error"):
                _out.print(f"[red]{row['name']}[/]: {row['error']}")
            else:
                state = "updated" if row["updated"] else "unchanged"
                _out.print(f"{row['name']}: {state} ({row['content_hash'][:12]})")
    sys.exit(1 if any(r.get("error") for r in results) else 0)
