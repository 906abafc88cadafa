"""What was installed from where: the ``marketplaces``, ``installed_plugins`` and
``plugin_archives`` tables.

The installed files live in the marketplace root of the host that installed them
(:mod:`coordinator.plugin_manager`); the rows are the record an administrator audits: which
marketplace a plugin came from, its source, the git commit or content hash that was copied, the
permission mode the installer allowed, who installed it and when. A row is written only after its
files are in place, and removed before they are.

``plugin_archives`` carries the installed copy itself, packed (:func:`marketplace.replica.pack`),
written in the same transaction as its ``installed_plugins`` row: every other host unpacks it into
its own marketplace root (:func:`marketplace.replica.sync_installed`), so no filesystem needs to
be shared between hosts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Boolean,
    Engine,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    delete,
    select,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

from coordinator.storage.columns import NAMING_CONVENTION, UtcDateTime, utcnow
from marketplace.replica import Archive, Published

__all__ = ["PLUGINS_METADATA", "InstalledRecord", "MarketplaceRecord", "PluginStore"]


class _Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UtcDateTime}


class _MarketplaceRow(_Base):
    __tablename__ = "marketplaces"

    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    #: What the administrator gave: a directory, a git path or URL.
    source: Mapped[str] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(String(16))
    #: Where it is read from: the directory itself, or the clone in the marketplace root.
    location: Mapped[str] = mapped_column(Text)
    #: The git commit of the clone, or the hash of marketplace.json for a directory.
    ref: Mapped[str] = mapped_column(Text)
    added_by: Mapped[str] = mapped_column(Text)
    added_at: Mapped[datetime] = mapped_column()


class _PluginRow(_Base):
    __tablename__ = "installed_plugins"

    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    marketplace: Mapped[str] = mapped_column(String(255))
    version: Mapped[str] = mapped_column(Text)
    source: Mapped[str] = mapped_column(Text)
    ref: Mapped[str] = mapped_column(Text)
    content_hash: Mapped[str] = mapped_column(String(64))
    #: The installed directory (``<root>/plugins/<name>/<version>-<hash>``).
    path: Mapped[str] = mapped_column(Text)
    allowed_mode: Mapped[str] = mapped_column(String(32))
    mcp: Mapped[bool] = mapped_column(Boolean)
    network: Mapped[bool] = mapped_column(Boolean, default=False)
    writable: Mapped[bool] = mapped_column(Boolean, default=False)
    installed_by: Mapped[str] = mapped_column(Text)
    installed_at: Mapped[datetime] = mapped_column()


class _ArchiveRow(_Base):
    __tablename__ = "plugin_archives"

    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    #: The installed directory's name (``<version>-<hash>``), the same on every host.
    directory: Mapped[str] = mapped_column(String(255))
    sha256: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(Integer)
    archive: Mapped[bytes] = mapped_column(LargeBinary)


#: The tables' metadata, for Alembic.
PLUGINS_METADATA = _Base.metadata


@dataclass(frozen=True)
class MarketplaceRecord:
    name: str
    source: str
    kind: str
    location: str
    ref: str
    added_by: str = ""
    added_at: datetime | None = None

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["added_at"] = self.added_at.isoformat() if self.added_at else None
        return data


@dataclass(frozen=True)
class InstalledRecord:
    name: str
    marketplace: str
    version: str
    source: str
    ref: str
    content_hash: str
    path: str
    allowed_mode: str
    mcp: bool
    installed_by: str = ""
    installed_at: datetime | None = None
    #: Granted at install: the network (through the workers' egress proxy) and a writable
    #: folder for its MCP servers.
    network: bool = False
    writable: bool = False

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["installed_at"] = self.installed_at.isoformat() if self.installed_at else None
        return data


class PluginStore:
    """Reads and writes the two tables. Each method is one transaction."""

    def __init__(self, engine: Engine) -> None:
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    # -- marketplaces ---------------------------------------------------------------------------

    def marketplaces(self) -> list[MarketplaceRecord]:
        with self._sessions() as db:
            rows = db.scalars(select(_MarketplaceRow).order_by(_MarketplaceRow.name)).all()
            return [_market(row) for row in rows]

    def marketplace(self, name: str) -> MarketplaceRecord | None:
        with self._sessions() as db:
            row = db.get(_MarketplaceRow, name)
            return _market(row) if row is not None else None

    def put_marketplace(self, record: MarketplaceRecord) -> MarketplaceRecord:
        values = asdict(record)
        values["added_at"] = record.added_at or utcnow()
        with self._sessions.begin() as db:
            db.merge(_MarketplaceRow(**values))
        return MarketplaceRecord(**values)

    def delete_marketplace(self, name: str) -> bool:
        with self._sessions.begin() as db:
            done = db.execute(delete(_MarketplaceRow).where(_MarketplaceRow.name == name))
            return bool(getattr(done, "rowcount", 0))

    # -- installed plugins ----------------------------------------------------------------------

    def plugins(self) -> list[InstalledRecord]:
        with self._sessions() as db:
            rows = db.scalars(select(_PluginRow).order_by(_PluginRow.name)).all()
            return [_plugin(row) for row in rows]

    def plugin(self, name: str) -> InstalledRecord | None:
        with self._sessions() as db:
            row = db.get(_PluginRow, name)
            return _plugin(row) if row is not None else None

    def put_plugin(
        self, record: InstalledRecord, archive: Archive | None = None
    ) -> InstalledRecord:
        """Write the record and, in the same transaction, the installed copy other hosts
        unpack (``None``: leave the stored copy as it is)."""
        values = asdict(record)
        values["installed_at"] = record.installed_at or utcnow()
        with self._sessions.begin() as db:
            db.merge(_PluginRow(**values))
            if archive is not None:
                db.merge(
                    _ArchiveRow(
                        name=record.name,
                        directory=archive.directory,
                        sha256=archive.sha256,
                        size=len(archive.data),
                        archive=archive.data,
                    )
                )
        return InstalledRecord(**values)

    def delete_plugin(self, name: str) -> bool:
        with self._sessions.begin() as db:
            db.execute(delete(_ArchiveRow).where(_ArchiveRow.name == name))
            done = db.execute(delete(_PluginRow).where(_PluginRow.name == name))
            return bool(getattr(done, "rowcount", 0))

    # -- the installed copies, for every host (marketplace.replica.PluginSource) ---------------

    def published(self) -> list[Published]:
        """Each installed plugin with the directory and digest of its stored copy (empty
        directory and digest: installed before copies were stored)."""
        with self._sessions() as db:
            rows = db.execute(
                select(_PluginRow.name, _ArchiveRow.directory, _ArchiveRow.sha256)
                .join(_ArchiveRow, _ArchiveRow.name == _PluginRow.name, isouter=True)
                .order_by(_PluginRow.name)
            ).all()
        return [Published(name, directory or "", sha256 or "") for name, directory, sha256 in rows]

    def archive(self, name: str) -> Archive | None:
        with self._sessions() as db:
            row = db.get(_ArchiveRow, name)
            return Archive(row.directory, row.sha256, row.archive) if row is not None else None


def _market(row: _MarketplaceRow) -> MarketplaceRecord:
    return MarketplaceRecord(
        name=row.name,
        source=row.source,
        kind=row.kind,
        location=row.location,
        ref=row.ref,
        added_by=row.added_by,
        added_at=row.added_at,
    )


def _plugin(row: _PluginRow) -> InstalledRecord:
    return InstalledRecord(
        name=row.name,
        marketplace=row.marketplace,
        version=row.version,
        source=row.source,
        ref=row.ref,
        content_hash=row.content_hash,
        path=row.path,
        allowed_mode=row.allowed_mode,
        mcp=row.mcp,
        installed_by=row.installed_by,
        installed_at=row.installed_at,
        network=row.network,
        writable=row.writable,
    )
