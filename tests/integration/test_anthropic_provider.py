"""A spawn on Claude through litellm's real Anthropic adapter, from a real worker, against the
fake Messages API: rate limits and overload are waited out as the provider asks, parallel tool
calls are answered in one message, and nothing the runtime sends is refused."""

from __future__ import annotations

import json

from harness import Cluster

from workers.testing.fake_anthropic import FakeAnthropic

CLAUDE = "anthropic/claude-sonnet-4-5"
READS = [
    {"name": "read_repo", "arguments": {"path": "notes/db-1.txt"}},
    {"name": "read_repo", "arguments": {"path": "notes/db-2.txt"}},
]


def test_429_and_529_are_waited_out_and_parallel_calls_answered_together(cluster: Cluster):
    repo = cluster.root / "repo"
    (repo / "notes").mkdir(parents=True)
    (repo / "notes" / "db-1.txt").write_text("db-1: /var at 100%\n")
    (repo / "notes" / "db-2.txt").write_text("db-2: /var at 41%\n")
    cluster.persona("claude_reader", model=CLAUDE, tools=["read_repo"], max_turns=4)
    rules = [
        {"times": 1, "fail": {"status": 429, "retry_after": 2}},
        {"times": 1, "fail": {"status": 529}},
        {"turn": 0, "reply": {"content": "Reading both notes.", "tool_calls": READS}},
        {"turn": 1, "reply": {"content": "db-1 is full; db-2 is not."}},
    ]
    with FakeAnthropic(rules) as fake:
        cluster.start_worker(
            env={
                "ANTHROPIC_API_KEY": "sk-ant-test",
                "ANTHROPIC_API_BASE": fake.base_url,
                "ONGRID_REPO_ROOT": str(repo),
            }
        )
        record = cluster.client.spawn("claude_reader", "Which database disk is full?")
        done = cluster.client.wait(record.spawn_id, timeout=90)

    assert done.status == "ok", done.error
    assert done.model_id == CLAUDE and done.result == "db-1 is full; db-2 is not."
    assert fake.rejections() == []
    arrivals = fake.arrivals()
    assert len(arrivals) == 4
    assert arrivals[1] - arrivals[0] >= 2.0  # the 429's retry-after, not the default backoff
    answered = fake.requests()[3]["messages"][-1]
    results = [b for b in answered["content"] if b["type"] == "tool_result"]
    assert len(results) == 2  # both calls of the turn, in the one user message
    assert "100%" in json.dumps(results[0]) and "41%" in json.dumps(results[1])
    tile = cluster.history(record.session_id)[0]
    assert tile.type == "agent_tile" and tile.model == CLAUDE
