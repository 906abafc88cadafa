"""The coordinator's catalog prompt, and the demo model's routing over it."""

from __future__ import annotations

from pathlib import Path

from coordinator.catalog import COORDINATOR, catalog_lines, coordinator_persona
from registry.defaults import build_registry
from registry.settings import Settings
from workers.demo_model import route

REPO = Path(__file__).resolve().parents[2]


def _snapshot(tmp_path: Path, extra: str = ""):
    agents = tmp_path / "agents"
    agents.mkdir()
    for f in (REPO / "agents").glob("*.md"):
        (agents / f.name).write_text(f.read_text())
    if extra:
        (agents / "gated.md").write_text(extra)
    settings = Settings(agents_dir=agents, marketplace_root=tmp_path / "m")
    return build_registry(settings).snapshot()


def test_catalog_has_name_description_and_first_trigger_line(tmp_path):
    gated = "---\nname: gated\ndescription: d\nwhen_to_use: w\nmetadata: {os: [plan9]}\n---\n"
    snap = _snapshot(tmp_path, gated)
    lines = catalog_lines(snap)
    disk = next(line for line in lines if line.startswith("- `disk_specialist`"))
    assert "Diagnose disk pressure issues" in disk
    assert disk.endswith(
        'When: When the user asks about disk-full, "no space left on device", slow IO, or mount '
        "errors."
    )  # the first line of when_to_use only
    assert any(line.startswith("- `reviewer` (background):") for line in lines)
    assert not any("`gated`" in line for line in lines)  # unavailable here: not offered
    assert len(lines) == len(snap.personas) - 1


def test_coordinator_persona_holds_only_the_agent_tool(tmp_path):
    persona = coordinator_persona(_snapshot(tmp_path), model="openai/gpt-4o-mini")
    assert persona.name == COORDINATOR and persona.tools == ["spawn_agent"]
    assert persona.model == "openai/gpt-4o-mini"
    assert "- `incident_investigator`:" in persona.body


def test_demo_routing_follows_the_triggers(tmp_path):
    body = coordinator_persona(_snapshot(tmp_path)).body
    assert route("Why is alert HighCPU firing on incident 4217?", body)[0] == (
        "incident_investigator"
    )
    assert route("The disk on web-3 is full, no space left", body)[0] == "disk_specialist"
    assert route("Is the ClickHouse replica lagging?", body)[0] == "specialist-clickhouse"
    assert route("hello there", body) == ("generalist", "no trigger matched")


def test_the_rendered_prompt_is_logged_at_debug_level(tmp_path, caplog):
    caplog.set_level("DEBUG", logger="coordinator.catalog")
    coordinator_persona(_snapshot(tmp_path))
    [record] = caplog.records
    assert record.levelname == "DEBUG" and "- `disk_specialist`:" in record.getMessage()
