"""Awaited spawns end to end: client → Redis → Celery worker process → litellm → fake LLM."""

from __future__ import annotations

import pytest
from harness import MODEL, Cluster, final, text_of, wait_for

from registry.errors import NotFoundError
from workers.fleet import read_fleet
from workers.spawns import SpawnRecord

ANSWER = "Disk usage on db1 is 41 percent, well below any alert threshold."


def test_awaited_spawn_streams_tile_text_and_notification(cluster: Cluster):
    cluster.persona("probe", tools=["count_probe"], body="# Probe\n\nYou probe hosts.")
    cluster.fake.script([final(ANSWER)])
    cluster.start_worker()

    record = cluster.client.spawn("probe", "How full is db1?")
    done = cluster.client.wait(record.spawn_id, timeout=60)

    assert done.status == "ok", done.error
    assert done.result == ANSWER
    assert done.model_id == MODEL
    events = list(
        cluster.client.events(
            record.session_id, timeout=10, until=lambda e: e.type == "task_notification"
        )
    )
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    tile, note = events[0], events[-1]
    assert tile.type == "agent_tile"
    assert (tile.persona, tile.description) == ("probe", "Test persona probe.")
    assert [(t["name"], t["class"], t["confirmation"]) for t in tile.tools] == [
        ("count_probe", "read", "none")
    ]
    assert {e.type for e in events[1:-1]} == {"text"}
    assert text_of(events) == ANSWER
    assert note.type == "task_notification" and note.status == "ok"
    assert note.message == ANSWER and note.persona == "probe"
    assert note.usage.model_calls == 1
    assert note.usage.prompt_tokens > 0 and note.usage.completion_tokens > 0
    assert note.usage.total_tokens == note.usage.prompt_tokens + note.usage.completion_tokens
    (request,) = cluster.fake.requests()
    assert request["model"] == "gpt-4o-mini"
    assert [t["function"]["name"] for t in request["tools"]] == ["count_probe"]


def test_provider_without_credentials_maps_to_the_default_provider(cluster: Cluster):
    cluster.persona("claude_fan", model="anthropic/claude-sonnet-4-6")
    cluster.fake.script([final("mapped")])
    cluster.start_worker()

    record = cluster.client.spawn("claude_fan", "Which model are you?")
    done = cluster.client.wait(record.spawn_id, timeout=60)

    assert done.status == "ok", done.error
    # No ANTHROPIC_API_KEY in the workers' environment: anthropic/… runs on default_provider.
    assert done.model_id == "openai/claude-sonnet-4-6"
    assert [r["model"] for r in cluster.fake.requests()] == ["claude-sonnet-4-6"]


def test_a_model_that_cannot_be_used_fails_at_once_saying_what_to_set(cluster: Cluster):
    cluster.persona("glm_fan", model="zhipu/glm-4.7")
    # No default provider to fall back on, and no key for Zhipu's GLM (litellm's zai).
    cluster.start_worker(env={"ONGRID_DEFAULT_PROVIDER": "", "ZAI_API_KEY": ""})
    problem = (
        "model zhipu/glm-4.7 (zai/glm-4.7) cannot be used: zai needs ZAI_API_KEY; set "
        "ZAI_API_KEY, or ONGRID_DEFAULT_PROVIDER to a provider that is configured"
    )
    # Flagged before anyone asks: the worker's fleet report carries it.
    wait_for(lambda: read_fleet(cluster.redis), 30, "the worker's fleet report")
    (report,) = read_fleet(cluster.redis)
    assert report.model_problems == {"glm_fan": problem}

    record = cluster.client.spawn("glm_fan", "Is the disk full?")
    done = cluster.client.wait(record.spawn_id, timeout=60)

    assert done.status == "failed"
    assert done.error == f"agent 'glm_fan': {problem}"
    assert cluster.fake.requests() == []  # never another model in its place


def test_zhipu_runs_on_litellms_zai_provider_with_its_key(cluster: Cluster):
    cluster.persona("glm_fan", model="zhipu/glm-4.7")
    cluster.fake.script([final("glm here")])
    # litellm's zai provider, pointed at the fake OpenAI-compatible server.
    cluster.start_worker(env={"ZAI_API_KEY": "zk-test", "ZAI_API_BASE": cluster.fake.base_url})

    record = cluster.client.spawn("glm_fan", "Which model are you?")
    done = cluster.client.wait(record.spawn_id, timeout=60)

    assert done.status == "ok", done.error
    assert done.model_id == "zai/glm-4.7" and done.result == "glm here"
    [tile] = [e for e in cluster.history(record.session_id) if e.type == "agent_tile"]
    assert tile.model == "zai/glm-4.7" and tile.model_note == ""


def test_offline_demo_model_when_persona_and_organisation_name_no_model(cluster: Cluster):
    cluster.persona("disk", model="", tools=["host_probe"])
    cluster.start_worker()

    record = cluster.client.spawn("disk", "Is any filesystem close to full?")
    done = cluster.client.wait(record.spawn_id, timeout=60)

    assert done.status == "ok", done.error
    assert done.model_id == "ongrid/demo"
    assert "Evidence from host_probe" in done.result
    assert cluster.fake.requests() == []
    events = cluster.history(record.session_id)
    assert events[-1].type == "task_notification" and events[-1].usage.model_calls == 2
    tile = events[0]
    assert tile.type == "agent_tile" and tile.model == "ongrid/demo"
    assert "not an LLM" in tile.model_note


def test_unknown_persona_or_role_is_refused_before_anything_is_enqueued(cluster: Cluster):
    cluster.persona("probe")
    cluster.persona("other")
    client = cluster.client

    with pytest.raises(NotFoundError, match=r"unknown agent 'nope'; known: generalist, other"):
        client.spawn("nope", "hi")
    with pytest.raises(NotFoundError, match=r"unknown role 'intern'; known: admin, operator"):
        client.spawn("probe", "hi", role="intern")

    assert cluster.redis.keys("*") == []  # no spawn record, no task message


def test_spawn_record_round_trips_through_redis(cluster: Cluster):
    record = SpawnRecord(session_id="s1", persona="probe", prompt="p", queue="qa")
    cluster.client.store.create(record)
    assert cluster.client.store.get(record.spawn_id) == record
    assert cluster.client.store.active() == [record.spawn_id]
