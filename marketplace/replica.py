"""Installed plugins on every host: packed into the database at install, unpacked at reload.

The host that installs a plugin (the API's, :mod:`coordinator.plugin_manager`) writes the
installed copy into its own marketplace root and, in the same transaction as its record, a packed
copy (:func:`pack`) into the database. Every process that reads plugins (workers, other API
processes) calls :func:`sync_installed` before it reads its root at a reload: a plugin whose
stored copy is not the one its root holds is unpacked there, and a copy this function made for a
plugin no longer installed is removed. So a reload broadcast after an install or a removal reaches
workers on other machines without a shared volume.

What is unpacked gets the checks an install gets: only regular files and folders, no path out of
the plugin's folder, the bundle limits of :mod:`marketplace.model` (counted from the archive's
headers before anything is written), and the digest the database recorded. A copy that fails is a
problem named in the result; the plugin's previous copy, if any, stays.

On one host where the API and the workers share a root, the API's copy is the one the database
names and nothing is unpacked. Every change to a root happens under its lock file, the one the
installer takes, so a reload never sees half an install.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import logging
import os
import shutil
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Protocol

from marketplace._files import check_tree
from marketplace.formats import MAX_NAME, NAME
from marketplace.layer import CURRENT_LINK, PLUGINS_DIR
from marketplace.model import MAX_BUNDLE_BYTES, MAX_BUNDLE_FILES, MAX_FILE_BYTES, BundleError
from registry.errors import UserError

__all__ = [
    "LOCK_FILE",
    "REPLICA_MARK",
    "STAGING_DIR",
    "Archive",
    "PluginSource",
    "Published",
    "SyncResult",
    "pack",
    "point_current",
    "root_lock",
    "sync_installed",
]

log = logging.getLogger(__name__)

#: The root's lock file: installs, removals and syncs of one root take turns on it.
LOCK_FILE = ".lock"
STAGING_DIR = ".staging"
#: In ``<root>/plugins/<name>/``: this copy was unpacked from the database (the sync may remove
#: it when the plugin is uninstalled); a copy without it was installed on this host.
REPLICA_MARK = ".replica"


@dataclass(frozen=True)
class Archive:
    """An installed copy, packed: its directory name (``<version>-<hash>``), digest, bytes."""

    directory: str
    sha256: str
    data: bytes


@dataclass(frozen=True)
class Published:
    """An installed plugin as the database lists it (empty ``directory``: no stored copy)."""

    name: str
    directory: str
    sha256: str


class PluginSource(Protocol):
    """Where the installed plugins are listed and their copies read (the database)."""

    def published(self) -> list[Published]: ...

    def archive(self, name: str) -> Archive | None: ...


@dataclass
class SyncResult:
    unpacked: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    #: (plugin, why its stored copy could not be used)
    problems: list[tuple[str, str]] = field(default_factory=list)


@contextlib.contextmanager
def root_lock(root: Path) -> Iterator[None]:
    """Hold ``root``'s lock file (made with the root when missing)."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        handle = (root / LOCK_FILE).open("a")
    except OSError as exc:
        raise UserError(
            f"the marketplace root {root} is not writable ({exc.strerror}): set "
            "ONGRID_MARKETPLACE_ROOT (marketplace_root) to a directory this process may write"
        ) from None
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def point_current(link: Path, target: str) -> None:
    """Point ``link`` at ``target`` (a sibling) in one atomic rename."""
    temporary = link.with_name(f".{link.name}.{os.getpid()}")
    temporary.unlink(missing_ok=True)
    os.symlink(target, temporary)
    os.replace(temporary, link)


def pack(directory: Path) -> Archive:
    """The installed copy in ``directory`` as a gzipped tar: its checked files in name order,
    no owners, no times (the same files always pack to the same bytes)."""
    files = check_tree(directory)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for rel in sorted(files, key=str):
            path = directory / rel
            info = tarfile.TarInfo(PurePosixPath(*rel.parts).as_posix())
            info.size = path.stat().st_size
            info.mode = 0o755 if os.access(path, os.X_OK) else 0o644
            info.mtime = 0
            with path.open("rb") as handle:
                tar.addfile(info, handle)
    data = buffer.getvalue()
    return Archive(directory.name, hashlib.sha256(data).hexdigest(), data)


