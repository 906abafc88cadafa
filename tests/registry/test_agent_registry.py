"""registry.agent_registry: merge order, shadowing, collisions, edits, reload and snapshots."""

from __future__ import annotations

import dataclasses
import shutil
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pydantic
import pytest

from registry.agent_registry import AgentRegistry, InMemoryUserStore, LoadWarning, Snapshot
from registry.errors import NotFoundError, PersonaError, ReadOnlyError
from registry.persona import Persona, Source

PersonaWriter = Callable[..., Path]


def _p(name: str, description: str = "", **fields: Any) -> Persona:
    description = description or f"{name} persona"
    return Persona(name=name, description=description, when_to_use="w", **fields)


def _reasons(registry: AgentRegistry) -> dict[str, str]:
    return {Path(w.path).name: w.reason for w in registry.warnings()}


# -- merge order and sources -------------------------------------------------------------------


def test_builtin_disk_and_user_are_merged_with_their_source(
    tmp_path: Path, write_persona: PersonaWriter
) -> None:
    disk_file = write_persona(tmp_path / "agents", "disk_one")
    store = InMemoryUserStore([_p("user_one", source=Source.DISK)])
    registry = AgentRegistry([tmp_path / "agents"], store, builtins=[_p("builtin_one")])
    snap = registry.snapshot()
    assert snap.names() == ["builtin_one", "disk_one", "user_one"]
    assert snap.get("builtin_one").source is Source.BUILTIN
    assert snap.get("disk_one").source is Source.DISK
    assert snap.get("disk_one").path == str(disk_file)
    assert snap.get("user_one").source is Source.USER  # whatever the store held
    assert [p.name for p in registry.list()] == snap.names()
    assert registry.get("disk_one") is snap.get("disk_one")
    assert snap.describe(snap.get("disk_one"))["source"] == "disk"
    assert registry.warnings() == [] and dict(snap.shadowed) == {}


def test_unknown_name_lists_the_known_ones() -> None:
    registry = AgentRegistry(builtins=[_p("alpha"), _p("beta")])
    with pytest.raises(NotFoundError) as info:
        registry.get("gamma")
    assert str(info.value) == "unknown agent 'gamma'; known: alpha, beta"


def test_user_shadows_disk_and_builtin_until_deleted(
    tmp_path: Path, write_persona: PersonaWriter
) -> None:
    write_persona(tmp_path, "disk_one", description="From disk.")
    registry = AgentRegistry([tmp_path], builtins=[_p("builtin_one", "From code.")])
    registry.replace(_p("disk_one", "User override of disk."))
    registry.replace(_p("builtin_one", "User override of builtin."))
    snap = registry.snapshot()
    assert snap.get("disk_one").source is Source.USER
    assert snap.get("disk_one").description == "User override of disk."
    assert snap.get("builtin_one").description == "User override of builtin."
    assert dict(snap.shadowed) == {"disk_one": Source.DISK, "builtin_one": Source.BUILTIN}
    assert snap.describe(snap.get("builtin_one"))["shadows"] == "builtin"

    registry.delete("disk_one")
    after = registry.snapshot()
    assert after.get("disk_one").source is Source.DISK
    assert after.get("disk_one").description == "From disk."
    assert dict(after.shadowed) == {"builtin_one": Source.BUILTIN}
    registry.delete("builtin_one")
    assert registry.get("builtin_one").description == "From code."
    assert registry.get("builtin_one").source is Source.BUILTIN
    assert dict(registry.snapshot().shadowed) == {}


def test_replace_upserts_a_user_persona() -> None:
    registry = AgentRegistry()
    stored = registry.replace(_p("mine", "First.", path="/tmp/elsewhere.md"))
    assert (stored.source, stored.path, stored.description) == (Source.USER, None, "First.")
    v1 = registry.snapshot().version
    registry.replace(_p("mine", "Second.", max_turns=3))
    assert registry.get("mine").description == "Second."
    assert registry.get("mine").max_turns == 3
    assert registry.snapshot().version == v1 + 1
    assert registry.snapshot().names() == ["mine"]


