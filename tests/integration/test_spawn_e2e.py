"""A spawn through a real Celery worker process on a real Redis, with the offline demo model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from registry.settings import Settings
from workers.client import SpawnClient
from workers.embedded_redis import redis_answers

REPO = Path(__file__).resolve().parents[2]
URL = "redis://127.0.0.1:6379/14"


@pytest.fixture
def worker():
    if not redis_answers():
        pytest.fail("no Redis on 127.0.0.1:6379 (./dev test starts one)")
    redis.Redis.from_url(URL).flushdb()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ONGRID_", "OPENAI_"))}
    env.update(REDIS_URL=URL)
    proc = subprocess.Popen(
        [sys.executable, "-m", "coordinator", "worker", "-c", "8", "--loglevel=WARNING"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    yield proc
    proc.terminate()
    proc.wait(timeout=30)
    redis.Redis.from_url(URL).flushdb()


def test_awaited_spawn_runs_tools_and_reports(worker, monkeypatch):
    monkeypatch.chdir(REPO)
    client = SpawnClient(Settings.load(environ={"REDIS_URL": URL}))
    record = client.spawn("disk_specialist", "Is any filesystem close to full?")
    done = client.wait(record.spawn_id, timeout=120)
    assert done.status == "ok", done.error
    assert done.model_id == "ongrid/demo"
    assert "Evidence from host_probe" in done.result
    events = client.bus.history(record.session_id)
    kinds = [e.type for e in events]
    assert kinds[0] == "agent_tile" and kinds[-1] == "task_notification"
    assert "tool_call" in kinds and "tool_result" in kinds and "text" in kinds
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert events[0].persona == "disk_specialist"
    assert events[-1].status == "ok" and events[-1].usage.model_calls == 2
    # A late subscriber gets the same events, in order, exactly once.
    late = list(client.events(record.session_id, timeout=2, until=lambda e: e.seq == len(events)))
    assert [e.seq for e in late] == [e.seq for e in events]


def test_unknown_persona_is_refused_before_enqueue(monkeypatch):
    monkeypatch.chdir(REPO)
    client = SpawnClient(Settings.load(environ={"REDIS_URL": URL}))
    with pytest.raises(Exception, match="unknown agent 'nope'; known: change_reviewer"):
        client.spawn("nope", "hi")
