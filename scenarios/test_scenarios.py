"""The staged incidents end to end: real fault, real worker, shipped persona, recipe model.

For each incident the persona's model, following the persona's written recipe, must reach the
decisive evidence (values only the live system produced, read independently by the stage) in at
most six tool calls, the knowledge base first, and cite it in a final answer in the persona's
output format. One run is recorded on a tool tape and replayed once the fault is gone.

``ONGRID_SCENARIO_TRANSCRIPT=<file>`` makes the target_down scenario write its transcript there:
that is how ``scenarios/TRANSCRIPT.md`` is made (its first lines give the command).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scenarios import clickhouse_mutation, cpu, disk, memory, target_down
from scenarios._base import MAX_TOOL_CALLS, Scenario
from scenarios._investigate import Investigation, investigate, output_fields, transcript
from workers.tool_tape import TapeEntry

SCENARIOS = [
    disk.SCENARIO,
    cpu.SCENARIO,
    memory.SCENARIO,
    target_down.SCENARIO,
    clickhouse_mutation.SCENARIO,
]
TRANSCRIPT_ENV = "ONGRID_SCENARIO_TRANSCRIPT"
TRANSCRIPT_SCENARIO = "target_down"
REGENERATE = (
    f"{TRANSCRIPT_ENV}=scenarios/TRANSCRIPT.md .venv/bin/python -m pytest scenarios -k target_down"
)


def assert_solved(run: Investigation) -> None:
    """The run's evidence, budget and output, as the module docstring says."""
    assert run.record.status == "ok", f"{run.record.error}\n{run.worker_log[-3000:]}"
    names = [c.name for c in run.calls]
    assert 0 < len(names) <= MAX_TOOL_CALLS, names
    assert names[0] == "query_knowledge", names
    assert "KB: none" not in run.answer, "the playbook was not found"
    results = "\n".join(r.content for r in run.results)
    for what, value in run.staged.evidence.items():
        assert value in results, f"no tool result shows the {what} {value!r}"
        assert value in run.answer, f"the answer does not cite the {what} {value!r}"
    lines = run.answer.splitlines()
    at = [
        next((n for n, ln in enumerate(lines) if ln.startswith(f"{field}:")), -1)
        for field in output_fields(run.scenario.persona_file)
    ]
    assert -1 not in at and at == sorted(at), f"not the persona's output format:\n{run.answer}"


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_the_persona_reaches_and_cites_the_evidence(
    scenario: Scenario, tmp_path: Path, redis_db: str
) -> None:
    with scenario.stage(tmp_path / "stage") as staged:
        run = investigate(scenario, staged, tmp_path / "site", redis_db)
    assert_solved(run)
    target = os.environ.get(TRANSCRIPT_ENV)
    if target and scenario.name == TRANSCRIPT_SCENARIO:
        Path(target).write_text(transcript(run, REGENERATE), encoding="utf-8")


def test_a_recorded_run_replays_with_the_fault_gone(tmp_path: Path, redis_db: str) -> None:
    tape = tmp_path / "tape"
    with disk.stage(tmp_path / "stage") as staged:
        recorded = investigate(
            disk.SCENARIO,
            staged,
            tmp_path / "live",
            redis_db,
            {"ONGRID_TOOL_TAPE": f"record:{tape}"},
        )
    assert_solved(recorded)
    assert not Path(staged.evidence["mountpoint"]).exists()  # torn down: live tools see nothing

    replayed = investigate(
        disk.SCENARIO, staged, tmp_path / "replay", redis_db, {"ONGRID_TOOL_TAPE": f"replay:{tape}"}
    )

    assert replayed.record.status == "ok", replayed.record.error
    assert replayed.answer == recorded.answer
    entries = sorted(
        (TapeEntry.model_validate_json(p.read_text()) for p in tape.glob("*.json")),
        key=lambda e: e.recorded_ns,
    )
    assert [(e.call_id, e.tool) for e in entries] == [(c.call_id, c.name) for c in recorded.calls]
    assert {e.spawn_id for e in entries} == {recorded.record.spawn_id}
    assert [e.result for e in entries] == [r.content for r in replayed.results]