# -- collisions and load problems --------------------------------------------------------------


def test_two_disk_files_with_one_name_keep_the_first(
    tmp_path: Path, write_persona: PersonaWriter
) -> None:
    first = write_persona(tmp_path / "a", "dup", description="First.", filename="a_dup.md")
    second = write_persona(tmp_path / "a", "dup", description="Second.", filename="b_dup.md")
    third = write_persona(tmp_path / "b", "dup", description="Third.")
    registry = AgentRegistry([tmp_path / "a", tmp_path / "b"])
    assert registry.get("dup").description == "First."
    assert registry.get("dup").path == str(first)
    assert registry.warnings() == [
        LoadWarning(
            str(second),
            f"duplicate persona name 'dup': already loaded from {first}; this file is ignored",
        ),
        LoadWarning(
            str(third),
            f"duplicate persona name 'dup': already loaded from {first}; this file is ignored",
        ),
    ]


def test_disk_file_named_like_a_builtin_is_ignored(
    tmp_path: Path, write_persona: PersonaWriter
) -> None:
    path = write_persona(tmp_path, "generalist", description="Imposter.")
    registry = AgentRegistry([tmp_path], builtins=[_p("generalist", "The real one.")])
    assert registry.get("generalist").description == "The real one."
    assert registry.get("generalist").source is Source.BUILTIN
    assert [w.as_dict() for w in registry.warnings()] == [
        {
            "path": str(path),
            "reason": "persona name 'generalist' is taken by a builtin; this file is ignored "
            "(save a user persona with that name to override the builtin)",
        }
    ]
    assert dict(registry.snapshot().shadowed) == {}


def test_broken_files_are_warnings_and_the_rest_loads(
    tmp_path: Path, valid_dir: Path, broken_dir: Path, byte_files: dict[str, Path]
) -> None:
    agents = tmp_path / "agents"
    shutil.copytree(broken_dir, agents)
    shutil.copy(valid_dir / "incident_investigator.md", agents / "zz_valid.md")
    shutil.copy(valid_dir / "colon_description.md", agents / "aa_lenient.md")
    shutil.copy(byte_files["latin1.md"], agents / "latin1.md")
    (agents / "notes.txt").write_text("not a persona", encoding="utf-8")
    (agents / "subdir.md").mkdir()
    registry = AgentRegistry([agents])
    assert registry.snapshot().names() == ["disk_triage", "incident_investigator"]
    reasons = _reasons(registry)
    assert sorted(reasons) == sorted(
        [p.name for p in broken_dir.glob("*.md")] + ["aa_lenient.md", "latin1.md"]
    )
    assert reasons["missing_name.md"] == "name: required field is missing"
    assert reasons["bad_permission_mode.md"].startswith("permission_mode: Input should be")
    assert reasons["max_turns_lots.md"].startswith("max_turns: Input should be a valid integer")
    assert reasons["name_with_spaces.md"].startswith("name: expected snake_case or kebab-case")
    assert reasons["range_initial_prompt.md"].startswith(
        "initial_prompt: unsupported template action {{ range .hosts }}"
    )
    assert reasons["frontmatter_list.md"] == "frontmatter must be a mapping, got list"
    assert reasons["no_frontmatter.md"].startswith("no frontmatter")
    assert reasons["unclosed_frontmatter.md"].startswith("frontmatter is not closed")
    assert reasons["tab_garbage.md"].startswith("frontmatter is not valid YAML (line 2, column 1")
    assert reasons["latin1.md"].startswith("not UTF-8 text (byte 39")
    # A file read by the lenient fallback loads, and its note is a warning too.
    assert "keys read as plain text: description" in reasons["aa_lenient.md"]
    for warning in registry.warnings():
        assert Path(warning.path).parent == agents


def test_missing_directories(tmp_path: Path, write_persona: PersonaWriter) -> None:
    write_persona(tmp_path / "present", "here")
    missing_external = tmp_path / "external"
    missing_optional = tmp_path / "agents"
    registry = AgentRegistry(
        [missing_optional, tmp_path / "present", missing_external],
        optional_dirs=[missing_optional],
    )
    assert registry.snapshot().names() == ["here"]
    assert registry.warnings() == [
        LoadWarning(str(missing_external), "agents directory does not exist")
    ]


