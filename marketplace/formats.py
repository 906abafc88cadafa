"""Reading Claude Code plugin marketplaces, plugins and Agent Skills, refusing hostile input.

The formats are taken as their public documentation describes them:

- ``.claude-plugin/marketplace.json``: ``name``, ``owner``, ``plugins[]`` (each with ``name``,
  ``source`` and optional ``description``, ``version``, ``category``, ``strict`` and component
  fields), ``metadata.pluginRoot`` (prepended to bare relative sources).
- a plugin: optional ``.claude-plugin/plugin.json``; ``agents/*.md``, ``skills/<name>/SKILL.md``
  and ``.mcp.json`` by default. A component path given for ``agents``, ``skills``, ``commands``
  or ``outputStyles`` *replaces* that default folder (the plugins reference's "path behavior
  rules"; listing the default folder in the array keeps it); ``mcpServers`` and ``hooks`` add to
  their default file. With ``strict: false`` the marketplace entry plays the part of
  ``plugin.json``: a plugin.json that declares components as well is a conflict.
- a skill (agentskills.io): ``SKILL.md`` with ``name``, ``description``, ``license``,
  ``compatibility``, ``metadata`` and ``allowed-tools`` frontmatter, next to any other files.

Everything here reads; nothing runs. Every file is read bounded and only if it is a regular
file (a FIFO would block a reader forever), every path a bundle names must stay inside the bundle
once symlinks are resolved, and every refusal is a :class:`BundleError` naming where and why.
The file-safety checks are in :mod:`marketplace._files`, the ``source`` field in
:mod:`marketplace._source_spec` and the skill reader in :mod:`marketplace._skill_doc`; their
public names are importable from here.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marketplace._files import (
    _inside,
    _json_kind,
    _real_dir,
    _text,
    check_tree,
    read_file_bytes,
    read_json_file,
)
from marketplace._skill_doc import SkillDoc, read_skill
from marketplace._source_spec import PluginSource, _relative, parse_source
from marketplace.model import BundleError

__all__ = [
    "COMPONENT_KEYS",
    "MANIFEST_FILE",
    "Marketplace",
    "PluginEntry",
    "PluginLayout",
    "PluginSource",
    "SkillDoc",
    "check_tree",
    "parse_source",
    "read_entry",
    "read_file_bytes",
    "read_json_file",
    "read_marketplace",
    "read_plugin",
    "read_skill",
]

#: Marketplace and plugin names: what the official marketplace's 286 names all are.
NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
MAX_NAME = 64
#: Ongrid's skill manifest (tools without code), looked for at a plugin's root and in each skill.
MANIFEST_FILE = "ongrid-tools.yaml"

#: Component fields that name files or folders (string or list of strings).
_PATH_KEYS = ("agents", "skills", "commands", "outputStyles")
#: Component fields that name a config file or hold the config inline.
_CONFIG_KEYS = ("hooks", "mcpServers", "lspServers")
#: Every component field a plugin.json or a marketplace entry may carry.
COMPONENT_KEYS = _PATH_KEYS + _CONFIG_KEYS
#: Default folders Ongrid does not run, listed as not used when present.
_UNUSED_FOLDERS = (("commands", "commands"), ("output-styles", "outputStyles"), ("bin", ""))
_UNUSED_FILES = ("hooks/hooks.json", ".lsp.json", "monitors/monitors.json", "settings.json")


# -- names ---------------------------------------------------------------------------------------


def _name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise BundleError(what, "a name is required (a string)")
    if len(value) > MAX_NAME or not NAME.match(value):
        raise BundleError(
            what,
            f"{value[:80]!r} is not a valid name: lowercase letters, digits, '.', '_' and '-', "
            f"starting with a letter or digit, at most {MAX_NAME} characters",
        )
    return value


# -- the marketplace -----------------------------------------------------------------------------


@dataclass(frozen=True)
class PluginEntry:
    """One plugin as the marketplace lists it; ``source`` and ``components`` kept as written."""

    name: str
    source: str | dict[str, Any]
    description: str = ""
    version: str = ""
    category: str = ""
    strict: bool = True
    #: The entry's component fields (agents, skills, commands, hooks, mcpServers…) as given.
    components: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Marketplace:
    """A marketplace.json read from ``root``; entries that could not be read are ``problems``."""

    name: str
    owner: dict[str, Any]
    description: str
    plugins: tuple[PluginEntry, ...]
    root: Path
    raw: dict[str, Any]
    #: (plugin name, or ``plugins[i]`` when it has none, and why the entry was left out).
    problems: tuple[tuple[str, str], ...] = ()
    #: ``metadata.pluginRoot``: the folder bare relative sources are under ("" if none).
    plugin_root: str = ""


def _check_components(data: dict[str, Any], where: str) -> dict[str, Any]:
    """The component fields of a plugin.json or an entry, their shapes and paths checked."""
    found = {key: data[key] for key in COMPONENT_KEYS if key in data}
    for key, value in found.items():
        values = value if isinstance(value, list) else [value]
        for item in values:
            if isinstance(item, dict) and key in _CONFIG_KEYS and not isinstance(value, list):
                continue  # an inline config
            if not isinstance(item, str):
                shape = "a path or a list of paths"
                if key in _CONFIG_KEYS:
                    shape += ", or an inline object"
                raise BundleError(f"{where}{key}", f"must be {shape}, got {_json_kind(item)}")
            _relative(item, f"{where}{key}")
    return found


def _entry(raw: Any, plugin_root: str) -> PluginEntry:
    if not isinstance(raw, dict):
        raise BundleError("", f"a plugin entry must be an object, got {_json_kind(raw)}")
    name = _name(raw.get("name"), "name")
    if "source" not in raw:
        raise BundleError("source", "required: a relative path or a repository")
    source = raw["source"]
    parse_source(source, plugin_root=plugin_root)
    strict = raw.get("strict", True)
    if not isinstance(strict, bool):
        raise BundleError("strict", f"must be true or false, got {_json_kind(strict)}")
    return PluginEntry(
        name=name,
        source=source,
        description=_text(raw.get("description"), "description"),
        version=_text(raw.get("version"), "version"),
        category=_text(raw.get("category"), "category"),
        strict=strict,
        components=_check_components(raw, ""),
        raw=raw,
    )


def read_entry(raw: Any, plugin_root: str = "") -> PluginEntry:
    """One marketplace entry (as an install record keeps it), checked as the marketplace's are."""
    return _entry(raw, plugin_root)


