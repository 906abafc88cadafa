"""The shipped personas: found through the installed package, first among the disk roots.

The registry tests use tmp directories as the shipped root; the first ones check the real one
that the installed package provides, from a working directory that is not the checkout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from registry import defaults
from registry.agent_registry import AgentRegistry, InMemoryUserStore, LoadWarning
from registry.defaults import BUILTIN_PERSONAS, build_registry, shipped_agents_dir
from registry.errors import ReadOnlyError, UserError
from registry.persona import Persona, Source
from registry.settings import Settings

PersonaWriter = Callable[..., Path]

CHECKOUT_AGENTS = Path(__file__).resolve().parents[2] / "agents"
SHIPPED = sorted(defaults.SHIPPED_PERSONA_FILES)


def _settings(tmp_path: Path, **fields: object) -> Settings:
    """Settings whose configured roots are empty tmp directories (no host state leaks in)."""
    (tmp_path / "marketplace").mkdir(exist_ok=True)
    return Settings(agents_dir=Path("agents"), marketplace_root=tmp_path / "marketplace", **fields)


# -- the installed package ---------------------------------------------------------------------


def test_the_six_shipped_files_are_the_repository_agents_folder() -> None:
    assert len(SHIPPED) == 6, SHIPPED


def test_the_shipped_root_is_found_from_any_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    found = shipped_agents_dir()
    assert found is not None, "the package ongrid_agents is not installed: pip install -e ."
    assert found.is_absolute() and tmp_path not in found.parents
    assert set(SHIPPED) <= {p.name for p in found.glob("*.md")}
    for name in SHIPPED:  # an editable install points at the checkout, a wheel holds copies
        assert (found / name).read_bytes() == (CHECKOUT_AGENTS / name).read_bytes(), name


def test_build_registry_loads_the_shipped_personas_outside_the_checkout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    snap = build_registry(_settings(tmp_path)).snapshot()
    shipped = {name: snap.get(name) for name in snap.names() if name != "generalist"}
    assert snap.warnings == ()
    assert sorted(Path(str(p.path)).name for p in shipped.values()) == SHIPPED
    assert {p.source for p in shipped.values()} == {Source.DISK}
    assert snap.get("generalist").source is Source.BUILTIN


def test_the_checkout_as_working_directory_loads_each_file_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(CHECKOUT_AGENTS.parent)
    snap = build_registry(_settings(tmp_path)).snapshot()
    # A person's own files dropped into the checkout's agents/ load (or warn) as theirs.
    assert not [w for w in snap.warnings if Path(w.path).name in SHIPPED]
    from_files = [Path(str(snap.get(n).path)).name for n in snap.names() if snap.get(n).path]
    assert sorted(f for f in from_files if f in SHIPPED) == SHIPPED  # each once


def test_the_switch_leaves_the_shipped_personas_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, write_persona: PersonaWriter
) -> None:
    monkeypatch.chdir(tmp_path)
    write_persona(tmp_path / "agents", "site_only")
    settings = Settings.load(
        environ={
            "ONGRID_SHIPPED_AGENTS": "0",
            "ONGRID_MARKETPLACE_ROOT": str(_settings(tmp_path).marketplace_root),
        }
    )
    assert settings.shipped_agents is False
    snap = build_registry(settings).snapshot()
    assert snap.names() == ["generalist", "site_only"] and snap.warnings == ()


@pytest.mark.parametrize(("value", "expected"), [("false", False), ("1", True), ("true", True)])
def test_the_switch_reads_booleans(value: str, expected: bool) -> None:
    assert Settings.load(environ={"ONGRID_SHIPPED_AGENTS": value}).shipped_agents is expected


def test_a_bad_switch_value_names_the_setting() -> None:
    with pytest.raises(UserError, match="shipped_agents: Input should be a valid boolean"):
        Settings.load(environ={"ONGRID_SHIPPED_AGENTS": "sometimes"})


def test_a_missing_package_is_a_warning_not_a_silent_loss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(defaults, "SHIPPED_AGENTS_PACKAGE", "ongrid_agents_not_installed")
    snap = build_registry(_settings(tmp_path)).snapshot()
    assert snap.names() == ["generalist"]
    assert [w.as_dict() for w in snap.warnings] == [
        {
            "path": "package:ongrid_agents_not_installed",
            "reason": "the shipped personas are not installed: reinstall the package "
            "(pip install .), or set shipped_agents: false",
        }
    ]


# -- the shipped root in the registry ----------------------------------------------------------


def test_one_directory_as_shipped_root_and_disk_root_is_read_once(
    tmp_path: Path, write_persona: PersonaWriter
) -> None:
    shipped = tmp_path / "checkout" / "agents"
    path = write_persona(shipped, "triage")
    registry = AgentRegistry(
        [tmp_path / "checkout" / "agents" / ".." / "agents"], shipped_dir=shipped
    )
    assert registry.warnings() == []
    assert registry.get("triage").path == str(path)
    assert dict(registry.snapshot().shadowed) == {}


def test_a_site_root_listed_twice_is_read_once(
    tmp_path: Path, write_persona: PersonaWriter
) -> None:
    agents = tmp_path / "agents"
    write_persona(agents, "triage")
    (agents / "broken.md").write_text("no frontmatter\n", encoding="utf-8")
    registry = AgentRegistry([agents, tmp_path / "." / "agents"])
    assert registry.snapshot().names() == ["triage"]
    assert [Path(w.path).name for w in registry.warnings()] == ["broken.md"]  # once, not twice


def test_one_file_linked_into_two_site_roots_is_no_duplicate(
    tmp_path: Path, write_persona: PersonaWriter
) -> None:
    original = write_persona(tmp_path / "a", "triage")
    (tmp_path / "b").mkdir()
    os.symlink(original, tmp_path / "b" / "triage.md")
    registry = AgentRegistry([tmp_path / "a", tmp_path / "b"])
    assert registry.warnings() == []
    assert registry.get("triage").path == str(original)


def test_one_file_reached_through_a_symlink_is_loaded_once(
    tmp_path: Path, write_persona: PersonaWriter
) -> None:
    original = write_persona(tmp_path / "shipped", "triage")
    (tmp_path / "agents").mkdir()
    os.symlink(original, tmp_path / "agents" / "triage.md")
    registry = AgentRegistry([tmp_path / "agents"], shipped_dir=tmp_path / "shipped")
    assert registry.warnings() == []
    assert registry.get("triage").path == str(original)


def test_a_byte_identical_copy_of_a_shipped_file_is_no_warning(
    tmp_path: Path, write_persona: PersonaWriter
) -> None:
    original = write_persona(tmp_path / "site-packages", "triage", body="Same.\n")
    copy = write_persona(tmp_path / "agents", "triage", body="Same.\n")
    assert copy.read_bytes() == original.read_bytes() and not os.path.samefile(original, copy)
    registry = AgentRegistry([tmp_path / "agents"], shipped_dir=tmp_path / "site-packages")
    assert registry.warnings() == []
    assert registry.get("triage").path == str(original)
    assert dict(registry.snapshot().shadowed) == {}


def test_a_different_file_of_a_shipped_name_overrides_it_with_a_warning(
    tmp_path: Path, write_persona: PersonaWriter
) -> None:
    original = write_persona(tmp_path / "shipped", "triage", body="Shipped.\n")
    team = write_persona(tmp_path / "agents", "triage", body="The team's.\n")
    write_persona(tmp_path / "shipped", "other")
    registry = AgentRegistry([tmp_path / "agents"], shipped_dir=tmp_path / "shipped")
    snap = registry.snapshot()
    assert snap.get("triage").path == str(team) and snap.get("triage").body == "The team's.\n"
    assert snap.get("triage").source is Source.DISK
    assert registry.warnings() == [
        LoadWarning(
            str(original),
            f"shipped persona 'triage' is overridden by {team}; this file is ignored",
        )
    ]
    assert dict(snap.shadowed) == {"triage": Source.DISK}
    assert snap.describe(snap.get("triage"))["shadows"] == "disk"


def test_an_edit_of_the_copy_shows_on_reload_and_reverting_it_clears_the_warning(
    tmp_path: Path, write_persona: PersonaWriter
) -> None:
    write_persona(tmp_path / "shipped", "triage", body="Same.\n")
    write_persona(tmp_path / "agents", "triage", body="Same.\n")
    registry = AgentRegistry([tmp_path / "agents"], shipped_dir=tmp_path / "shipped")
    assert registry.warnings() == []
    write_persona(tmp_path / "agents", "triage", body="Edited.\n")
    registry.reload()
    assert registry.get("triage").body == "Edited.\n" and len(registry.warnings()) == 1
    write_persona(tmp_path / "agents", "triage", body="Same.\n")
    registry.reload()
    assert registry.warnings() == [] and registry.get("triage").path.endswith("shipped/triage.md")


def test_two_site_roots_keep_the_duplicate_rule_even_for_identical_files(
    tmp_path: Path, write_persona: PersonaWriter
) -> None:
    # Only a copy of a shipped file is the same persona; two site roots defining one name is
    # still the SPEC's duplicate, whatever the bytes.
    first = write_persona(tmp_path / "a", "triage", body="Same.\n")
    second = write_persona(tmp_path / "b", "triage", body="Same.\n")
    registry = AgentRegistry([tmp_path / "a", tmp_path / "b"])
    assert registry.warnings() == [
        LoadWarning(
            str(second),
            f"duplicate persona name 'triage': already loaded from {first}; this file is ignored",
        )
    ]


def test_an_override_and_a_later_duplicate_are_both_reported(
    tmp_path: Path, write_persona: PersonaWriter
) -> None:
    original = write_persona(tmp_path / "shipped", "triage", body="Shipped.\n")
    team = write_persona(tmp_path / "agents", "triage", body="Team.\n")
    market = write_persona(tmp_path / "market", "triage", body="Shipped.\n")
    registry = AgentRegistry(
        [tmp_path / "agents", tmp_path / "market"], shipped_dir=tmp_path / "shipped"
    )
    assert registry.get("triage").path == str(team)
    assert [w.path for w in registry.warnings()] == [str(original), str(market)]
    assert "already loaded from " + str(team) in registry.warnings()[1].reason


def test_a_shipped_file_named_like_a_builtin_keeps_the_builtin(
    tmp_path: Path, write_persona: PersonaWriter
) -> None:
    path = write_persona(tmp_path / "shipped", "generalist")
    registry = AgentRegistry(shipped_dir=tmp_path / "shipped", builtins=BUILTIN_PERSONAS)
    assert registry.get("generalist").source is Source.BUILTIN
    assert [w.path for w in registry.warnings()] == [str(path)]
    assert "taken by a builtin" in registry.warnings()[0].reason


def test_a_missing_shipped_root_is_a_warning(tmp_path: Path) -> None:
    registry = AgentRegistry(shipped_dir=tmp_path / "gone")
    assert registry.warnings() == [
        LoadWarning(
            str(tmp_path / "gone"),
            "the shipped personas' directory does not exist: reinstall the package, or set "
            "shipped_agents: false",
        )
    ]


def test_shipped_personas_are_read_only_and_a_user_persona_overrides_them(
    tmp_path: Path, write_persona: PersonaWriter
) -> None:
    path = write_persona(tmp_path / "shipped", "triage", body="Shipped.\n")
    registry = AgentRegistry(shipped_dir=tmp_path / "shipped", user_store=InMemoryUserStore())
    expected = (
        f"agent 'triage' is shipped with the runtime ({path}) and is read-only: save a user "
        "persona with the same name, or put a file with that name in an agents directory, to "
        "override it"
    )
    with pytest.raises(ReadOnlyError) as patched:
        registry.patch("triage", {"description": "Changed."})
    assert str(patched.value) == expected
    with pytest.raises(ReadOnlyError):
        registry.delete("triage")
    assert path.read_text(encoding="utf-8").endswith("Shipped.\n")

    mine = Persona(name="triage", description="Mine.", when_to_use="w", body="Mine.\n")
    registry.replace(mine)
    assert registry.get("triage").source is Source.USER
    assert dict(registry.snapshot().shadowed) == {"triage": Source.DISK}
    registry.delete("triage")
    assert registry.get("triage").body == "Shipped.\n"


# -- files dropped beside the shipped ones --------------------------------------------------


MINE = """---
name: my_own
description: Mine.
when_to_use: When mine fits.
---
Mine.
"""


def test_the_list_is_the_repositorys_agents_folder() -> None:
    if (CHECKOUT_AGENTS.parent / ".git").exists():
        tracked = subprocess.run(
            ["git", "ls-files", "agents"],
            cwd=CHECKOUT_AGENTS.parent,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        names = {Path(t).name for t in tracked if t.endswith(".md")}
    else:  # an unpacked source tree: whatever it holds
        names = {p.name for p in (CHECKOUT_AGENTS.parent / "agents").glob("*.md")}
    assert names == defaults.SHIPPED_PERSONA_FILES


def test_a_file_dropped_beside_the_shipped_ones_is_the_persons_own(tmp_path: Path) -> None:
    checkout = tmp_path / "agents"
    shutil.copytree(CHECKOUT_AGENTS.parent / "agents", checkout)
    (checkout / "my-own.md").write_text(MINE)
    (checkout / "notes.md").write_text("not a persona\n")

    # Not run from the checkout: only the shipped files load, nothing else is seen.
    elsewhere = AgentRegistry(
        [], shipped_dir=checkout, shipped_files=defaults.SHIPPED_PERSONA_FILES
    ).reload()
    assert "my_own" not in elsewhere.personas and elsewhere.warnings == ()
    assert "disk_specialist" in elsewhere.personas

    # Run from the checkout (its agents/ is ./agents too): the dropped file is a disk persona
    # of the person's, editable as such; the shipped ones stay shipped.
    inside = AgentRegistry(
        [checkout], shipped_dir=checkout, shipped_files=defaults.SHIPPED_PERSONA_FILES
    ).reload()
    assert inside.personas["my_own"].source is Source.DISK
    assert "shipped" not in (inside.read_only.get("my_own") or "")
    assert "shipped with the runtime" in (inside.read_only.get("disk_specialist") or "")
    assert [w.path for w in inside.warnings] == [str(checkout / "notes.md")]
