"""Adding marketplaces and installing, updating and removing their plugins (admin only).

An install never runs anything from the bundle. It copies the plugin's regular files (checked
by :func:`marketplace.formats.check_tree`: no link out of the bundle, no oversized or special
file) into ``<root>/.staging/``, writes the install record, loads the copy once as a reload
would, and only then makes it visible with two atomic steps: a rename to
``<root>/plugins/<name>/<version>-<hash>/`` and a swap of the ``current`` link. A failure at
any step before the swap leaves the previous state (and no staged files) behind. The database
row is written after the swap; if that write fails the swap is undone.

Every change ends with a registry reload broadcast, so every worker and API process sees the
new personas, skills and tools at its next spawn. Operations on one marketplace root are
serialised by a lock file.

A plugin's tools and MCP servers are named after it (``<plugin>__<tool>``,
``mcp__<plugin>__<server>__<tool>``), so no two plugins' names meet; an install whose names
would still meet others' (two plugin names that differ only in characters a tool name cannot
hold, a plugin named like a server of the config file, a tool named like one of the runtime's)
is refused, naming them, before anything changes. What an install grants beyond its allowed
mode — the network, a writable folder — is recorded with it and shown in its answer.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from coordinator.storage.plugins import InstalledRecord, MarketplaceRecord, PluginStore
from marketplace.formats import (
    Marketplace,
    PluginEntry,
    check_tree,
    parse_source,
    read_marketplace,
    read_plugin,
)
from marketplace.layer import (
    CURRENT_LINK,
    PLUGINS_DIR,
    RECORD_FILE,
    InstallRecord,
    LoadedPlugin,
    load_plugin,
    read_record,
)
from marketplace.mcp_config import SEPARATOR, plugin_prefix
from marketplace.model import BundleError
from marketplace.replica import STAGING_DIR, pack, point_current, root_lock
from marketplace.sources import describe_source, materialize_marketplace, resolve_plugin_source
from registry.errors import NotFoundError, UserError
from registry.persona import PermissionMode

__all__ = ["Conflict", "PluginManager", "parse_plugin_ref"]

MARKETPLACES_DIR = "marketplaces"
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")


class Conflict(UserError):
    """The change clashes with what is installed (HTTP 409)."""


def parse_plugin_ref(text: str) -> tuple[str, str]:
    """``plugin@marketplace`` → (plugin, marketplace)."""
    plugin, sep, market = text.strip().rpartition("@")
    if not sep or not plugin or not market:
        raise UserError(
            f"expected PLUGIN@MARKETPLACE (e.g. plugin-dev@claude-plugins), got {text!r}"
        )
    return plugin, market


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _content_hash(root: Path, files: list[Path]) -> str:
    h = hashlib.sha256()
    for rel in sorted(files, key=str):
        h.update(str(rel).encode() + b"\0")
        with (root / rel).open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()


def _copy_files(src: Path, dest: Path, files: list[Path]) -> None:
    """Copy the checked regular files; only the owner's execute bit survives (no setuid, no
    group or world write): scripts stay runnable, nothing else of the source's modes. Folders
    are 0755 whatever the umask, so a sandboxed script's user may read its bundle."""
    os.chmod(dest, 0o755)  # a staging folder is made 0700; the sandbox's user reads the copy
    for rel in files:
        target = dest / rel
        for folder in reversed(target.relative_to(dest).parents[:-1]):
            if not (dest / folder).is_dir():
                (dest / folder).mkdir()
                os.chmod(dest / folder, 0o755)
        origin = src / rel
        shutil.copyfile(origin, target, follow_symlinks=True)
        executable = os.stat(origin).st_mode & stat.S_IXUSR
        os.chmod(target, 0o755 if executable else 0o644)


def _dir_name(version: str, content_hash: str) -> str:
    label = re.sub(r"[^A-Za-z0-9._-]+", "-", version).strip("-.") or "unversioned"
    return f"{label[:40]}-{content_hash[:12]}"


@dataclass(frozen=True)
class _Grants:
    """What an install allows the plugin: its personas' highest mode, its MCP servers, the
    network, a writable folder."""

    allow_mode: str
    mcp: bool
    network: bool
    writable: bool


