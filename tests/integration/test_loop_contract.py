"""What a worker sends the model and when it stops: max_turns, per-turn reminders, initial prompt.

Checked at the model boundary: the requests the fake OpenAI server received over the socket.
"""

from __future__ import annotations

import re

from harness import MODEL, Cluster, call, final, first_user, system_of

REMINDER = "Never restart anything without evidence from a probe."


def test_running_out_of_turns_fails_the_spawn(cluster: Cluster):
    cluster.persona("looper", tools=["count_probe"], max_turns=3)
    cluster.fake.script([call("count_probe", {"target": "db1"})])  # never a final answer
    cluster.start_worker()

    record = cluster.client.spawn("looper", "Loop forever.")
    done = cluster.client.wait(record.spawn_id, timeout=60)

    assert done.status == "failed"
    assert "max_turns=3" in done.error
    assert len(cluster.fake.requests()) == 3
    assert cluster.tool_runs() == ["count_probe"] * 3
    note = cluster.history(record.session_id)[-1]
    assert note.type == "task_notification"
    assert note.status == "failed" and "max_turns=3" in note.message
    assert note.usage.model_calls == 3


def test_reminders_are_in_the_system_prompt_and_reinjected_every_turn(cluster: Cluster):
    cluster.persona(
        "careful",
        body="# Careful\n\nYou check before you act.",
        tools=["count_probe"],
        critical_reminder=REMINDER,
    )
    cluster.fake.script(
        [
            call("count_probe", {"target": "db1"}, turn=0),
            call("count_probe", {"target": "db2"}, turn=1),
            final("All checked.", turn=2),
        ]
    )
    cluster.start_worker(env={"ONGRID_DEFAULT_LOCALE": "pt-BR"})

    record = cluster.client.spawn("careful", "Check db1.")
    done = cluster.client.wait(record.spawn_id, timeout=60)

    assert done.status == "ok", done.error
    requests = cluster.fake.requests()
    assert len(requests) == 3
    assert cluster.tool_runs() == ["count_probe", "count_probe"]  # run in the worker, once each
    observed = [m["content"] for m in requests[2]["messages"] if m["role"] == "tool"]
    assert observed == ["probed db1: healthy", "probed db2: healthy"]
    for turn, request in enumerate(requests):
        system = system_of(request)
        assert "You check before you act." in system
        assert f"<critical-reminder>\n{REMINDER}\n</critical-reminder>" in system, turn
        last = request["messages"][-1]
        assert last["role"] == "user"
        assert re.fullmatch(r"<system-reminder>\n.*\n</system-reminder>", last["content"], re.S)
        for expected in ("pt-BR", MODEL, "Tools available: count_probe.", REMINDER):
            assert expected in last["content"], (turn, expected)
        # Re-injected, not accumulated: exactly one reminder message per request.
        reminders = [m for m in request["messages"] if "<system-reminder>" in str(m.get("content"))]
        assert len(reminders) == 1, turn


def test_initial_prompt_is_templated_over_the_context(cluster: Cluster):
    cluster.persona("incident", initial_prompt="Incident {{.incident_id}} on {{.device_id}}.")
    cluster.fake.script([final("Investigated.")])
    cluster.start_worker()

    record = cluster.client.spawn(
        "incident", "Why is it down?", context={"incident_id": 4217, "device_id": 102}
    )
    done = cluster.client.wait(record.spawn_id, timeout=60)

    assert done.status == "ok", done.error
    (request,) = cluster.fake.requests()
    text = first_user(request)
    assert text.startswith("Incident 4217 on 102.")
    assert text.endswith("Why is it down?")
