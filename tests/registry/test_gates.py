"""registry.gates: OS, binaries, config keys and runtime version decide availability (SPEC §2)."""

from __future__ import annotations

import platform
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from registry.agent_registry import AgentRegistry, LoadWarning
from registry.defaults import BUILTIN_PERSONAS, build_registry
from registry.gates import RUNTIME_VERSION, check_availability
from registry.parser import load_persona_file
from registry.persona import Persona
from registry.settings import DEFAULT_MARKETPLACE_ROOT, Settings

PersonaWriter = Callable[..., Path]
ON_PATH = {"dmesg", "journalctl", "df"}
CONFIG_SET = {"prometheus_url"}


def _gated(**metadata: Any) -> Persona:
    return Persona(name="gated", description="d", when_to_use="w", metadata=metadata)


def _check(persona: Persona, **overrides: Any) -> str | None:
    options: dict[str, Any] = {
        "has_config": CONFIG_SET.__contains__,
        "system": "Linux",
        "which": lambda b: f"/usr/bin/{b}" if b in ON_PATH else None,
    }
    options.update(overrides)
    return check_availability(persona, **options)


@pytest.mark.parametrize(
    ("metadata", "reason"),
    [
        ({"os": ["plan9"]}, "metadata.os allows plan9; this host runs linux"),
        ({"os": ["darwin", "windows"]}, "metadata.os allows darwin, windows; this host runs linux"),
        (
            {"requires": {"bins": ["df", "zpool", "smartctl"]}},
            "metadata.requires.bins: not on PATH: zpool, smartctl",
        ),
        (
            {"requires": {"config": ["prometheus_url", "pagerduty_token"]}},
            "metadata.requires.config: not set: pagerduty_token",
        ),
        (
            {"ongrid": {"min_ongrid_version": "99.0"}},
            f"metadata.ongrid.min_ongrid_version is 99.0; this runtime is {RUNTIME_VERSION}",
        ),
        (
            {"ongrid": {"min_ongrid_version": "0.2"}},
            "metadata.ongrid.min_ongrid_version is 0.2; this runtime is 0.1.0",
        ),
        (
            {"ongrid": {"min_ongrid_version": "0.1.1"}},
            "metadata.ongrid.min_ongrid_version is 0.1.1; this runtime is 0.1.0",
        ),
    ],
)
def test_failing_gates_give_the_reason(metadata: dict[str, Any], reason: str) -> None:
    assert RUNTIME_VERSION == "0.1.0"
    assert _check(_gated(**metadata)) == reason


@pytest.mark.parametrize(
    "metadata",
    [
        {},
        {"os": ["linux", "darwin"]},
        {"os": ["LINUX"]},  # case does not matter
        {"requires": {"bins": ["dmesg", "df"], "config": ["prometheus_url"]}},
        {"ongrid": {"min_ongrid_version": "0.1"}},
        {"ongrid": {"min_ongrid_version": "0.1.0"}},
        {"ongrid": {"min_ongrid_version": "v0.0.9"}},
        {"ongrid": {"scope": "edge"}, "team": "storage"},
    ],
)
def test_satisfied_gates_give_none(metadata: dict[str, Any]) -> None:
    assert _check(_gated(**metadata)) is None


def test_versions_compare_numerically_not_as_text() -> None:
    persona = _gated(ongrid={"min_ongrid_version": "0.10.0"})
    assert _check(persona, version="0.9.3") == (
        "metadata.ongrid.min_ongrid_version is 0.10.0; this runtime is 0.9.3"
    )
    assert _check(persona, version="0.10.0") is None
    assert _check(persona, version="1.0.0") is None


def test_the_first_failing_gate_is_reported() -> None:
    persona = _gated(os=["plan9"], requires={"bins": ["zpool"]})
    assert _check(persona) == "metadata.os allows plan9; this host runs linux"
    persona = _gated(requires={"bins": ["zpool"], "config": ["missing_key"]})
    assert _check(persona) == "metadata.requires.bins: not on PATH: zpool"


def test_the_gated_fixture(valid_dir: Path) -> None:
    persona = load_persona_file(valid_dir / "metadata_gated.md").persona
    assert _check(persona) is None
    assert _check(persona, has_config=lambda key: False) == (
        "metadata.requires.config: not set: prometheus_url"
    )
    assert _check(persona, system="Darwin") == "metadata.os allows linux; this host runs darwin"