# -- edits -------------------------------------------------------------------------------------


def test_patch_of_a_user_persona_is_validated_and_applied() -> None:
    registry = AgentRegistry()
    registry.replace(
        _p("mine", "Before.", tools=["query_*"], body="Body.\n", unknown_fields={"color": "x"})
    )
    before = registry.snapshot()
    patched = registry.patch("mine", {"description": "After.", "max_turns": 0, "effort": "low"})
    assert patched.description == "After."
    assert patched.max_turns == 15
    assert patched.tools == ["query_*"] and patched.body == "Body.\n"  # untouched fields kept
    assert patched.unknown_fields == {"color": "x", "effort": "low"}
    assert registry.snapshot().version == before.version + 1
    assert registry.get("mine") == patched and patched.source is Source.USER
    assert registry.patch("mine", {"body": "New body.\n"}).body == "New body.\n"


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"permission_mode": "root"}, "permission_mode"),
        ({"max_turns": "lots"}, "max_turns"),
        ({"description": ""}, "description"),
        ({"initial_prompt": "{{ range .x }}{{ end }}"}, "initial_prompt"),
        ({"name": "someone_else"}, "name"),
    ],
)
def test_a_bad_patch_changes_nothing(changes: dict[str, Any], field: str) -> None:
    store = InMemoryUserStore()
    registry = AgentRegistry(user_store=store)
    registry.replace(_p("mine", "Before.", max_turns=4))
    before = registry.snapshot()
    with pytest.raises(PersonaError) as info:
        registry.patch("mine", changes)
    assert [p.field for p in info.value.problems] == [field]
    after = registry.snapshot()
    assert after is before and after.version == before.version
    assert after.get("mine").description == "Before." and after.get("mine").max_turns == 4
    assert store.list() == [before.get("mine")]


def test_builtin_and_disk_personas_are_read_only(
    tmp_path: Path, write_persona: PersonaWriter
) -> None:
    path = write_persona(tmp_path, "on_disk")
    registry = AgentRegistry([tmp_path], builtins=[_p("in_code")])
    before = registry.snapshot()
    for call in (
        lambda: registry.patch("in_code", {"description": "x"}),
        lambda: registry.delete("in_code"),
    ):
        with pytest.raises(ReadOnlyError) as info:
            call()
        assert str(info.value) == (
            "agent 'in_code' is builtin and cannot be changed or deleted: save a user persona "
            "with the same name to override it"
        )
    for call in (
        lambda: registry.patch("on_disk", {"description": "x"}),
        lambda: registry.delete("on_disk"),
    ):
        with pytest.raises(ReadOnlyError) as info:
            call()
        assert str(info.value) == (
            f"agent 'on_disk' is a disk persona ({path}) and is read-only here: edit or remove "
            "the file and reload, or save a user persona with the same name to shadow it"
        )
    assert registry.snapshot() is before
    with pytest.raises(NotFoundError):
        registry.delete("nobody")


def test_add_builtin_twice_is_refused() -> None:
    registry = AgentRegistry(builtins=[_p("one")])
    registry.add_builtin(_p("two"))
    assert registry.get("two").source is Source.BUILTIN
    with pytest.raises(ValueError, match="builtin persona 'one' is added twice"):
        registry.add_builtin(_p("one"))


# -- reload and snapshots ----------------------------------------------------------------------


def test_reload_sees_added_edited_and_removed_files(
    tmp_path: Path, write_persona: PersonaWriter
) -> None:
    write_persona(tmp_path, "stays", description="Version 1.")
    doomed = write_persona(tmp_path, "doomed")
    registry = AgentRegistry([tmp_path])
    first = registry.snapshot()
    write_persona(tmp_path, "stays", description="Version 2.")
    write_persona(tmp_path, "newcomer")
    doomed.unlink()
    assert registry.snapshot() is first  # nothing changes until the reload
    second = registry.reload()
    assert second is registry.snapshot() and second.version == first.version + 1
    assert second.names() == ["newcomer", "stays"]
    assert second.get("stays").description == "Version 2."
    assert second.digest != first.digest
    assert registry.reload().digest == second.digest  # same content, same digest


