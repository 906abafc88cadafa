"""Installed plugins reach a host that shares no files with the installer: through the database.

A :class:`PluginManager` installs into one marketplace root (the API's host); another root (a
worker's host) is made to match with :func:`sync_installed` from the same migrated SQLite file.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import re
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_layer import Counter, Market, agent, full_plugin

from coordinator.plugin_manager import PluginManager
from coordinator.storage.engine import make_engine, upgrade
from coordinator.storage.plugins import InstalledRecord, PluginStore
from marketplace.layer import CURRENT_LINK, PLUGINS_DIR, read_bundles
from marketplace.model import MAX_BUNDLE_FILES
from marketplace.replica import REPLICA_MARK, Archive, pack, sync_installed
from registry.defaults import build_registry
from registry.settings import Settings


@pytest.fixture
def store(tmp_path: Path) -> Iterator[PluginStore]:
    engine = make_engine(f"sqlite:///{tmp_path / 'ongrid.db'}")
    upgrade(engine)
    yield PluginStore(engine)
    engine.dispose()


@pytest.fixture
def api_root(tmp_path: Path) -> Path:
    return tmp_path / "api-host"


@pytest.fixture
def worker_root(tmp_path: Path) -> Path:
    return tmp_path / "worker-host"


@pytest.fixture
def market(tmp_path: Path) -> Market:
    return Market(tmp_path / "market")


@pytest.fixture
def manager(api_root: Path, store: PluginStore, market: Market) -> PluginManager:
    manager = PluginManager(api_root, store, broadcast=Counter())
    full_plugin(market)
    manager.add_marketplace(str(market.root))
    return manager


def files_of(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()
    }


def installed(root: Path, plugin: str = "ops") -> Path:
    return (root / PLUGINS_DIR / plugin / CURRENT_LINK).resolve()


def test_an_install_reaches_another_root_byte_for_byte_and_a_second_sync_does_nothing(
    manager: PluginManager, store: PluginStore, api_root: Path, worker_root: Path
) -> None:
    manager.install("ops@team")
    result = sync_installed(worker_root, store)
    assert (result.unpacked, result.removed, result.problems) == (["ops"], [], [])
    ours, theirs = installed(api_root), installed(worker_root)
    assert ours.name == theirs.name and files_of(ours) == files_of(theirs)
    assert (theirs / "skills" / "s" / "scripts" / "hello.sh").stat().st_mode & 0o100
    assert [p.name for p in read_bundles(worker_root).personas] == ["ops:x"]
    again = sync_installed(worker_root, store)
    assert (again.unpacked, again.removed, again.problems) == ([], [], [])


def test_an_update_replaces_the_copy_and_a_removal_removes_it(
    manager: PluginManager, store: PluginStore, market: Market, worker_root: Path
) -> None:
    manager.install("ops@team")
    sync_installed(worker_root, store)
    first = installed(worker_root)
    agent(market.root / "plugins" / "ops", "x", body="You are x, second edition.")
    manager.update("ops")
    assert sync_installed(worker_root, store).unpacked == ["ops"]
    second = installed(worker_root)
    assert second != first and not first.exists()
    (persona,) = read_bundles(worker_root).personas
    assert "second edition" in persona.body
    manager.remove("ops")
    assert sync_installed(worker_root, store).removed == ["ops"]
    assert not (worker_root / PLUGINS_DIR).exists()
    assert read_bundles(worker_root).personas == ()


def test_on_a_shared_root_nothing_is_unpacked_and_the_installers_copy_is_never_removed(
    manager: PluginManager, store: PluginStore, api_root: Path
) -> None:
    manager.install("ops@team")
    assert sync_installed(api_root, store).unpacked == []
    assert not (api_root / PLUGINS_DIR / "ops" / REPLICA_MARK).exists()
    store.delete_plugin("ops")  # as if removed elsewhere: only a copy the sync made goes
    assert sync_installed(api_root, store).removed == []
    assert installed(api_root).is_dir()


def _put_archive(store: PluginStore, record: InstalledRecord, data: bytes, directory: str) -> None:
    store.put_plugin(record, Archive(directory, hashlib.sha256(data).hexdigest(), data))


def _tar(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for info, body in members:
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    return buffer.getvalue()


def _link(name: str, target: str) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    return info, b""


def _device(name: str) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 1, 3
    return info, b""


@pytest.mark.parametrize(
    ("archive", "reason"),
    [
        (_tar((tarfile.TarInfo("../escape.md"), b"x")), "outside the destination"),
        (_tar(_link("agents/passwd.md", "/etc/passwd")), "not a regular file"),
        (_tar(_device("agents/null.md")), "not a regular file"),
    ],
    ids=["dot-dot", "symlink", "device"],
)
def test_a_hostile_stored_copy_is_refused_and_the_previous_copy_stays(
    manager: PluginManager,
    store: PluginStore,
    worker_root: Path,
    tmp_path: Path,
    archive: bytes,
    reason: str,
) -> None:
    manager.install("ops@team")
    sync_installed(worker_root, store)
    before = files_of(installed(worker_root))
    record = store.plugin("ops")
    assert record is not None
    _put_archive(store, record, archive, "9.9.9-hostile")
    result = sync_installed(worker_root, store)
    ((name, why),) = result.problems
    assert name == "ops"

    assert re.search(reason, why), why
    assert files_of(installed(worker_root)) == before
    assert not (tmp_path / "escape.md").exists() and not list(worker_root.rglob("passwd.md"))
    assert not (worker_root / ".staging").exists()


def test_a_damaged_copy_and_a_missing_one_are_named(
    manager: PluginManager, store: PluginStore, api_root: Path, worker_root: Path
) -> None:
    manager.install("ops@team")
    record = store.plugin("ops")
    assert record is not None
    good = pack(installed(api_root))
    store.put_plugin(record, Archive(good.directory, "0" * 64, good.data))
    ((_, why),) = sync_installed(worker_root, store).problems
    assert "damaged" in why
    store.delete_plugin("ops")
    store.put_plugin(record)  # a record with no copy: installed by an older version
    ((_, why),) = sync_installed(worker_root, store).problems
    assert "ongrid plugins update" in why
    assert not (worker_root / PLUGINS_DIR).exists()
    # What the message says to do stores the copy, though nothing else changed.
    assert [u["updated"] for u in manager.update("ops")] == [False]
    assert sync_installed(worker_root, store).unpacked == ["ops"]


def test_the_same_files_pack_to_the_same_bytes(manager: PluginManager, api_root: Path) -> None:
    manager.install("ops@team")
    assert pack(installed(api_root)) == pack(installed(api_root))


def test_a_registry_with_the_database_unpacks_at_each_reload_and_a_dead_database_is_a_warning(
    manager: PluginManager, store: PluginStore, market: Market, worker_root: Path, tmp_path: Path
) -> None:
    settings = Settings(
        agents_dir=tmp_path / "agents", marketplace_root=worker_root, shipped_agents=False
    )
    registry = build_registry(settings, plugins=store)
    assert "ops:x" not in registry.snapshot().personas
    manager.install("ops@team")
    assert "ops:x" in registry.reload().personas

    class Down:
        def published(self) -> list[object]:
            raise ConnectionError("connection refused")

        def archive(self, name: str) -> None:
            return None

    offline = build_registry(settings, plugins=Down())
    snapshot = offline.snapshot()
    assert "ops:x" in snapshot.personas  # the copy this host holds
    assert any("could not be read from the database" in w.reason for w in snapshot.warnings)


def test_a_copy_with_too_many_members_is_refused_without_reading_past_the_limit(
    manager: PluginManager, store: PluginStore, worker_root: Path
) -> None:
    manager.install("ops@team")
    record = store.plugin("ops")
    assert record is not None
    members = [(tarfile.TarInfo(f"agents/f{i}.md"), b"") for i in range(MAX_BUNDLE_FILES + 1)]
    whole = _tar(*members, (tarfile.TarInfo("agents/last.md"), b"x" * 100_000))
    # Cut short: an unpacker that listed every member before counting would fail on the cut
    # (a read error) instead of refusing at the first member over the limit.
    cut = gzip.compress(gzip.decompress(whole)[:-50_000])
    _put_archive(store, record, cut, "9.9.9-many")
    ((name, why),) = sync_installed(worker_root, store).problems
    assert name == "ops" and f"more than {MAX_BUNDLE_FILES} files" in why, why
    assert not (worker_root / PLUGINS_DIR / "ops").exists()


def test_a_plugin_name_from_the_database_is_checked_before_it_becomes_a_path(
    manager: PluginManager, store: PluginStore, worker_root: Path, tmp_path: Path
) -> None:
    manager.install("ops@team")
    record = store.plugin("ops")
    archive = store.archive("ops")
    assert record is not None and archive is not None
    store.put_plugin(dataclasses.replace(record, name="../../x"), archive)
    result = sync_installed(worker_root, store)
    assert result.unpacked == ["ops"]
    ((name, why),) = result.problems
    assert name == "../../x" and "not a valid plugin name" in why
    assert not (tmp_path / "x").exists() and not (worker_root.parent / "x").exists()