@dataclass(frozen=True)
class InstallOutcome:
    record: InstalledRecord
    plugin: LoadedPlugin
    changed: bool
    #: The cluster's registry version after the broadcast (0: nothing was broadcast).
    version: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.plugin.as_dict(),
            **self.record.as_dict(),
            "changed": self.changed,
            "registry_version": self.version,
        }


class PluginManager:
    """Marketplaces and plugins of one marketplace root and one database."""

    def __init__(
        self,
        root: Path,
        store: PluginStore,
        *,
        broadcast: Callable[[], int],
        allow_network: bool = False,
        git_timeout: float = 120.0,
        reserved_tools: Collection[str] = (),
        config_servers: Collection[str] = (),
    ) -> None:
        self.root = Path(root)
        self.store = store
        self._broadcast = broadcast
        self.allow_network = allow_network
        self.git_timeout = git_timeout
        #: The runtime's own tool names, and the config file's MCP servers: no plugin's name
        #: may meet them.
        self.reserved_tools = frozenset(reserved_tools)
        self.config_servers = frozenset(config_servers)

    # -- plumbing ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with root_lock(self.root):
            try:
                self._clean_staging()
                yield
            finally:
                self._prune()

    def _prune(self) -> None:
        """Folders the layout made and nothing uses any more go, so a removal leaves no trace
        but the lock file."""
        for name in (STAGING_DIR, PLUGINS_DIR, MARKETPLACES_DIR):
            with contextlib.suppress(OSError):
                (self.root / name).rmdir()  # only when empty

    def _announce(self, done: str) -> int:
        """Broadcast the reload of a change already made; if Redis cannot take it, say that the
        change stands and what to run once Redis answers (no process sees it until then)."""
        try:
            return self._broadcast()
        except Exception as exc:  # noqa: BLE001 - Redis errors of every kind, named below
            raise UserError(
                f"{done}, but the reload could not be broadcast ({type(exc).__name__}: {exc}); "
                "workers and API processes see it after the next reload: run `ongrid agents "
                "reload` once Redis answers"
            ) from None

    def _clean_staging(self) -> None:
        """Whatever a crashed install left staged is removed (the lock is held: no install of
        this root is running)."""
        staging = self.root / STAGING_DIR
        if staging.is_dir():
            for child in staging.iterdir():
                shutil.rmtree(child, ignore_errors=True)

    def _stage(self, prefix: str) -> Path:
        staging = self.root / STAGING_DIR
        staging.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir=staging))

    def _market(self, name: str) -> tuple[MarketplaceRecord, Marketplace]:
        record = self.store.marketplace(name)
        if record is None:
            known = [m.name for m in self.store.marketplaces()]
            raise NotFoundError("marketplace", name, known)
        return record, read_marketplace(Path(record.location))

    # -- marketplaces --------------------------------------------------------------------------

    def add_marketplace(self, source: str, *, name: str = "", user: str = "") -> dict[str, Any]:
        """Add (or refresh) a marketplace from a directory or a git repository."""
        if Path(source).exists():  # a path: recorded absolute, so every process finds it
            source = str(Path(source).resolve())
        with self._locked():
            work = self._stage("marketplace")
            try:
                location, kind, ref = materialize_marketplace(
                    source, work, allow_network=self.allow_network, timeout=self.git_timeout
                )
                market = read_marketplace(location)
                market_name = name or market.name
                if not _NAME.match(market_name):
                    raise UserError(
                        f"marketplace name {market_name!r}: expected lowercase letters, digits, "
                        "'.', '_' or '-' (at most 64), e.g. --name my-plugins"
                    )
                known = self.store.marketplace(market_name)
                if known is not None and known.source != source:
                    raise Conflict(
                        f"a marketplace named {market_name!r} is already added from "
                        f"{known.source}; remove it first, or add this one with --name"
                    )
                if kind == "git":
                    # The clone is kept in the root: installs and updates read it from there.
                    final = self.root / MARKETPLACES_DIR / market_name
                    final.parent.mkdir(parents=True, exist_ok=True)
                    old = final.with_name(f".{market_name}.old")
                    shutil.rmtree(old, ignore_errors=True)
                    if final.exists():
                        final.rename(old)
                    os.rename(location, final)
                    shutil.rmtree(old, ignore_errors=True)
                    location = final
                record = self.store.put_marketplace(
                    MarketplaceRecord(
                        name=market_name,
                        source=source,
                        kind=kind,
                        location=str(location),
                        ref=ref,
                        added_by=user,
                    )
                )
            finally:
                shutil.rmtree(work, ignore_errors=True)
        return self._market_view(record, read_marketplace(Path(record.location)))

    def _market_view(self, record: MarketplaceRecord, market: Marketplace) -> dict[str, Any]:
        return {
            **record.as_dict(),
            "owner": market.owner,
            "description": market.description,
            "plugins": len(market.plugins),
            "problems": [{"plugin": p, "reason": r} for p, r in market.problems],
        }

    def marketplaces(self) -> list[dict[str, Any]]:
        out = []
        for record in self.store.marketplaces():
            try:
                out.append(self._market_view(record, read_marketplace(Path(record.location))))
            except UserError as exc:
                out.append({**record.as_dict(), "error": str(exc)})
        return out

    def remove_marketplace(self, name: str) -> None:
        with self._locked():
            record = self.store.marketplace(name)
            if record is None:
                raise NotFoundError(
                    "marketplace", name, [m.name for m in self.store.marketplaces()]
                )
            users = [p.name for p in self.store.plugins() if p.marketplace == name]
            if users:
                raise Conflict(
                    f"plugins installed from marketplace {name!r}: {', '.join(users)}; remove "
                    "them first (ongrid plugins remove NAME)"
                )
            self.store.delete_marketplace(name)
            if record.kind == "git":
                shutil.rmtree(self.root / MARKETPLACES_DIR / name, ignore_errors=True)

    def available(self, marketplace: str = "") -> list[dict[str, Any]]:
        """Every plugin of every (or one) marketplace: reachable or why not, installed or not.
        Remote sources are not cloned to tell: without network access they are unreachable."""
        installed = {p.name: p for p in self.store.plugins()}
        names = [marketplace] if marketplace else [m.name for m in self.store.marketplaces()]
        out: list[dict[str, Any]] = []
        for market_name in names:
            _record, market = self._market(market_name)
            for entry in market.plugins:
                reason = self._unreachable(market, entry)
                have = installed.get(entry.name)
                out.append(
                    {
                        "name": entry.name,
                        "marketplace": market_name,
                        "description": entry.description,
                        "version": entry.version,
                        "category": entry.category,
                        "source": describe_source(entry),
                        "reachable": reason is None,
                        "unreachable_reason": reason,
                        "installed": have.version
                        if have and have.marketplace == market_name
                        else None,
                    }
                )
            out.extend(
                {
                    "name": plugin,
                    "marketplace": market_name,
                    "reachable": False,
                    "unreachable_reason": reason,
                }
                for plugin, reason in market.problems
            )
        return out

    def _unreachable(self, market: Marketplace, entry: PluginEntry) -> str | None:
        try:
            source = parse_source(entry.source, plugin_root=market.plugin_root)
        except BundleError as exc:
            return exc.reason
        if source.kind == "path":
            path = (market.root / (source.path or "")).resolve()
            if not path.is_relative_to(market.root.resolve()):
                return f"source {source.path!r} leaves the marketplace directory"
            return None if path.is_dir() else f"source directory {source.path!r} does not exist"
        url = source.url or ""
        local = url.startswith("file://") or url.startswith("/")
        if not local and not self.allow_network:
            return (
                f"remote source {url}: network sources are off (plugins_allow_network: true "
                "to clone them)"
            )
        return None

    # -- plugins -------------------------------------------------------------------------------

    def installed(self) -> list[dict[str, Any]]:
        """The installed plugins: the database's record and what their copy holds."""
        out = []
        for record in self.store.plugins():
            view: dict[str, Any] = record.as_dict()
            try:
                plugin_dir = Path(record.path)
                loaded = load_plugin(plugin_dir, read_record(plugin_dir))[0]
                view = {**loaded.as_dict(), **view}
            except UserError as exc:
                view["error"] = str(exc)
            out.append(view)
        return out

    def install(
        self,
        ref: str,
        *,
        allow_mode: str = PermissionMode.READ_ONLY.value,
        mcp: bool = True,
        network: bool = False,
        writable: bool = False,
        user: str = "",
    ) -> InstallOutcome:
        """Install ``plugin@marketplace``; the same plugin installed again is an update.
        ``network`` and ``writable`` grant its bundle code the network (through the workers'
        egress proxy) and its MCP servers a writable folder."""
        plugin, market_name = parse_plugin_ref(ref)
        try:
            PermissionMode(allow_mode)
        except ValueError:
            modes = ", ".join(m.value for m in PermissionMode)
            raise UserError(f"allow_mode: expected one of {modes}, got {allow_mode!r}") from None
        if SEPARATOR in plugin:
            raise UserError(
                f"plugin {plugin!r} cannot be installed: its name holds {SEPARATOR!r}, which "
                "separates a plugin's name from its tools' in tool names"
            )
        grants = _Grants(allow_mode, mcp, network, writable)
        with self._locked():
            outcome = self._install(plugin, market_name, grants, user=user)
        if outcome.changed:
            outcome = replace(outcome, version=self._announce(f"plugin {plugin!r} installed"))
        return outcome

    def _install(
        self, plugin: str, market_name: str, grants: _Grants, *, user: str
    ) -> InstallOutcome:
        record, market = self._market(market_name)
        entry = next((p for p in market.plugins if p.name == plugin), None)
        problem = next((why for name, why in market.problems if name == plugin), None)
        if entry is None and problem is not None:
            raise UserError(f"plugin {plugin!r} cannot be installed: {problem}")
        if entry is None:
            # The closest names, not all of them: a marketplace lists hundreds.
            close = difflib.get_close_matches(plugin, [p.name for p in market.plugins], n=5)
            raise NotFoundError("plugin", f"{plugin}@{market_name}", close)
        existing = self.store.plugin(plugin)
        if existing is not None and existing.marketplace != market_name:
            raise Conflict(
                f"plugin {plugin!r} is installed from marketplace {existing.marketplace!r}; "
                "remove it first to install it from another"
            )
        work = self._stage(f"fetch-{plugin}")
        staged = self._stage(f"install-{plugin}")
        try:
            resolved = resolve_plugin_source(
                market, entry, work, allow_network=self.allow_network, timeout=self.git_timeout
            )
            if resolved.path is None:
                raise UserError(f"plugin {plugin!r} cannot be installed: {resolved.unreachable}")
            try:
                files = check_tree(resolved.path)
            except BundleError as exc:
                raise BundleError(f"plugin {plugin!r} cannot be installed", str(exc)) from None
            _copy_files(resolved.path, staged, files)
            content_hash = _content_hash(staged, files)
            layout_version = _version_of(staged, entry)
            install = InstallRecord(
                name=plugin,
                version=layout_version,
                marketplace=market_name,
                source=describe_source(entry),
                ref=resolved.ref or record.ref,
                content_hash=content_hash,
                allowed_mode=grants.allow_mode,
                mcp=grants.mcp,
                network=grants.network,
                writable=grants.writable,
                installed_by=user,
                installed_at=_now(),
                entry=dict(entry.raw),
            )
            _write_record(staged, install)
            loaded = load_plugin(staged, install)[0]  # refuses a layout no reload could read
            self._refuse_collisions(plugin, loaded)
            return self._commit(plugin, staged, install, loaded, existing)
        finally:
            shutil.rmtree(work, ignore_errors=True)
            shutil.rmtree(staged, ignore_errors=True)

    def _refuse_collisions(self, plugin: str, loaded: LoadedPlugin) -> None:
        """:class:`Conflict` naming every name of ``plugin`` that another already holds."""
        prefix = plugin_prefix(plugin)
        clashes = [
            f"plugin {other.name!r} (its tools and servers are named {prefix}__…)"
            for other in self.store.plugins()
            if other.name != plugin and plugin_prefix(other.name) == prefix
        ]
        if prefix in {plugin_prefix(s) for s in self.config_servers}:
            clashes.append(f"the config file's MCP server {prefix!r} (tools mcp__{prefix}__…)")
        clashes += [f"the runtime's tool {t!r}" for t in loaded.tools if t in self.reserved_tools]
        if clashes:
            raise Conflict(
                f"plugin {plugin!r} cannot be installed: its names would meet those of "
                f"{'; '.join(clashes)}; nothing was changed"
            )

    def _commit(
        self,
        plugin: str,
        staged: Path,
        install: InstallRecord,
        loaded: LoadedPlugin,
        existing: InstalledRecord | None,
    ) -> InstallOutcome:
        home = self.root / PLUGINS_DIR / plugin
        final = home / _dir_name(install.version, install.content_hash)
        link = home / CURRENT_LINK
        previous = link.resolve() if link.is_symlink() else None
        same = (
            existing is not None
            and existing.content_hash == install.content_hash
            and existing.allowed_mode == install.allowed_mode
            and existing.mcp == install.mcp
            and existing.network == install.network
            and existing.writable == install.writable
            and previous == final
        )
        if same and existing is not None:
            if self.store.archive(plugin) is None:
                # Installed before copies were stored: store this one, for the other hosts.
                self.store.put_plugin(existing, pack(final))
            return InstallOutcome(existing, load_plugin(final, read_record(final))[0], False)
        home.mkdir(parents=True, exist_ok=True)
        if final.exists():  # the same content, installed before with other options
            shutil.rmtree(final)
        os.rename(staged, final)
        point_current(link, final.name)
        row = InstalledRecord(
            name=plugin,
            marketplace=install.marketplace,
            version=install.version,
            source=install.source,
            ref=install.ref,
            content_hash=install.content_hash,
            path=str(final),
            allowed_mode=install.allowed_mode,
            mcp=install.mcp,
            installed_by=install.installed_by,
            network=install.network,
            writable=install.writable,
        )
        try:
            # The copy every other host unpacks, in the same transaction as the record.
            stored = self.store.put_plugin(row, pack(final))
        except Exception:
            # The database did not take the record: put the previous version back.
            if previous is not None and previous.is_dir():
                point_current(link, previous.name)
            else:
                link.unlink(missing_ok=True)
            shutil.rmtree(final, ignore_errors=True)
            with contextlib.suppress(OSError):
                home.rmdir()  # a first install leaves no empty folder behind
            raise
        for old in home.iterdir():
            if old.name not in {CURRENT_LINK, final.name}:
                shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink()
        # Read again where it now is, so the paths it reports are those a reload sees.
        return InstallOutcome(stored, load_plugin(final, install)[0], True)

    def remove(self, plugin: str) -> int:
        """Uninstall: the record, the files, and then a reload broadcast. Returns the cluster's
        registry version after it."""
        with self._locked():
            record = self.store.plugin(plugin)
            home = self.root / PLUGINS_DIR / plugin
            if record is None and not home.exists():
                raise NotFoundError(
                    "installed plugin", plugin, [p.name for p in self.store.plugins()]
                )
            # The link first: a reload from now on no longer sees the plugin.
            (home / CURRENT_LINK).unlink(missing_ok=True)
            self.store.delete_plugin(plugin)
            shutil.rmtree(home, ignore_errors=True)
        return self._announce(f"plugin {plugin!r} removed")

    def update(self, plugin: str = "", *, user: str = "") -> list[dict[str, Any]]:
        """Install again from its marketplace every (or one) installed plugin, keeping the
        options it was installed with. A git marketplace is fetched again first."""
        records = self.store.plugins()
        if plugin:
            records = [r for r in records if r.name == plugin]
            if not records:
                raise NotFoundError(
                    "installed plugin", plugin, [p.name for p in self.store.plugins()]
                )
        refreshed: set[str] = set()
        results: list[dict[str, Any]] = []
        for record in records:
            market = self.store.marketplace(record.marketplace)
            if market is not None and market.kind == "git" and market.name not in refreshed:
                self.add_marketplace(market.source, name=market.name, user=user)
                refreshed.add(market.name)
            try:
                outcome = self.install(
                    f"{record.name}@{record.marketplace}",
                    allow_mode=record.allowed_mode,
                    mcp=record.mcp,
                    network=record.network,
                    writable=record.writable,
                    user=user or record.installed_by,
                )
            except UserError as exc:
                results.append({"name": record.name, "updated": False, "error": str(exc)})
                continue
            results.append(
                {
                    "name": record.name,
                    "updated": outcome.changed,
                    "version": outcome.record.version,
                    "content_hash": outcome.record.content_hash,
                }
            )
        return results


def _version_of(root: Path, entry: PluginEntry) -> str:
    return read_plugin(root, entry).version or entry.version or ""


def _write_record(directory: Path, record: InstallRecord) -> None:
    (directory / RECORD_FILE).write_text(
        json.dumps(record.as_dict(), indent=2, sort_keys=True), encoding="utf-8"
    )