def test_a_snapshot_never_changes(tmp_path: Path, write_persona: PersonaWriter) -> None:
    write_persona(tmp_path, "stable", description="Old.")
    registry = AgentRegistry([tmp_path])
    old = registry.snapshot()
    old_persona = old.get("stable")
    write_persona(tmp_path, "stable", description="New.")
    registry.reload()
    registry.replace(_p("added"))
    assert old.get("stable") is old_persona and old_persona.description == "Old."
    assert old.names() == ["stable"]
    assert registry.get("stable").description == "New."
    with pytest.raises(TypeError):
        old.personas["intruder"] = _p("intruder")  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        old.version = 99  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError):
        old_persona.description = "Mutated."  # type: ignore[misc]


PAIR = ("pair_a", "pair_b")


def _pair_text(name: str, generation: int) -> str:
    return f"---\nname: {name}\ndescription: generation {generation}\nwhen_to_use: w\n---\n"


@pytest.mark.timeout(60)
def test_concurrent_reloads_and_replaces_publish_consistent_snapshots(tmp_path: Path) -> None:
    """Two files edited together are both old or both new in every snapshot readers get."""
    for name in ("pair_a", "pair_b"):
        (tmp_path / f"{name}.md").write_text(_pair_text(name, 0), encoding="utf-8")
    registry = AgentRegistry([tmp_path])
    files = threading.Lock()  # the pair is edited together; the test, not the registry, says so
    stop = threading.Event()
    problems: list[str] = []
    seen: dict[int, Snapshot] = {}
    seen_lock = threading.Lock()

    def editor() -> None:
        for generation in range(1, 41):
            with files:
                for name in ("pair_a", "pair_b"):
                    (tmp_path / f"{name}.md").write_text(_pair_text(name, generation), "utf-8")
                registry.reload()
        stop.set()

    def reloader() -> None:
        while not stop.is_set():
            with files:
                versions = [registry.reload().version for _ in range(3)]
            if versions != sorted(set(versions)):
                problems.append(f"reload versions not increasing: {versions}")

    def replacer(name: str) -> None:
        count = 0
        while not stop.is_set():
            count += 1
            registry.replace(_p(name, f"write {count}"))

    def reader() -> None:
        last_version = 0
        last_count = {"user_1": 0, "user_2": 0}
        while not stop.is_set() or last_version == 0:
            snap = registry.snapshot()
            a, b = (getattr(snap.personas.get(n), "description", None) for n in PAIR)
            if a is None or a != b:
                problems.append(f"v{snap.version}: pair_a {a!r} but pair_b {b!r}")
            if snap.version < last_version:
                problems.append(f"version went back from {last_version} to {snap.version}")
            for name, last in last_count.items():
                if name in snap.personas:
                    count = int(snap.get(name).description.split()[1])
                    if count < last:
                        problems.append(f"{name}: write {count} seen after write {last}")
                    last_count[name] = count
                elif last:
                    problems.append(f"v{snap.version}: user persona {name} disappeared")
            with seen_lock:
                if seen.setdefault(snap.version, snap) is not snap:
                    problems.append(f"two different snapshots carry version {snap.version}")
            last_version = snap.version

    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        threads = [threading.Thread(target=editor)]
        threads += [threading.Thread(target=reloader) for _ in range(2)]
        threads += [threading.Thread(target=replacer, args=(n,)) for n in ("user_1", "user_2")]
        threads += [threading.Thread(target=reader) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=50)
    finally:
        sys.setswitchinterval(old_interval)
        stop.set()
    assert not any(t.is_alive() for t in threads)
    assert problems == []
    final = registry.snapshot()
    assert final.get("pair_a").description == final.get("pair_b").description == "generation 40"
    assert final.get("user_1").source is final.get("user_2").source is Source.USER
    assert len(seen) > 10  # the readers really ran alongside the writers
