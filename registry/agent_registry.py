"""The persona registry: builtin → disk → user, merged into immutable snapshots.

Readers take :meth:`AgentRegistry.snapshot` once and keep it for the whole turn or spawn: a reload
builds a new :class:`Snapshot` aside and swaps one reference, so nobody sees half of a reload.

Collision rules (SPEC §3): a user persona shadows a builtin or disk one of the same name (that is
how a builtin is overridden). Two disk files with one name: the first loaded is kept and the other
is a warning; a disk file named like a builtin is a warning too and the builtin is kept.

The shipped root (the personas installed with the package) is read first among the disk roots,
and a file of the same name in a later root overrides a shipped persona, with a warning. One file
reached through two roots, or a byte-identical copy of a shipped file, is loaded once and is no
warning.
"""

from __future__ import annotations

import builtins
import hashlib
import os
import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

from registry.errors import FieldProblem, NotFoundError, PersonaError, ReadOnlyError
from registry.gates import Gate
from registry.parser import dump_persona, load_persona_file
from registry.persona import NON_FILE_FIELDS, PLUGIN_NAME_RESERVED, Persona, Source

__all__ = [
    "AgentRegistry",
    "BundleLayer",
    "InMemoryUserStore",
    "LoadWarning",
    "Snapshot",
    "UserStore",
    "load_directory",
    "read_only_reason",
]


@dataclass(frozen=True)
class LoadWarning:
    """A load problem: the file (or other origin) and what is wrong with it."""

    path: str
    reason: str

    def as_dict(self) -> dict[str, str]:
        return {"path": self.path, "reason": self.reason}


class BundleLayer(Protocol):
    """What installed plugins add to a snapshot (:mod:`marketplace.layer` builds it): their
    personas and load problems for the registry, and the rest (skills, tools, MCP servers) for
    the processes that run spawns."""

    @property
    def personas(self) -> Sequence[Persona]: ...

    @property
    def warnings(self) -> Sequence[LoadWarning]: ...

    @property
    def digest(self) -> str: ...


class UserStore(Protocol):
    """Where user personas live (a database table in production)."""

    def list(self) -> list[Persona]: ...

    def upsert(self, persona: Persona, user: str = "") -> None: ...

    def delete(self, name: str) -> bool: ...

    def problems(self) -> builtins.list[tuple[str, str]]:
        """(name, reason) of stored personas the last :meth:`list` could not load."""
        ...


class InMemoryUserStore:
    """A :class:`UserStore` in a dict, for tests and for running without a database."""

    def __init__(self, personas: Iterable[Persona] = ()) -> None:
        self._items: dict[str, Persona] = {p.name: p for p in personas}
        self._lock = threading.Lock()

    def list(self) -> list[Persona]:
        with self._lock:
            return list(self._items.values())

    def upsert(self, persona: Persona, user: str = "") -> None:
        with self._lock:
            self._items[persona.name] = persona

    def delete(self, name: str) -> bool:
        with self._lock:
            return self._items.pop(name, None) is not None

    def problems(self) -> builtins.list[tuple[str, str]]:
        return []


@dataclass(frozen=True)
class Snapshot:
    """One consistent view of the registry. Never mutated after it is built."""

    version: int
    personas: Mapping[str, Persona]
    warnings: tuple[LoadWarning, ...] = ()
    unavailable: Mapping[str, str] = field(default_factory=dict)
    shadowed: Mapping[str, Source] = field(default_factory=dict)
    #: Why each builtin or disk persona cannot be edited here (see :func:`read_only_reason`).
    read_only: Mapping[str, str] = field(default_factory=dict)
    digest: str = ""
    #: What installed plugins bring besides personas (skills, tools, MCP servers), read in the
    #: same reload; ``None`` when the registry reads no marketplace root.
    bundle: Any = None

    def get(self, name: str) -> Persona:
        try:
            return self.personas[name]
        except KeyError:
            raise NotFoundError("agent", name, sorted(self.personas)) from None

    def names(self) -> list[str]:
        return sorted(self.personas)

    def describe(self, persona: Persona) -> dict[str, Any]:
        """A JSON-ready view: every field plus ``source``, ``path``, availability, shadowing."""
        data = persona.model_dump(mode="json")
        data["available"] = persona.name not in self.unavailable
        data["unavailable_reason"] = self.unavailable.get(persona.name)
        data["shadows"] = self.shadowed.get(persona.name)
        data["editable"] = persona.name not in self.read_only
        data["read_only_reason"] = self.read_only.get(persona.name)
        data["plugin"] = persona.plugin
        return data


