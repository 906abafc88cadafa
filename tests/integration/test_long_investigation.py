"""A long investigation through litellm's real OpenAI and Anthropic adapters, from real workers.

The model is the scripted investigator of :mod:`workers.testing.investigator` behind the fake
OpenAI or Anthropic server (in this process, so the investigator sees each request body). It
pages through a log of ~16 KB windows with ``read_repo`` and answers from the findings the
conversation still shows, so a finding lost to compaction, or a window read twice, shows in its
answer and in the requests.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness import Cluster, wait_for

from workers.testing.fake_anthropic import FakeAnthropic
from workers.testing.fake_openai import FakeOpenAI
from workers.testing.investigator import WINDOW_LINES, investigator, log_file

MODEL = "openai/gpt-4o-mini"
CLAUDE = "anthropic/claude-sonnet-4-5"
LOG = "logs/db-1.log"
ENOSPC = "ERROR disk /var on db-1 is 100% full: write failed (ENOSPC)"
PROMPT = f"db-1 stopped accepting writes last night. Read {LOG} window by window and find why."


def investigation(
    cluster: Cluster,
    fake: FakeOpenAI | FakeAnthropic,
    *,
    windows: int,
    window: int,
    reply_tokens: int = 8192,
    model: str = MODEL,
) -> dict[str, str]:
    """Write the log, the persona and the config; the workers' environment."""
    repo = cluster.root / "repo"
    (repo / "logs").mkdir(parents=True)
    (repo / LOG).write_text(log_file(windows, culprit=windows * 2 // 3), encoding="utf-8")
    config = cluster.root / "ongrid.yaml"
    config.write_text(yaml.safe_dump({"models": {model: {"context_window": window}}}))
    cluster.persona(
        "log_reader",
        "Read the log you are given window by window, note each finding with the call that "
        "showed it, and answer from your notes once every window is read.",
        model=model,
        tools=["read_repo"],
        max_turns=4 * windows,
    )
    provider = {"OPENAI_API_KEY": "sk-test", "OPENAI_API_BASE": fake.base_url}
    if isinstance(fake, FakeAnthropic):
        provider = {"ANTHROPIC_API_KEY": "sk-ant-test", "ANTHROPIC_API_BASE": fake.base_url}
    return {
        **provider,
        "ONGRID_REPO_ROOT": str(repo),
        "ONGRID_CONFIG": str(config),
        "ONGRID_REPLY_TOKENS": str(reply_tokens),
    }


@pytest.fixture
def openai_30() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(policy=investigator(30, LOG)) as server:
        yield server


def tokens(body: dict[str, Any]) -> int:
    """A request's size in tokens as the runtime's default estimate counts (4 chars a token)."""
    return len(json.dumps([body["messages"], body.get("tools")])) // 4


def windows_read(requests: list[dict[str, Any]]) -> dict[int, set[str]]:
    """Each window's ``read_repo`` calls (by call id) across every request sent."""
    reads: dict[int, set[str]] = defaultdict(set)
    for body in requests:
        for message in body["messages"]:
            calls = [
                (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
                for c in message.get("tool_calls") or ()
            ]
            if isinstance(message.get("content"), list):  # Anthropic's tool_use blocks
                calls += [
                    (b["id"], b["name"], b["input"])
                    for b in message["content"]
                    if b.get("type") == "tool_use"
                ]
            for call_id, name, arguments in calls:
                if name == "read_repo":
                    start = int(arguments.get("start_line", 1))
                    reads[(start - 1) // WINDOW_LINES + 1].add(call_id)
    return reads


def test_a_30_window_investigation_finishes_inside_a_60k_window(
    cluster: Cluster, openai_30: FakeOpenAI
):
    fake = openai_30
    env = investigation(cluster, fake, windows=30, window=60_000)
    cluster.start_worker(env=env)

    record = cluster.client.spawn("log_reader", PROMPT)
    done = cluster.client.wait(record.spawn_id, timeout=180)

    assert done.status == "ok", done.error
    assert "Read all 30 windows" in done.result and ENOSPC in done.result
    assert fake.rejections() == []  # no tool call without its result, nothing malformed
    requests = fake.requests()
    # Unmanaged, the 30 windows alone would be ~120k tokens; every request stays well inside.
    assert max(tokens(body) for body in requests) < 60_000 - 8192
    reads = windows_read(requests)
    assert sorted(reads) == list(range(1, 31))
    assert all(len(ids) == 1 for ids in reads.values())  # no window was read twice
    assert all(body["max_tokens"] <= 8192 for body in requests)
    assert {body.get("prompt_cache_key") for body in requests} == {record.spawn_id}

    events = cluster.history(record.session_id)
    note = events[-1]
    assert note.type == "task_notification" and note.status == "ok"


def test_the_same_investigation_on_anthropic_is_cached_and_never_refused(cluster: Cluster):
    with FakeAnthropic(policy=investigator(30, LOG), context_window=60_000) as fake:
        env = investigation(cluster, fake, windows=30, window=60_000, model=CLAUDE)
        cluster.start_worker(env=env)
        record = cluster.client.spawn("log_reader", PROMPT)
        done = cluster.client.wait(record.spawn_id, timeout=180)

    assert done.status == "ok", done.error
    assert "Read all 30 windows" in done.result and ENOSPC in done.result
    assert fake.rejections() == []  # nothing the runtime sent was malformed or too long
    reads = windows_read(fake.requests())
    assert sorted(reads) == list(range(1, 31))
    assert all(len(ids) == 1 for ids in reads.values())
    usages = fake.usages()
    read = sum(u.cache_read_input_tokens for u in usages)
    assert read > sum(u.prompt_tokens for u in usages) / 2  # most of the input came from cache
    assert all(json.dumps(body).count('"cache_control"') <= 4 for body in fake.requests())


def test_a_worker_killed_while_compacting_resumes_without_losing_or_redoing_it(
    cluster: Cluster, tmp_path: Path
):
    # A window small enough that the conversation must be compacted on the way.
    with FakeOpenAI(policy=investigator(24, LOG)) as fake:
        env = investigation(cluster, fake, windows=24, window=16_000, reply_tokens=2048)
        # The first ledger request parks: the worker is killed while it waits for the reply.
        fake.set_script(
            [{"match": "investigation ledger", "times": 1, "delay": 60, "reply": {"content": "-"}}]
        )
        first = cluster.start_worker("a", env=env)
        record = cluster.client.spawn("log_reader", PROMPT)

        def ledger_asked() -> bool:
            return any(
                "investigation ledger" in json.dumps(b["messages"][-1:]) for b in fake.requests()
            )

        wait_for(ledger_asked, 120, "the first request for an investigation ledger")
        asked_before = len(fake.requests())
        first.kill()
        cluster.start_worker("b", env=env)
        done = cluster.wait_status(record.spawn_id, "ok", "failed", "cancelled", timeout=180)

    assert done.status == "ok", done.error
    assert done.attempts == 2
    assert "Read all 24 windows" in done.result and ENOSPC in done.result
    requests = fake.requests()
    reads = windows_read(requests)
    assert sorted(reads) == list(range(1, 25))
    assert all(len(ids) == 1 for ids in reads.values())  # resumed, not re-read
    # The resumed attempt asked for the ledger again first: nothing read before was redone.
    assert "investigation ledger" in json.dumps(requests[asked_before]["messages"][-1:])

    events = cluster.history(record.session_id)
    compactions = [e for e in events if e.type == "context_compacted"]
    assert compactions and all(e.ledger for e in compactions)
    assert [e.number for e in compactions] == list(range(1, len(compactions) + 1))
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
