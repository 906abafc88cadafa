"""The recipe model: replies decided from the conversation, over the OpenAI protocol."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from workers.testing.fake_openai import Reply
from workers.testing.recipe_model import Conversation, RecipeModel, answer, call

TOOLS = [{"type": "function", "function": {"name": "host_probe", "parameters": {}}}]


def follow(conv: Conversation) -> Reply:
    """Probe first; then answer with what the probe said."""
    if not conv.observations:
        return call("host_probe", section="disk")
    return answer(f"Task {conv.task!r} with {list(conv.tools)}: {conv.last.result}")


def _chat(model: RecipeModel, messages: list[dict[str, Any]]) -> httpx.Response:
    body = {"model": "fake", "messages": messages, "tools": TOOLS}
    return httpx.post(f"{model.base_url}/chat/completions", json=body, timeout=10)


def _conversation(result: str) -> list[dict[str, Any]]:
    made = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "host_probe", "arguments": '{"section": "disk"}'},
    }
    return [
        {"role": "system", "content": "You are a disk specialist."},
        {"role": "user", "content": "Is / full?"},
        {"role": "user", "content": "<system-reminder>\nTools available: host_probe.\n"},
        {"role": "assistant", "content": None, "tool_calls": [made]},
        {"role": "tool", "tool_call_id": "call_1", "content": result},
    ]


def test_each_reply_is_decided_from_the_tool_results_sent(tmp_path: Path) -> None:
    log = tmp_path / "decisions.jsonl"
    with RecipeModel(follow, log_path=log) as model:
        first = _chat(model, _conversation("")[:3]).json()["choices"][0]["message"]
        second = _chat(model, _conversation("/ is 41% full")).json()["choices"][0]["message"]

    assert first["tool_calls"][0]["function"] == {
        "name": "host_probe",
        "arguments": json.dumps({"section": "disk"}),
    }
    assert second["content"] == "Task 'Is / full?' with ['host_probe']: / is 41% full"
    decided = [json.loads(line) for line in log.read_text().splitlines()]
    assert [d["after"] for d in decided] == [[], ["host_probe"]]


def test_a_call_over_the_budget_fails_the_request_saying_why() -> None:
    with RecipeModel(lambda conv: call("host_probe"), max_calls=1) as model:
        refused = _chat(model, _conversation("ok"))

    assert refused.status_code == 500
    assert "tool call 2, over its budget of 1" in refused.json()["error"]["message"]


def test_the_conversation_reads_the_task_tools_and_observations() -> None:
    conv = Conversation.from_request({"messages": _conversation("42"), "tools": TOOLS})

    assert (conv.system, conv.task, conv.tools) == (
        "You are a disk specialist.",
        "Is / full?",
        ("host_probe",),
    )
    (seen,) = conv.observations
    assert (seen.tool, seen.arguments, seen.result, seen.call_id) == (
        "host_probe",
        {"section": "disk"},
        "42",
        "call_1",
    )
    assert conv.of("bash") == [] and conv.last is seen