def read_marketplace(root: Path) -> Marketplace:
    """Read ``root/.claude-plugin/marketplace.json``.

    A file that is not a JSON object, or a marketplace without a valid name or plugins list,
    is refused; a bad plugin entry (name, source, fields) is set aside in ``problems`` and the
    others are kept. Entries sharing a name are all set aside: which one is meant is unknowable.
    """
    base = _real_dir(root, "marketplace")
    path = Path(base) / ".claude-plugin" / "marketplace.json"
    if not os.path.lexists(path):
        raise BundleError(str(root), "no .claude-plugin/marketplace.json: not a plugin marketplace")
    _inside(base, path, ".claude-plugin/marketplace.json")
    data = read_json_file(path, "marketplace.json")
    where = str(path)
    name = _name(data.get("name"), f"{where}: name")
    owner = data.get("owner", {})
    metadata = data.get("metadata", {})
    if not isinstance(owner, dict) or not isinstance(metadata, dict):
        raise BundleError(where, "owner and metadata must be objects")
    plugin_root = ""
    if metadata.get("pluginRoot"):
        plugin_root = _relative(metadata["pluginRoot"], f"{where}: metadata.pluginRoot")
    plugins = data.get("plugins")
    if not isinstance(plugins, list):
        raise BundleError(where, f"plugins must be an array, got {_json_kind(plugins)}")
    entries: list[PluginEntry] = []
    problems: list[tuple[str, str]] = []
    for index, raw in enumerate(plugins):
        label = raw.get("name") if isinstance(raw, dict) else None
        label = label if isinstance(label, str) and label else f"plugins[{index}]"
        try:
            entries.append(_entry(raw, plugin_root))
        except BundleError as exc:
            problems.append((label[:80], str(exc)))
    counts: dict[str, int] = {}
    for entry in entries:
        counts[entry.name] = counts.get(entry.name, 0) + 1
    for dup in sorted(n for n, c in counts.items() if c > 1):
        problems.append((dup, f"{counts[dup]} entries share this name; none is used"))
    description = data.get("description") or metadata.get("description") or ""
    return Marketplace(
        name=name,
        owner=owner,
        description=_text(description, f"{where}: description"),
        plugins=tuple(e for e in entries if counts[e.name] == 1),
        root=Path(base),
        raw=data,
        problems=tuple(problems),
        plugin_root=plugin_root,
    )