def read_only_reason(persona: Persona, *, shipped: bool = False) -> str | None:
    """Why ``persona`` cannot be changed or deleted through the registry, and what to do
    instead; ``None`` for a user persona. ``shipped``: a disk persona from the shipped root.

    One message for both the refusal (:class:`ReadOnlyError`) and the listing, so a reader is
    told before an edit what the edit would be refused with."""
    name = persona.name
    if persona.source is Source.USER:
        return None
    if persona.source is Source.DISK and shipped:
        return (
            f"agent {name!r} is shipped with the runtime ({persona.path}) and is read-only: "
            "save a user persona with the same name, or put a file with that name in an "
            "agents directory, to override it"
        )
    if persona.source is Source.PLUGIN:
        return (
            f"agent {name!r} was installed with the plugin {persona.plugin!r} ({persona.path}) "
            "and is read-only: update or remove the plugin (ongrid plugins update|remove) to "
            "change it"
        )
    if persona.source is Source.DISK:
        return (
            f"agent {name!r} is a disk persona ({persona.path}) and is read-only here: edit "
            "or remove the file and reload, or save a user persona with the same name to "
            "shadow it"
        )
    return (
        f"agent {name!r} is builtin and cannot be changed or deleted: save a user persona "
        "with the same name to override it"
    )


def load_directory(
    directory: Path,
    *,
    only: Collection[str] | None = None,
    skip: Collection[str] = (),
) -> tuple[list[Persona], list[LoadWarning]]:
    """Load every ``*.md`` directly in ``directory`` (of those named in ``only``, when given;
    but those named in ``skip``), in name order. Never raises for a file."""
    personas: list[Persona] = []
    warnings: list[LoadWarning] = []
    for path in sorted(directory.glob("*.md")):
        if not path.is_file() or path.name in skip or (only is not None and path.name not in only):
            continue
        try:
            parsed = load_persona_file(path)
        except PersonaError as exc:
            warnings.append(LoadWarning(str(path), exc.reason))
            continue
        personas.append(parsed.persona.model_copy(update={"source": Source.DISK}))
        warnings.extend(LoadWarning(str(path), note) for note in parsed.notes)
    return personas, warnings


@dataclass(frozen=True)
class _DiskLayer:
    """The disk roots read and their collisions among themselves settled."""

    #: The persona kept for each name, in load order.
    personas: tuple[Persona, ...] = ()
    warnings: tuple[LoadWarning, ...] = ()
    #: Names whose kept persona came from the shipped root.
    shipped: frozenset[str] = frozenset()
    #: Names whose shipped persona a file of another root overrides.
    overridden: frozenset[str] = frozenset()


def _same_file(a: str | None, b: str | None) -> bool:
    """Whether two paths name one file (a root reached twice, a symlink)."""
    try:
        return a is not None and b is not None and os.path.samefile(a, b)
    except OSError:
        return False


def _same_bytes(a: str | None, b: str | None) -> bool:
    try:
        return a is not None and b is not None and Path(a).read_bytes() == Path(b).read_bytes()
    except OSError:
        return False


def _settle_disk(loaded: Sequence[tuple[Persona, bool]], warnings: list[LoadWarning]) -> _DiskLayer:
    """Keep one persona per name from ``(persona, from the shipped root)`` in load order."""
    kept: dict[str, tuple[Persona, bool]] = {}
    overridden: set[str] = set()
    for persona, shipped in loaded:
        first = kept.get(persona.name)
        if first is None:
            kept[persona.name] = (persona, shipped)
            continue
        kept_persona, kept_shipped = first
        if _same_file(kept_persona.path, persona.path):
            continue
        if kept_shipped and not shipped:
            # A non-editable install run from the checkout sees the shipped files twice: in the
            # package and in ./agents. An unchanged copy is the same persona, not an override.
            if _same_bytes(kept_persona.path, persona.path):
                continue
            warnings.append(
                LoadWarning(
                    str(kept_persona.path),
                    f"shipped persona {persona.name!r} is overridden by {persona.path}; this "
                    "file is ignored",
                )
            )
            kept[persona.name] = (persona, False)
            overridden.add(persona.name)
            continue
        warnings.append(
            LoadWarning(
                str(persona.path),
                f"duplicate persona name {persona.name!r}: already loaded from "
                f"{kept_persona.path}; this file is ignored",
            )
        )
    return _DiskLayer(
        personas=tuple(p for p, _ in kept.values()),
        warnings=tuple(warnings),
        shipped=frozenset(name for name, (_, shipped) in kept.items() if shipped),
        overridden=frozenset(overridden),
    )


