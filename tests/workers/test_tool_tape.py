"""The tool tape: recording real tool calls to files and serving them back in order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from registry.errors import UserError
from registry.settings import Settings
from registry.tools import ToolClass, ToolContext, function_tool
from workers.tool_tape import TapeEntry, TapeMiss, ToolTape, parse_tape, tape_for

RUNS: list[str] = []


@function_tool(ToolClass.READ)
def probe(target: str, depth: int = 1) -> str:
    """Probe a target (test tool: each call answers differently)."""
    RUNS.append(target)
    return f"{target} probe #{len(RUNS)} at depth {depth}"


@function_tool(ToolClass.READ)
def broken(target: str) -> str:
    """A tool that raises."""
    raise OSError(f"cannot reach {target}")


def _run(tape: ToolTape, tool=probe, spawn: str = "s1", call: str = "c1", **arguments: object):
    context = ToolContext(session_id="sess", spawn_id=spawn, call_id=call)
    return tape.run(tool, tool.validate_arguments(arguments), context)


@pytest.fixture(autouse=True)
def _fresh_runs() -> None:
    RUNS.clear()


def test_recording_runs_the_tool_and_writes_one_file_per_call(tmp_path: Path) -> None:
    tape = ToolTape("record", tmp_path / "tape")

    first = _run(tape, call="c1", target="db1")
    second = _run(tape, call="c2", target="db1", depth=3)

    assert (first.content, second.content) == ("db1 probe #1 at depth 1", "db1 probe #2 at depth 3")
    files = sorted((tmp_path / "tape").glob("*.json"))
    assert len(files) == 2 and all(f.name.endswith(("-s1-c1.json", "-s1-c2.json")) for f in files)
    entries = [TapeEntry.model_validate_json(f.read_text()) for f in files]
    assert [(e.spawn_id, e.call_id, e.tool, e.arguments) for e in entries] == [
        ("s1", "c1", "probe", {"target": "db1", "depth": 1}),
        ("s1", "c2", "probe", {"target": "db1", "depth": 3}),
    ]
    assert entries[1].result == second.content and not entries[1].is_error
    assert json.loads(files[0].read_text())["session_id"] == "sess"


def test_replay_serves_each_call_in_recorded_order_without_running_it(tmp_path: Path) -> None:
    recorder = ToolTape("record", tmp_path)
    recorded = [_run(recorder, call=f"c{n}", target="db1").content for n in range(2)]
    other = _run(recorder, call="c9", target="web1").content
    RUNS.clear()

    player = ToolTape("replay", tmp_path)
    # Another spawn id (a replay is a new run), and the calls in another interleaving.
    assert _run(player, spawn="r1", target="web1").content == other
    assert [_run(player, spawn="r1", target="db1").content for _ in range(2)] == recorded
    assert RUNS == []  # nothing ran
    # Each spawn replays the tape from its start.
    assert _run(player, spawn="r2", target="db1").content == recorded[0]


def test_a_call_the_tape_does_not_hold_fails_naming_it(tmp_path: Path) -> None:
    _run(ToolTape("record", tmp_path), target="db1")
    player = ToolTape("replay", tmp_path)

    with pytest.raises(
        TapeMiss,
        match=r'probe \{"depth":2,"target":"db1"\} was not recorded; '
        r'the tape holds for probe: \{"depth":1,"target":"db1"\}',
    ):
        _run(player, target="db1", depth=2)
    _run(player, target="db1")
    with pytest.raises(TapeMiss, match=r"was recorded 1 time\(s\); this spawn asks for it once"):
        _run(player, target="db1")
    with pytest.raises(TapeMiss, match="no such directory"):
        _run(ToolTape("replay", tmp_path / "missing"), target="db1")


def test_a_raising_tool_is_recorded_as_the_loop_reports_it(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        _run(ToolTape("record", tmp_path), tool=broken, target="db1")

    replayed = _run(ToolTape("replay", tmp_path), tool=broken, target="db1")

    assert replayed.is_error
    assert replayed.content == "broken failed: OSError: cannot reach db1"


def test_the_setting(tmp_path: Path) -> None:
    assert parse_tape("") is None and tape_for("") is None
    assert parse_tape(f"record:{tmp_path}") == ("record", tmp_path)
    assert tape_for(f"replay:{tmp_path}") is tape_for(f"replay:{tmp_path}")
    with pytest.raises(UserError, match="write record:<dir>"):
        parse_tape("rewind:/x")
    settings = Settings.load(environ={"ONGRID_TOOL_TAPE": f"replay:{tmp_path}"})
    assert settings.tool_tape == f"replay:{tmp_path}"
    with pytest.raises(UserError, match="tool_tape"):
        Settings.load(environ={"ONGRID_TOOL_TAPE": "record"})