def sync_installed(root: Path, source: PluginSource) -> SyncResult:
    """Make ``root``'s installed plugins those ``source`` lists. Never raises for one plugin;
    raises when ``source`` cannot be read at all (the caller keeps what the root holds)."""
    result = SyncResult()
    wanted: dict[str, Published] = {}
    for plugin in source.published():
        # A name from the database is checked as an install checks it before it becomes a
        # path: a row named '../../x' must not write outside the root.
        problem = _bad_name(plugin.name)
        if problem:
            result.problems.append((plugin.name[:80], problem))
        else:
            wanted[plugin.name] = plugin
    base = root / PLUGINS_DIR
    if not wanted and not base.is_dir():
        return result  # nothing installed anywhere: not even the lock file is made
    with root_lock(root):
        for plugin in wanted.values():
            if not plugin.directory:
                if not (base / plugin.name / CURRENT_LINK).is_dir():
                    result.problems.append(
                        (
                            plugin.name,
                            "the database holds no copy of it (installed by an older version): "
                            "run `ongrid plugins update` on the host that installed it",
                        )
                    )
                continue
            if _current(base / plugin.name) == plugin.directory:
                continue
            try:
                _unpack_plugin(root, plugin, source)
            except (BundleError, UserError, OSError, tarfile.TarError) as exc:
                result.problems.append((plugin.name, str(exc)))
            else:
                result.unpacked.append(plugin.name)
        for home in sorted(base.iterdir()) if base.is_dir() else ():
            if home.name in wanted or not (home / REPLICA_MARK).exists():
                continue
            (home / CURRENT_LINK).unlink(missing_ok=True)  # a reload no longer sees it
            shutil.rmtree(home, ignore_errors=True)
            result.removed.append(home.name)
        with contextlib.suppress(OSError):
            base.rmdir()  # only when empty
    for name in result.unpacked:
        log.info("plugin %s unpacked from the database into %s", name, root)
    for name in result.removed:
        log.info("plugin %s removed from %s: it is no longer installed", name, root)
    return result


def _bad_name(name: str) -> str:
    """Why ``name`` (read from the database) is not a plugin name an install accepts, or ``""``."""
    if len(name) > MAX_NAME or not NAME.match(name):
        return f"its name {name[:80]!r} is not a valid plugin name: the database row is refused"
    return ""


def _current(home: Path) -> str | None:
    link = home / CURRENT_LINK
    return os.readlink(link) if link.is_symlink() and link.is_dir() else None


def _unpack_plugin(root: Path, plugin: Published, source: PluginSource) -> None:
    archive = source.archive(plugin.name)
    if archive is None:
        raise UserError("its copy is gone from the database (removed meanwhile?)")
    digest = hashlib.sha256(archive.data).hexdigest()
    if digest != archive.sha256 or archive.sha256 != plugin.sha256:
        raise UserError(f"its stored copy is damaged (sha256 {digest}, recorded {plugin.sha256})")
    if PurePosixPath(archive.directory).name != archive.directory or archive.directory in {
        "",
        ".",
        "..",
        CURRENT_LINK,
    }:
        raise UserError(f"its stored directory name {archive.directory!r} is not a plain name")
    staging = root / STAGING_DIR
    staging.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"sync-{plugin.name}-", dir=staging))
    try:
        _extract(archive.data, work)
        check_tree(work)  # the limits and file kinds an install checks, on what was written
        home = root / PLUGINS_DIR / plugin.name
        home.mkdir(parents=True, exist_ok=True)
        (home / REPLICA_MARK).touch()
        final = home / archive.directory
        if final.exists():
            shutil.rmtree(final)
        os.chmod(work, 0o755)
        os.rename(work, final)
        point_current(home / CURRENT_LINK, final.name)
        for old in home.iterdir():
            if old.name not in {CURRENT_LINK, REPLICA_MARK, final.name}:
                shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink()
    finally:
        shutil.rmtree(work, ignore_errors=True)
        with contextlib.suppress(OSError):
            staging.rmdir()


def _extract(data: bytes, dest: Path) -> None:
    """Unpack regular files only, counted against the bundle limits before one is written.

    The headers are read one at a time and counted as they come: an archive of a million tiny
    members is refused at member :data:`MAX_BUNDLE_FILES` + 1, never listed whole."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        members: list[tarfile.TarInfo] = []
        total = 0
        while (member := tar.next()) is not None:
            if len(members) == MAX_BUNDLE_FILES:
                raise BundleError("the stored copy", f"holds more than {MAX_BUNDLE_FILES} files")
            if not member.isfile():
                raise BundleError(member.name, "not a regular file")
            if member.size > MAX_FILE_BYTES:
                raise BundleError(member.name, f"larger than {MAX_FILE_BYTES} bytes")
            total += member.size
            if total > MAX_BUNDLE_BYTES:
                raise BundleError(f"{total} bytes", f"more than {MAX_BUNDLE_BYTES} in all")
            members.append(member)
        # The "data" filter refuses absolute names, "..", links and devices, and drops modes
        # beyond the owner's: what a checked install could have written, nothing else.
        tar.extractall(dest, members=members, filter="data")
    for folder in (p for p in dest.rglob("*") if p.is_dir()):
        os.chmod(folder, 0o755)  # the sandbox's user reads the copy, as an install's