def _digest(personas: Mapping[str, Persona], bundle: str = "") -> str:
    h = hashlib.sha256(bundle.encode())
    for name in sorted(personas):
        p = personas[name]
        h.update(f"{p.source}\0{name}\0".encode())
        h.update(dump_persona(p).encode())
    return h.hexdigest()[:16]


class AgentRegistry:
    """Builtin, disk and user personas merged; thread-safe; snapshots swapped atomically."""

    def __init__(
        self,
        disk_dirs: Sequence[Path] = (),
        user_store: UserStore | None = None,
        *,
        builtins: Iterable[Persona] = (),
        gate: Gate | None = None,
        optional_dirs: Iterable[Path] = (),
        shipped_dir: Path | None = None,
        shipped_files: Collection[str] | None = None,
        notes: Iterable[LoadWarning] = (),
        bundles: Callable[[], BundleLayer] | None = None,
    ) -> None:
        """``optional_dirs`` are disk roots whose absence is normal (./agents, the default
        marketplace root); any other missing directory is a warning.

        ``shipped_dir`` holds the personas installed with the package: read before
        ``disk_dirs``, whose files override a shipped persona of the same name. Only the files
        named in ``shipped_files`` (all when ``None``) are shipped: in an editable install the
        directory is the checkout's ``agents/``, where a person may drop files of their own,
        which are then theirs (a disk persona when that folder is also ``./agents``), not the
        package's. ``notes`` are
        load problems found before the registry was built, repeated in every snapshot.
        ``bundles`` reads the installed plugins at every reload (their personas are named
        ``<plugin>:<agent>``, so they collide with nothing else).
        """
        self._dirs = list(disk_dirs)
        self._optional = {Path(d) for d in optional_dirs}
        self._shipped_dir = shipped_dir
        self._shipped_files = None if shipped_files is None else frozenset(shipped_files)
        self._notes = tuple(notes)
        self._store = user_store if user_store is not None else InMemoryUserStore()
        self._gate = gate
        self._builtins: dict[str, Persona] = {}
        self._disk = _DiskLayer()
        self._read_bundles = bundles
        self._bundle: BundleLayer | None = None
        self._lock = threading.Lock()
        self._snapshot = Snapshot(version=0, personas=MappingProxyType({}))
        for persona in builtins:
            self._builtins[persona.name] = persona.model_copy(update={"source": Source.BUILTIN})
        self.reload()

    # -- reading -------------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """The current snapshot. Keep it for as long as one consistent view is needed."""
        return self._snapshot

    def get(self, name: str) -> Persona:
        return self._snapshot.get(name)

    def list(self) -> list[Persona]:
        snap = self._snapshot
        return [snap.personas[n] for n in snap.names()]

    def warnings(self) -> builtins.list[LoadWarning]:
        return list(self._snapshot.warnings)

    # -- changing ------------------------------------------------------------------------------

    def add_builtin(self, persona: Persona) -> None:
        """Register a persona in code. Builtins are added at start-up and cannot be deleted."""
        with self._lock:
            if persona.name in self._builtins:
                raise ValueError(f"builtin persona {persona.name!r} is added twice")
            self._builtins[persona.name] = persona.model_copy(update={"source": Source.BUILTIN})
            self._publish()

    def reload(self) -> Snapshot:
        """Re-read every disk root and the user store, then swap the snapshot in one step."""
        with self._lock:
            self._disk = self._load_disk()
            if self._read_bundles is not None:
                self._bundle = self._read_bundles()
            return self._publish()

    def replace(self, persona: Persona, user: str = "") -> Persona:
        """Upsert a user persona (creating it, or shadowing a builtin/disk one of that name)."""
        if ":" in persona.name:
            raise PersonaError([FieldProblem("name", PLUGIN_NAME_RESERVED)])
        stored = persona.model_copy(update={"source": Source.USER, "path": None})
        with self._lock:
            self._store.upsert(stored, user)
            self._publish()
        return stored

    def patch(self, name: str, changes: Mapping[str, Any], user: str = "") -> Persona:
        """Change fields of a user persona; the result is validated like a file."""
        current = self._editable(name)
        data = _frontmatter_of(current)
        data.update({k: v for k, v in changes.items() if k != "body"})
        body = changes.get("body", current.body)
        if "name" in changes and changes["name"] != name:
            raise PersonaError([FieldProblem("name", "cannot be changed; create a new persona")])
        return self.replace(Persona.from_dict(data, body=body), user)

    def delete(self, name: str) -> None:
        """Delete a user persona; a builtin or disk one it shadowed becomes visible again.

        A stored row that no longer loads (listed in the store's problems) can be deleted too.
        """
        if name not in dict(self._store.problems()):
            self._editable(name)
        with self._lock:
            self._store.delete(name)
            self._publish()

    # -- internals -----------------------------------------------------------------------------

    def _editable(self, name: str) -> Persona:
        snap = self._snapshot
        persona = snap.get(name)
        reason = snap.read_only.get(name)
        if reason is not None:
            raise ReadOnlyError(reason)
        return persona

    def _load_disk(self) -> _DiskLayer:
        loaded: list[tuple[Persona, bool]] = []
        warnings: list[LoadWarning] = list(self._notes)
        roots = [(Path(d), False) for d in self._dirs]
        if self._shipped_dir is not None:
            roots.insert(0, (Path(self._shipped_dir), True))
        read: set[Path] = set()
        shipped_real = Path(self._shipped_dir).resolve() if self._shipped_dir is not None else None
        own_read = False  # the person's own files beside the shipped ones, read once
        for directory, shipped in roots:
            if not directory.is_dir():
                if shipped:
                    warnings.append(
                        LoadWarning(
                            str(directory),
                            "the shipped personas' directory does not exist: reinstall the "
                            "package, or set shipped_agents: false",
                        )
                    )
                elif directory not in self._optional:
                    warnings.append(LoadWarning(str(directory), "agents directory does not exist"))
                continue
            # One directory reached twice (./agents of the checkout is the shipped root of an
            # editable install; a root listed twice) is read once: the shipped files as shipped,
            # the others (a person's own, dropped beside them) as the disk root's.
            real = directory.resolve()
            if shipped:
                found, problems = load_directory(directory, only=self._shipped_files)
            elif real in read:
                if real != shipped_real or self._shipped_files is None or own_read:
                    continue
                found, problems = load_directory(directory, skip=self._shipped_files)
                own_read = True
            else:
                found, problems = load_directory(directory)
            read.add(real)
            loaded.extend((persona, shipped) for persona in found)
            warnings.extend(problems)
        return _settle_disk(loaded, warnings)

    def _publish(self) -> Snapshot:
        """Merge the layers into a new snapshot and swap it in. Caller holds the lock."""
        warnings = list(self._disk.warnings)
        merged: dict[str, Persona] = dict(self._builtins)
        shadowed: dict[str, Source] = {}
        for persona in self._disk.personas:
            if persona.name in self._builtins:
                warnings.append(
                    LoadWarning(
                        str(persona.path),
                        f"persona name {persona.name!r} is taken by a builtin; this file is "
                        "ignored (save a user persona with that name to override the builtin)",
                    )
                )
                continue
            merged[persona.name] = persona
            if persona.name in self._disk.overridden:
                shadowed[persona.name] = Source.DISK
        if self._bundle is not None:
            warnings.extend(self._bundle.warnings)
            for persona in self._bundle.personas:
                merged[persona.name] = persona
        stored = self._store.list()
        warnings.extend(
            LoadWarning(f"database:agents/{name}", reason)
            for name, reason in self._store.problems()
        )
        for persona in stored:
            if persona.name in merged:
                shadowed[persona.name] = merged[persona.name].source or Source.DISK
            merged[persona.name] = persona.model_copy(update={"source": Source.USER})
        unavailable = {}
        if self._gate is not None:
            for persona in merged.values():
                reason = self._gate(persona)
                if reason:
                    unavailable[persona.name] = reason
        read_only = {
            name: why
            for name, persona in merged.items()
            if (why := read_only_reason(persona, shipped=name in self._disk.shipped))
        }
        self._snapshot = Snapshot(
            version=self._snapshot.version + 1,
            personas=MappingProxyType(merged),
            warnings=tuple(warnings),
            unavailable=MappingProxyType(unavailable),
            shadowed=MappingProxyType(shadowed),
            read_only=MappingProxyType(read_only),
            digest=_digest(merged, self._bundle.digest if self._bundle is not None else ""),
            bundle=self._bundle,
        )
        return self._snapshot


def _frontmatter_of(persona: Persona) -> dict[str, Any]:
    """The persona as a frontmatter mapping (what a file or a JSON body would carry)."""
    data = persona.model_dump(mode="python", exclude=set(NON_FILE_FIELDS), exclude_unset=True)
    data.setdefault("name", persona.name)
    data.setdefault("description", persona.description)
    data.setdefault("when_to_use", persona.when_to_use)
    data.update(persona.unknown_fields)
    return data
