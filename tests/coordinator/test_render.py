"""How `ongrid ask` prints a turn: folded tool results, each answer once, model text verbatim."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from coordinator.render import FOLD_LINES, EventPrinter, show_event
from workers.messages import (
    AgentTile,
    Event,
    TaskNotification,
    TextDelta,
    ToolCallEvent,
    ToolResultEvent,
)

SESSION = "s1"
COORD, SPEC = "coord-spawn", "spec-spawn"
ANSWER = "Disk /var is 97% full.\nThe biggest directory is /var/log/journal (41 GiB)."
RESULT = json.dumps({"filesystems": [{"mount": f"/m{i}", "used": i} for i in range(12)]}, indent=1)


def _console() -> tuple[Console, io.StringIO]:
    sink = io.StringIO()
    return Console(file=sink, width=200, color_system=None, soft_wrap=True), sink


def _words(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def _turn(relay: str, chunk: int = 5) -> list[Event]:
    """A coordinator turn: the specialist streams ANSWER, the coordinator streams ``relay``."""
    return [
        AgentTile(session_id=SESSION, spawn_id=COORD, persona="coordinator", description="Routes."),
        ToolCallEvent(session_id=SESSION, spawn_id=COORD, call_id="c1", name="spawn_agent",
                      arguments='{"agent": "disk"}'),
        AgentTile(session_id=SESSION, spawn_id=SPEC, persona="disk", description="Disks."),
        ToolCallEvent(session_id=SESSION, spawn_id=SPEC, call_id="p1", name="host_probe",
                      arguments="{}"),
        ToolResultEvent(session_id=SESSION, spawn_id=SPEC, call_id="p1", name="host_probe",
                        content=RESULT),
        *[TextDelta(session_id=SESSION, spawn_id=SPEC, text=t) for t in _words(ANSWER, chunk)],
        TaskNotification(session_id=SESSION, spawn_id=SPEC, status="ok", persona="disk",
                         message=ANSWER),
        ToolResultEvent(session_id=SESSION, spawn_id=COORD, call_id="c1", name="spawn_agent",
                        content=ANSWER),
        *[TextDelta(session_id=SESSION, spawn_id=COORD, text=t) for t in _words(relay, chunk)],
        TaskNotification(session_id=SESSION, spawn_id=COORD, status="ok", persona="coordinator",
                         message=relay),
    ]  # fmt: skip


def _print(events: list[Event], **options: object) -> str:
    console, sink = _console()
    printer = EventPrinter(console, more_hint="; --full shows them", **options)  # type: ignore[arg-type]
    for event in events:
        printer.show(event)
    printer.close()
    return sink.getvalue()


@pytest.mark.parametrize("chunk", [1, 3, 7, 1000])
def test_a_relayed_answer_is_printed_once_whatever_the_deltas(chunk):
    relay = f"Here is what the disk specialist found:\n{ANSWER}\nClean the journal first."
    out = _print(_turn(relay, chunk))
    assert out.count("The biggest directory is /var/log/journal") == 1
    assert "← spawn_agent disk's answer, shown above" in out
    assert "found:\n(disk's answer, shown above)\nClean the journal first." in out
    assert out.rstrip().endswith("■ coordinator: ok (0 model calls, 0 tokens)")
    assert "Clean the journal first." in out


def test_a_coordinator_in_its_own_words_is_printed_whole():
    relay = "The specialist says /var is nearly full; the journal takes most of it."
    out = _print(_turn(relay))
    assert relay in out
    assert out.count("The biggest directory is /var/log/journal") == 1  # the specialist's own


def test_text_that_only_starts_like_an_answer_is_printed_as_it_came():
    relay = "Disk /var is 97% full, says the specialist, and nothing else."
    out = _print(_turn(relay, chunk=2))
    assert relay in out and "shown above)" not in out.split("← spawn_agent")[1]


def test_tool_results_fold_to_their_first_lines_and_full_shows_all():
    lines = RESULT.splitlines()
    folded = _print(_turn("ok"))
    block = folded.split("← host_probe\n")[1].splitlines()
    assert block[:FOLD_LINES] == ["    " + line for line in lines[:FOLD_LINES]]
    assert block[FOLD_LINES] == f"    … {len(lines) - FOLD_LINES} more lines; --full shows them"
    whole = _print(_turn("ok"), full=True).split("← host_probe\n")[1].splitlines()
    assert whole[: len(lines)] == ["    " + line for line in lines]
    assert "more lines" not in "\n".join(whole)


def test_a_one_line_result_stays_on_the_arrow_line_and_long_lines_are_cut():
    console, sink = _console()
    event = ToolResultEvent(session_id=SESSION, call_id="x", name="probe", content="x" * 500)
    show_event(console, event)
    assert sink.getvalue() == f"← probe {'x' * 200}…\n"


def test_model_text_is_never_read_as_markup():
    tricky = "[bold]not bold[/bold] [demo model: deterministic] [/]"
    events: list[Event] = [
        AgentTile(session_id=SESSION, spawn_id=SPEC, persona="disk", description="[red]x[/red]"),
        TextDelta(session_id=SESSION, spawn_id=SPEC, text=tricky),
        ToolResultEvent(session_id=SESSION, spawn_id=SPEC, call_id="p", name="t", content=tricky),
        TaskNotification(session_id=SESSION, spawn_id=SPEC, status="failed", persona="disk",
                         message=tricky),
    ]  # fmt: skip
    out = _print(events)
    assert out.count(tricky) == 3 and "[red]x[/red]" in out


def test_interleaved_text_of_two_spawns_says_whose_it_is():
    events: list[Event] = [
        AgentTile(session_id=SESSION, spawn_id="a", persona="alpha", description="A."),
        AgentTile(session_id=SESSION, spawn_id="b", persona="beta", description="B."),
        TextDelta(session_id=SESSION, spawn_id="a", text="one "),
        TextDelta(session_id=SESSION, spawn_id="b", text="two "),
        TextDelta(session_id=SESSION, spawn_id="a", text="three"),
    ]
    out = _print(events)
    assert out.endswith("one \n[beta]\ntwo \n[alpha]\nthree\n")
