"""What the installed plugins add to the registry, read fresh at every reload.

The marketplace root holds one directory per installed plugin::

    <root>/plugins/<plugin>/current -> <version>-<hash>/   the installed copy (a relative symlink)
    <root>/plugins/<plugin>/<version>-<hash>/.ongrid-plugin.json   what was installed from where

:func:`read_bundles` follows each ``current`` link and turns what it finds into
:class:`Bundles`: the plugin's agents as personas named ``<plugin>:<agent>``, its skills, the
tools its skill manifests declare (named ``<plugin>__<tool>``), and its MCP servers (keyed
``<plugin>__<server>``). Nothing here runs any of it. A part that cannot be used is a load
warning naming the file; the rest of the plugin still loads.

What the install allowed bounds what the plugin brings: its personas run at most its allowed
mode, a tool of its manifests whose class (bounded below by what it does) is above that mode is
left out, and so is one that declares the network when the install granted none. The grants
(``network``, ``writable``) reach the executors and MCP servers that need them. Names never
shadow: a name another plugin or the config file already holds is left out with a warning that
names both.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import threading
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from marketplace.formats import read_entry, read_plugin, read_skill
from marketplace.manifest import ManifestTool, ScriptExecutor, load_manifest
from marketplace.mcp_config import parse_mcp_json, plugin_prefix
from marketplace.model import BundleError, McpServerConfig
from marketplace.skills import SKILL_TOOLS, Skill
from registry.agent_registry import LoadWarning
from registry.claude_import import convert_claude_file
from registry.errors import OngridError
from registry.persona import PermissionMode, Persona, Source
from registry.tools import BaseTool, ToolClass

__all__ = [
    "CURRENT_LINK",
    "PLUGINS_DIR",
    "RECORD_FILE",
    "Bundles",
    "InstallRecord",
    "LoadedPlugin",
    "capped_mode",
    "grants_of",
    "load_plugin",
    "read_bundles",
    "read_record",
]

log = logging.getLogger(__name__)

PLUGINS_DIR = "plugins"
CURRENT_LINK = "current"
RECORD_FILE = ".ongrid-plugin.json"

#: Modes in the order of what they let a persona do.
_MODE_ORDER = (
    PermissionMode.READ_ONLY,
    PermissionMode.MUTATING_WITH_CONFIRM,
    PermissionMode.DUAL_SIGN_REQUIRED,
)
#: The highest tool class each mode lets a persona call.
_MODE_CLASS = {
    PermissionMode.READ_ONLY: ToolClass.READ,
    PermissionMode.MUTATING_WITH_CONFIRM: ToolClass.WRITE,
    PermissionMode.DUAL_SIGN_REQUIRED: ToolClass.DESTRUCTIVE,
}
_CLASS_ORDER = (ToolClass.READ, ToolClass.WRITE, ToolClass.DESTRUCTIVE)


@dataclass(frozen=True)
class InstallRecord:
    """``.ongrid-plugin.json``: written by the installer into the installed copy, so every
    process that reads the directory knows what it is without asking the database."""

    name: str
    version: str
    marketplace: str
    source: str
    ref: str
    content_hash: str
    #: The most a persona of the plugin may do (``permission_mode``); the admin sets it.
    allowed_mode: str = PermissionMode.READ_ONLY.value
    #: Start the plugin's MCP servers.
    mcp: bool = True
    #: Its skill scripts and MCP servers may reach the network (through the worker's egress
    #: proxy, never the runtime's own services); the admin grants it at install.
    network: bool = False
    #: Its MCP servers get a writable directory of their own (``CLAUDE_PLUGIN_DATA``).
    writable: bool = False
    installed_by: str = ""
    installed_at: str = ""
    #: The marketplace's entry of the plugin, kept for ``strict: false`` plugins whose entry
    #: defines their components.
    entry: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "marketplace": self.marketplace,
            "source": self.source,
            "ref": self.ref,
            "content_hash": self.content_hash,
            "allowed_mode": self.allowed_mode,
            "mcp": self.mcp,
            "network": self.network,
            "writable": self.writable,
            "installed_by": self.installed_by,
            "installed_at": self.installed_at,
            "entry": self.entry,
        }


def grants_of(record: InstallRecord) -> list[str]:
    """What the install lets the plugin do, one line each, as a person reads it."""
    lines = [
        f"allowed mode {record.allowed_mode}: its personas run at most that, and its tools "
        "above it are left out"
    ]
    if record.mcp:
        lines.append("MCP servers: started on every worker, stdio ones in the worker's sandbox")
    if record.network:
        lines.append(
            "network: its scripts that declare it and its MCP servers reach the network "
            "through the workers' egress proxy; never this cluster's Redis, database or hosts"
        )
    else:
        lines.append("no network: its scripts and MCP servers run with no network at all")
    if record.writable:
        lines.append("writable: its MCP servers may write to a folder of their own on each worker")
    return lines


def read_record(directory: Path) -> InstallRecord:
    path = directory / RECORD_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        known = set(InstallRecord.__dataclass_fields__)
        return InstallRecord(**{k: v for k, v in data.items() if k in known})
    except (OSError, ValueError, TypeError) as exc:
        raise BundleError(str(path), f"install record unreadable: {exc}") from None


@dataclass(frozen=True)
class LoadedPlugin:
    """One installed plugin as this reload read it."""

    record: InstallRecord
    root: Path
    agents: tuple[str, ...] = ()
    skills: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()
    mcp_servers: tuple[str, ...] = ()
    #: Parts Ongrid keeps but never runs (commands, hooks, LSP servers…).
    unused: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.record.as_dict(),
            "grants": grants_of(self.record),
            "path": str(self.root),
            "agents": list(self.agents),
            "skills": list(self.skills),
            "tools": list(self.tools),
            "mcp_servers": list(self.mcp_servers),
            "unused": list(self.unused),
            "warnings": list(self.warnings),
        }


@dataclass(frozen=True)
class Bundles:
    """Everything the installed plugins bring, from one reload (a registry ``BundleLayer``)."""

    plugins: tuple[LoadedPlugin, ...] = ()
    personas: tuple[Persona, ...] = ()
    skills: Mapping[str, Skill] = field(default_factory=dict)
    #: Tools declared by skill manifests (each name ends in ``_skill``).
    tools: tuple[BaseTool, ...] = ()
    mcp_servers: Mapping[str, McpServerConfig] = field(default_factory=dict)
    warnings: tuple[LoadWarning, ...] = ()
    digest: str = ""

    def plugin(self, name: str) -> LoadedPlugin | None:
        return next((p for p in self.plugins if p.record.name == name), None)

    def skills_for(self, persona: Persona) -> dict[str, Skill]:
        """The skills ``persona`` may load, by qualified name: those its ``skills`` lists,
        a bare name standing for the one installed skill of that name."""
        found: dict[str, Skill] = {}
        for wanted in persona.skills:
            skill = self.skills.get(wanted)
            if skill is None:
                same = [s for s in self.skills.values() if s.name == wanted]
                skill = same[0] if len(same) == 1 else None
            if skill is not None:
                found[skill.qualified] = skill
        return found


EMPTY = Bundles()


def _problem(path: Path, exc: Exception) -> str:
    """``path: reason``, once (a bundle error may name the file itself already)."""
    text = str(exc)
    return text if text.startswith(str(path)) else f"{path}: {text}"


def capped_mode(persona: Persona, allowed: PermissionMode) -> PermissionMode:
    """The mode a plugin persona runs with: what it declares, never more than ``allowed``;
    one that declares none (a Claude Code file never does) gets ``allowed``."""
    if "permission_mode" not in persona.model_fields_set:
        return allowed
    declared = persona.permission_mode
    return min(declared, allowed, key=_MODE_ORDER.index)


def _persona(
    file: Path,
    plugin: str,
    allowed: PermissionMode,
    skills: Sequence[Skill],
    tools: Mapping[str, str],
) -> Persona:
    imported = convert_claude_file(file)
    persona = imported.persona
    own = {s.name: s.qualified for s in skills}
    # A bare skill name is first one of the plugin's own; with none listed, the persona may
    # load every skill its plugin ships.
    wanted = [own.get(s, s) for s in persona.skills] or [s.qualified for s in skills]
    return persona.model_copy(
        update={
            "name": f"{plugin}:{persona.name}",
            "permission_mode": capped_mode(persona, allowed),
            "skills": wanted,
            # Its own plugin's tools by the names its manifests give them.
            "tools": [tools.get(t, t) for t in persona.tools],
            "source": Source.PLUGIN,
            "plugin": plugin,
            "path": str(file),
        }
    )


def load_plugin(
    root: Path, record: InstallRecord, *, taken_tools: Collection[str] = ()
) -> tuple[LoadedPlugin, list[Persona], list[Skill], list[BaseTool], dict[str, McpServerConfig]]:
    """Read one installed plugin. Raises :class:`BundleError` only when nothing of it can be
    used (its layout is refused); a bad part is a warning of the returned plugin."""
    name = record.name
    entry = read_entry(record.entry) if record.entry else None
    layout = read_plugin(root, entry)
    warnings: list[str] = list(layout.warnings)
    try:
        allowed = PermissionMode(record.allowed_mode)
    except ValueError:
        warnings.append(f"allowed_mode {record.allowed_mode!r} is unknown: read-only is used")
        allowed = PermissionMode.READ_ONLY
    skills: list[Skill] = []
    for skill_dir in layout.skill_dirs:
        try:
            doc = read_skill(skill_dir)
        except OngridError as exc:
            warnings.append(_problem(skill_dir, exc))
            continue
        skills.append(
            Skill.create(
                name=doc.name,
                plugin=name,
                description=doc.description,
                body=doc.body,
                root=doc.root,
                files=doc.files,
                allowed_tools=doc.allowed_tools,
            )
        )
    tools = _manifest_tools(root, record, layout.manifest_files, skills, taken_tools, warnings)
    own_tools = {getattr(t, "base_name", t.name): t.name for t in tools}
    personas: list[Persona] = []
    for file in layout.agent_files:
        try:
            personas.append(_persona(file, name, allowed, skills, own_tools))
        except OngridError as exc:
            warnings.append(_problem(file, exc))
    servers: dict[str, McpServerConfig] = {}
    if record.mcp:
        for source in layout.mcp_sources:
            where = str(source) if isinstance(source, Path) else f"{root}: mcpServers"
            try:
                data = _json_of(source)
                found, problems = parse_mcp_json(
                    data, plugin=name, plugin_root=str(root), where=where
                )
            except OngridError as exc:
                warnings.append(f"{where}: {exc}")
                continue
            warnings.extend(f"{where}: {p}" for p in problems)
            cap = _MODE_CLASS[allowed].value
            servers.update(
                (
                    key,
                    dataclasses.replace(
                        config,
                        network=record.network,
                        writable=record.writable,
                        max_tool_class=cap,
                    ),
                )
                for key, config in found.items()
            )
    elif layout.mcp_sources:
        warnings.append("MCP servers are declared but were not enabled at install")
    loaded = LoadedPlugin(
        record=record,
        root=root,
        agents=tuple(p.name for p in personas),
        skills=tuple(s.qualified for s in skills),
        tools=tuple(t.name for t in tools),
        mcp_servers=tuple(servers),
        unused=tuple(layout.unused),
        warnings=tuple(warnings),
    )
    return loaded, personas, skills, tools, servers


def _manifest_tools(
    root: Path,
    record: InstallRecord,
    manifests: Sequence[Path],
    skills: Sequence[Skill],
    taken: Collection[str],
    warnings: list[str],
) -> list[BaseTool]:
    """The tools of the plugin's manifests that its install lets it bring (see the module
    docstring); what is left out is a warning in ``warnings``."""
    try:
        allowed = PermissionMode(record.allowed_mode)
    except ValueError:
        allowed = PermissionMode.READ_ONLY
    cap = _MODE_CLASS[allowed]
    tools: list[BaseTool] = []
    seen = set(taken)
    for manifest in manifests:
        skill = next((s.qualified for s in skills if manifest.parent == s.root), "")
        try:
            declared = load_manifest(manifest, root, skill=skill, plugin=record.name)
        except OngridError as exc:
            warnings.append(_problem(manifest, exc))
            continue
        for tool in declared:
            left_out = _left_out(tool, record, cap)
            if tool.class_note:
                warnings.append(f"{manifest}: tool {tool.name!r}: {tool.class_note}")
            if left_out:
                warnings.append(f"{manifest}: tool {tool.name!r} not loaded: {left_out}")
                continue
            if tool.name in seen:
                warnings.append(f"{manifest}: tool {tool.name!r} is already defined; not loaded")
                continue
            seen.add(tool.name)
            tools.append(tool)
    return tools


def _left_out(tool: ManifestTool, record: InstallRecord, cap: ToolClass) -> str:
    """Why the install does not let the plugin bring ``tool`` ("" when it does)."""
    if _CLASS_ORDER.index(tool.tool_class) > _CLASS_ORDER.index(cap):
        return (
            f"its class {tool.tool_class.value} is more than the install allows "
            f"(allowed mode {record.allowed_mode}); install it again with a higher --allow-mode "
            "to use it"
        )
    executor = tool.executor
    if isinstance(executor, ScriptExecutor) and executor.network and not record.network:
        return (
            "it declares network: true, which the install did not grant; install the plugin "
            'with --allow-network (the API: "network": true) to use it'
        )
    return ""


def _json_of(source: Path | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(source, Path):
        from marketplace.formats import read_json_file

        return read_json_file(source, ".mcp.json")
    return dict(source)


#: Plugins read by earlier reloads. An installed directory is never changed once it is renamed
#: into place (an update is a new directory), so what was read from it holds while its record
#: and the tool names taken before it are the same.
_LOADED: dict[tuple[Any, ...], tuple[Any, ...]] = {}
_LOADED_MAX = 512
_LOADED_LOCK = threading.Lock()


def _load_cached(directory: Path, record: InstallRecord, taken: frozenset[str]) -> tuple[Any, ...]:
    key = (str(directory), json.dumps(record.as_dict(), sort_keys=True), taken)
    with _LOADED_LOCK:
        hit = _LOADED.get(key)
    if hit is not None:
        return hit
    loaded = load_plugin(directory, record, taken_tools=taken)
    with _LOADED_LOCK:
        if len(_LOADED) >= _LOADED_MAX:
            _LOADED.clear()
        _LOADED[key] = loaded
    return loaded


def installed_dirs(root: Path, warnings: list[LoadWarning] | None = None) -> list[tuple[str, Path]]:
    """(plugin, installed directory) for every plugin whose ``current`` link resolves; one whose
    link leads nowhere (its directory was deleted by hand) is a warning in ``warnings``."""
    base = root / PLUGINS_DIR
    if not base.is_dir():
        return []
    out = []
    for child in sorted(base.iterdir()):
        link = child / CURRENT_LINK
        if child.is_dir() and link.is_dir():
            out.append((child.name, link.resolve()))
        elif link.is_symlink() and warnings is not None:
            warnings.append(
                LoadWarning(
                    str(link),
                    f"plugin {child.name!r} not loaded: its installed directory is missing; "
                    "install it again (ongrid plugins update) or remove it",
                )
            )
    return out


def read_bundles(
    root: Path,
    *,
    config_mcp: Mapping[str, Any] | None = None,
    reserved_tools: Collection[str] = (),
) -> Bundles:
    """Read every installed plugin under ``root`` and the config file's MCP servers
    (``config_mcp``, shaped like ``.mcp.json``'s ``mcpServers``). Never raises for a plugin."""
    plugins: list[LoadedPlugin] = []
    personas: list[Persona] = []
    skills: dict[str, Skill] = {}
    tools: list[BaseTool] = []
    servers: dict[str, McpServerConfig] = {}
    warnings: list[LoadWarning] = []
    taken = {*reserved_tools, *(t.name for t in SKILL_TOOLS)}
    digest = hashlib.sha256()
    for name, directory in installed_dirs(root, warnings):
        try:
            record = read_record(directory)
            loaded, found, their_skills, their_tools, their_servers = _load_cached(
                directory, record, frozenset(taken)
            )
        except OngridError as exc:
            warnings.append(LoadWarning(str(directory), f"plugin {name!r} not loaded: {exc}"))
            continue
        plugins.append(loaded)
        personas.extend(found)
        skills.update((s.qualified, s) for s in their_skills)
        tools.extend(their_tools)
        taken.update(t.name for t in their_tools)
        for key, server in their_servers.items():
            if key in servers:  # plugin names that differ only in characters a key cannot hold
                warnings.append(
                    LoadWarning(
                        str(directory),
                        f"MCP server {key!r} of plugin {name!r} not started: plugin "
                        f"{servers[key].plugin!r} has a server of that key",
                    )
                )
                continue
            servers[key] = server
        warnings.extend(LoadWarning(str(directory), w) for w in loaded.warnings)
        digest.update(
            f"{name}\0{record.content_hash}\0{record.allowed_mode}\0{record.mcp}\0"
            f"{record.network}\0{record.writable}\0".encode()
        )
    if config_mcp:
        try:
            found_servers, problems = parse_mcp_json(
                {"mcpServers": dict(config_mcp)}, plugin="", plugin_root="", where="mcp_servers"
            )
        except OngridError as exc:
            warnings.append(LoadWarning("config:mcp_servers", str(exc)))
        else:
            warnings.extend(LoadWarning("config:mcp_servers", p) for p in problems)
            plugin_keys = {plugin_prefix(p.record.name): p for p in plugins}
            for key, server in found_servers.items():
                # A plugin named like the server would share its tools' prefix mcp__<key>__.
                owner = plugin_keys.get(key) or next(
                    (p for p in plugins if key in p.mcp_servers), None
                )
                if owner is not None:
                    warnings.append(
                        LoadWarning(
                            "config:mcp_servers",
                            f"server {key!r} not started: its tools would be named like those of "
                            f"plugin {owner.record.name!r} (mcp__{key}__…); rename it",
                        )
                    )
                    continue
                servers[key] = server
        digest.update(json.dumps(dict(config_mcp), sort_keys=True, default=str).encode())
    return Bundles(
        plugins=tuple(plugins),
        personas=tuple(personas),
        skills=MappingProxyType(skills),
        tools=tuple(tools),
        mcp_servers=MappingProxyType(servers),
        warnings=tuple(warnings),
        digest=digest.hexdigest()[:16] if plugins or config_mcp else "",
    )