def test_defaults_use_this_host() -> None:
    here = platform.system().lower()
    assert check_availability(_gated(os=[here]), has_config=bool) is None
    binary = "ongrid-test-binary-that-does-not-exist"
    assert shutil.which(binary) is None
    assert check_availability(_gated(requires={"bins": [binary]}), has_config=bool) == (
        f"metadata.requires.bins: not on PATH: {binary}"
    )


def test_registry_lists_unavailable_personas_with_the_reason() -> None:
    personas = [
        Persona(name="os_gated", description="d", when_to_use="w", metadata={"os": ["plan9"]}),
        Persona(
            name="bin_gated",
            description="d",
            when_to_use="w",
            metadata={"requires": {"bins": ["zpool"]}},
        ),
        Persona(
            name="config_gated",
            description="d",
            when_to_use="w",
            metadata={"requires": {"config": ["pagerduty_token"]}},
        ),
        Persona(
            name="version_gated",
            description="d",
            when_to_use="w",
            metadata={"ongrid": {"min_ongrid_version": "99.0"}},
        ),
        Persona(name="open", description="d", when_to_use="w", metadata={"os": ["linux"]}),
    ]
    registry = AgentRegistry(builtins=personas, gate=_check)
    snap = registry.snapshot()
    assert snap.names() == ["bin_gated", "config_gated", "open", "os_gated", "version_gated"]
    assert dict(snap.unavailable) == {
        "os_gated": "metadata.os allows plan9; this host runs linux",
        "bin_gated": "metadata.requires.bins: not on PATH: zpool",
        "config_gated": "metadata.requires.config: not set: pagerduty_token",
        "version_gated": "metadata.ongrid.min_ongrid_version is 99.0; this runtime is 0.1.0",
    }
    assert snap.describe(snap.get("open"))["available"] is True
    assert snap.describe(snap.get("open"))["unavailable_reason"] is None
    described = snap.describe(snap.get("bin_gated"))
    assert described["available"] is False
    assert described["unavailable_reason"] == "metadata.requires.bins: not on PATH: zpool"
    assert registry.warnings() == []  # unavailable is not an error of the file


def test_build_registry_wires_settings_into_the_gate(
    tmp_path: Path, write_persona: PersonaWriter
) -> None:
    agents = tmp_path / "agents"
    write_persona(agents, "needs_pd", extra="metadata:\n  requires: {config: [pagerduty_token]}\n")
    write_persona(agents, "needs_prom", extra="metadata:\n  requires: {config: [prometheus_url]}\n")
    write_persona(agents, "needs_plan9", extra="metadata:\n  os: [plan9]\n")
    config = tmp_path / "ongrid.yaml"
    config.write_text("pagerduty_token: pd-1\n", encoding="utf-8")
    settings = Settings.load(
        environ={
            "ONGRID_CONFIG": str(config),
            "ONGRID_AGENTS_DIR": str(agents),
            "ONGRID_MARKETPLACE_ROOT": str(tmp_path / "marketplace"),
            "ONGRID_SHIPPED_AGENTS": "0",
        }
    )
    snap = build_registry(settings).snapshot()
    assert snap.names() == ["generalist", "needs_pd", "needs_plan9", "needs_prom"]
    assert snap.get("generalist").source == "builtin"
    here = platform.system().lower()
    assert dict(snap.unavailable) == {
        "needs_prom": "metadata.requires.config: not set: prometheus_url",
        "needs_plan9": f"metadata.os allows plan9; this host runs {here}",
    }
    # A configured marketplace root that does not exist is worth a warning.
    assert list(snap.warnings) == [
        LoadWarning(str(tmp_path / "marketplace"), "agents directory does not exist")
    ]


def test_default_roots_may_be_missing(tmp_path: Path) -> None:
    if DEFAULT_MARKETPLACE_ROOT.exists():
        pytest.skip(f"{DEFAULT_MARKETPLACE_ROOT} exists on this host")
    settings = Settings(agents_dir=tmp_path / "no-agents-here", shipped_agents=False)
    registry = build_registry(settings)
    assert registry.warnings() == []
    assert registry.snapshot().names() == [p.name for p in BUILTIN_PERSONAS] == ["generalist"]