# -- a plugin ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PluginLayout:
    """What a plugin holds, as paths under ``root``; nothing in it has been parsed or run."""

    name: str
    version: str
    description: str
    author: dict[str, Any]
    root: Path
    agent_files: tuple[Path, ...]
    #: Folders that each hold a SKILL.md.
    skill_dirs: tuple[Path, ...]
    #: ``.mcp.json``-shaped files, or inline ``mcpServers`` objects, kept raw.
    mcp_sources: tuple[Path | dict[str, Any], ...]
    #: Ongrid skill manifests (``ongrid-tools.yaml``) at the root and in skill folders.
    manifest_files: tuple[Path, ...]
    #: The parts Ongrid keeps but does not run (``commands/ (3 files)``, ``hooks/hooks.json``…).
    unused: tuple[str, ...]
    warnings: tuple[str, ...]


class _PluginReader:
    """Resolves a plugin's component paths inside its root, gathering warnings on the way."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.warnings: list[str] = []

    def path(self, raw: str, what: str) -> Path | None:
        """``raw`` under the root (refusing an escape); None, with a warning, if it is missing."""
        rel = _relative(raw, what)
        path = Path(self.base) / rel
        _inside(self.base, path, f"{what} {raw}")
        if not path.exists():
            self.warnings.append(f"{what} path {raw} does not exist")
            return None
        return path

    def default(self, rel: str) -> Path | None:
        path = Path(self.base) / rel
        if not os.path.lexists(path):
            return None
        _inside(self.base, path, rel)
        return path

    def markdown(self, folder: Path) -> list[Path]:
        """The ``*.md`` files directly in ``folder``, each checked to stay inside."""
        out = []
        for path in sorted(folder.iterdir()):
            if path.suffix == ".md":
                _inside(self.base, path, str(path.relative_to(self.base)))
                if path.is_file():
                    out.append(path)
        return out

    def agents(self, values: list[str]) -> list[Path]:
        if not values:
            folder = self.default("agents")
            return self.markdown(folder) if folder and folder.is_dir() else []
        out: list[Path] = []
        for raw in values:
            path = self.path(raw, "agents")
            if path is not None:
                out += self.markdown(path) if path.is_dir() else [path]
        return out

    def skills(self, values: list[str]) -> list[Path]:
        folders: list[Path] = []
        if not values:
            folder = self.default("skills")
            folders = [folder] if folder and folder.is_dir() else []
        for raw in values:
            path = self.path(raw, "skills")
            if path is not None and not path.is_dir():
                self.warnings.append(f"skills path {raw} is not a folder")
            elif path is not None:
                folders.append(path)
        out = []
        for folder in folders:
            if (folder / "SKILL.md").exists():
                out.append(folder)  # a folder that is one skill ("skills": ["./"])
                continue
            for sub in sorted(p for p in folder.iterdir() if (p / "SKILL.md").exists()):
                _inside(self.base, sub / "SKILL.md", str(sub.relative_to(self.base)))
                out.append(sub)
        return out

    def count(self, path: Path) -> int:
        if not path.is_dir():
            return 1
        return sum(
            1 for p in path.rglob("*") if p.is_file() and ".git" not in p.relative_to(path).parts
        )


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, list) else [value]


def read_plugin(root: Path, entry: PluginEntry | None = None) -> PluginLayout:
    """Find a plugin's components under ``root`` (see the module docstring for the rules).

    The plugin.json and the entry's components are merged (``strict: true``, the default); with
    ``strict: false`` the entry defines them and a plugin.json declaring any is refused. The
    version is plugin.json's, else the entry's, else "" (the installer then hashes the content).
    """
    base = _real_dir(root, "plugin")
    reader = _PluginReader(base)
    manifest_path = Path(base) / ".claude-plugin" / "plugin.json"
    manifest: dict[str, Any] = {}
    if os.path.lexists(manifest_path):
        _inside(base, manifest_path, ".claude-plugin/plugin.json")
        manifest = read_json_file(manifest_path, "plugin.json")
    declared = _check_components(manifest, f"{manifest_path}: ")
    given = entry.components if entry else {}
    if entry is not None and not entry.strict and declared and given:
        raise BundleError(
            str(manifest_path),
            "strict: false in the marketplace entry, but plugin.json declares components too "
            f"({', '.join(declared)}): only one of them may define the plugin",
        )
    parts = {key: _as_list(declared.get(key)) + _as_list(given.get(key)) for key in COMPONENT_KEYS}
    name = _plugin_name(manifest, entry, base, reader.warnings)
    version = _text(manifest.get("version"), "plugin.json version")
    if entry and entry.version and version and entry.version != version:
        reader.warnings.append(
            f"version {version} of plugin.json wins over {entry.version} of the marketplace"
        )
    agents = reader.agents(parts["agents"])
    skills = reader.skills(parts["skills"])
    mcp: list[Path | dict[str, Any]] = []
    default_mcp = reader.default(".mcp.json")
    if default_mcp is not None:
        mcp.append(default_mcp)
    for item in parts["mcpServers"]:
        source = item if isinstance(item, dict) else reader.path(item, "mcpServers")
        if source is not None and source not in mcp:
            mcp.append(source)
    manifests = [p / MANIFEST_FILE for p in [Path(base), *skills] if (p / MANIFEST_FILE).exists()]
    for path in manifests:
        _inside(base, path, str(path.relative_to(base)))
    author = manifest.get("author", entry.raw.get("author") if entry else None) or {}
    return PluginLayout(
        name=name,
        version=version or (entry.version if entry else ""),
        description=_text(
            manifest.get("description") or (entry.description if entry else ""),
            "plugin.json description",
        ),
        author=author if isinstance(author, dict) else {"name": str(author)},
        root=Path(base),
        agent_files=tuple(agents),
        skill_dirs=tuple(skills),
        mcp_sources=tuple(mcp),
        manifest_files=tuple(manifests),
        unused=tuple(_unused(reader, parts)),
        warnings=tuple(reader.warnings),
    )


def _plugin_name(
    manifest: dict[str, Any], entry: PluginEntry | None, base: str, warnings: list[str]
) -> str:
    if "name" in manifest:
        name = _name(manifest["name"], "plugin.json name")
        if entry is not None and entry.name != name:
            warnings.append(f"plugin.json names the plugin {name}; the marketplace {entry.name}")
        return entry.name if entry is not None else name
    return entry.name if entry is not None else Path(base).name


def _unused(reader: _PluginReader, parts: dict[str, list[Any]]) -> list[str]:
    """The parts Ongrid keeps but never runs, in words an admin reads in a listing."""
    out = []
    for key in ("commands", "outputStyles"):
        for raw in parts[key]:
            path = reader.path(raw, key)
            if path is not None:
                out.append(f"{key}: {raw} ({_files(reader.count(path))})")
    for folder, key in _UNUSED_FOLDERS:
        path = reader.default(folder)
        if path is not None and path.is_dir() and not (key and parts[key]):
            out.append(f"{folder}/ ({_files(reader.count(path))})")
    for rel in _UNUSED_FILES:
        if reader.default(rel) is not None:
            out.append(rel)
    for key in ("hooks", "lspServers"):
        for item in parts[key]:
            if isinstance(item, dict):
                out.append(f"{key} (inline)")
            elif reader.path(item, key) is not None:
                out.append(f"{key}: {item}")
    return out


def _files(count: int) -> str:
    return f"{count} file" if count == 1 else f"{count} files"
