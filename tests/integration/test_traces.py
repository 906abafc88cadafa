"""One chat is one trace: API request → coordinator turn → its model and tool calls → specialist.

A real ``ongrid api`` and a plain ``ongrid worker`` (whose coordinator pool is a child process of
its own) export their spans over OTLP/HTTP to a receiver in the test process
(:mod:`workers.testing.otlp_receiver`), batched every 200 ms. The fake LLM has the coordinator
dispatch a specialist with ``spawn_agent``, then relay its answer. Once the answer has streamed
back, the spans of the three processes must form one tree: the API's server span is the root,
the coordinator's ``invoke_agent`` span its child, the specialist's ``invoke_agent`` span below
the coordinator's ``execute_tool spawn_agent`` span, with the GenAI attributes on them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import yaml
from harness import MODEL, Cluster, Proc, call, final, wait_for
from procs import ALL_QUEUES, api_client, free_port, ongrid, wait_consumers

from workers.testing.otlp_receiver import OtlpReceiver

TOKEN = "trace-tests-admin-token-0001"
#: Liveness deadline of a start, of the chat, and of the spans to arrive.
DEADLINE = 120.0
SPECIALIST = "netdoc"
QUESTION = "Is the uplink of sw1 flapping?"
TASK = "Check the uplink of sw1."
SPECIALIST_ANSWER = "The uplink is stable."
ANSWER = "sw1's uplink is stable."
COORDINATOR_MARK = "You are Ongrid's coordinator"
#: The names of the spans one chat leaves, each in the process that makes it.
API_SPAN = "POST /api/v1/chat"
COORDINATOR_SPAN = "invoke_agent coordinator"
DISPATCH_SPAN = "execute_tool spawn_agent"
SPECIALIST_SPAN = f"invoke_agent {SPECIALIST}"

Span = dict[str, Any]


@dataclass
class Site:
    api: httpx.Client
    receiver: OtlpReceiver
    procs: list[Proc]


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as started:
        yield started


@pytest.fixture
def site(cluster: Cluster, receiver: OtlpReceiver) -> Iterator[Site]:
    config = cluster.root / "ongrid.yaml"
    config.write_text(
        yaml.safe_dump({"auth": {"tokens": {TOKEN: {"user": "alice", "role": "admin"}}}})
    )
    env = {
        **cluster.env,
        "ONGRID_CONFIG": str(config),
        "ONGRID_DATABASE_URL": f"sqlite:///{cluster.root / 'ongrid.db'}",
        "ONGRID_DEFAULT_MODEL": MODEL,
        "ONGRID_COORDINATOR_MODEL": MODEL,
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        # Spans leave each process within 200 ms of their end, not the SDK's 5 s.
        "OTEL_BSP_SCHEDULE_DELAY": "200",
    }
    cluster.persona(SPECIALIST, body="# Net doctor")  # before the worker starts: it loads it then
    port = free_port()
    api = Proc("api", ongrid("api", f"--port={port}"), cluster.root, env)
    worker = Proc("worker", ongrid("worker", "-c", "4", "--name=traced"), cluster.root, env)
    cluster.workers += [api, worker]  # type: ignore[list-item]  # killed and logged on close
    client = api_client(api, port, TOKEN, DEADLINE)
    wait_consumers(cluster.redis, ALL_QUEUES, worker)  # the coordinator pool's too
    yield Site(client, receiver, [api, worker])
    client.close()


def _chat(api: httpx.Client, prompt: str) -> list[dict[str, Any]]:
    """POST /api/v1/chat; the data of each event it streams, until the turn's end."""
    with api.stream("POST", "/api/v1/chat", json={"prompt": prompt}) as response:
        assert response.status_code == 200, response.read()
        return [json.loads(ln[5:]) for ln in response.iter_lines() if ln.startswith("data:")]


def _named(spans: list[Span], name: str) -> list[Span]:
    return [s for s in spans if s["name"] == name]


def _ancestors(span: Span, by_id: dict[str, Span]) -> list[str]:
    """The names of the spans above ``span``, nearest first, as far as they were received."""
    names = []
    while (parent := by_id.get(span["parent_span_id"])) is not None:
        names.append(parent["name"])
        span = parent
    return names


def _instance(span: Span) -> str:
    return str(span["resource"]["service.instance.id"])


def _describe(spans: list[Span]) -> str:
    return "\n".join(
        f"  {s['service']:<14} {_instance(s):<36} {s['trace_id']} {s['span_id']}"
        f" <- {s['parent_span_id'] or '-':<16} {s['name']}"
        for s in spans
    )


def test_one_chat_is_one_trace_from_the_api_request_to_the_specialist_it_dispatches(
    cluster: Cluster, site: Site
):
    dispatch = {"agent": SPECIALIST, "prompt": TASK, "reason": "uplink flaps"}
    cluster.fake.script(
        [
            final(SPECIALIST_ANSWER, where="system", match="# Net doctor"),
            call("spawn_agent", dispatch, where="system", match=COORDINATOR_MARK, turn=0),
            final(ANSWER, where="system", match=COORDINATOR_MARK),
        ]
    )

    events = _chat(site.api, QUESTION)

    assert events[-1]["type"] == "task_notification" and events[-1]["message"] == ANSWER
    # A process exports its spans in the order they end: once its outermost span has arrived,
    # so has every span that ended inside it (its model and tool calls).
    expected = (API_SPAN, COORDINATOR_SPAN, DISPATCH_SPAN, SPECIALIST_SPAN)

    def arrived() -> list[Span]:
        for proc in site.procs:
            assert proc.alive(), f"{proc.name} exited:\n{proc.log()}"
        spans = site.receiver.spans()
        return spans if all(_named(spans, name) for name in expected) else []

    try:
        spans = wait_for(arrived, DEADLINE, f"the spans {', '.join(expected)}", every=0.2)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; received:\n{_describe(site.receiver.spans())}") from None
    received = f"received:\n{_describe(spans)}"

    (request,) = _named(spans, API_SPAN)
    trace = [s for s in spans if s["trace_id"] == request["trace_id"]]
    by_id = {s["span_id"]: s for s in trace}
    assert request["service"] == "ongrid-api" and request["kind"] == "SPAN_KIND_SERVER"
    assert request["attributes"]["http.response.status_code"] == 200
    # Every span of the chat's spawns belongs to the request's trace: none started one of its own.
    assert {s["trace_id"] for s in spans if s["service"] == "ongrid-worker"} == {
        request["trace_id"]
    }, received

    (coordinator,) = _named(trace, COORDINATOR_SPAN)
    assert coordinator["parent_span_id"] == request["span_id"], received
    assert coordinator["service"] == "ongrid-worker"
    assert coordinator["attributes"]["gen_ai.agent.name"] == "coordinator"
    assert coordinator["attributes"]["gen_ai.operation.name"] == "invoke_agent"
    assert coordinator["attributes"]["gen_ai.conversation.id"] == events[-1]["session_id"]

    # The coordinator's two model calls and its one tool call, inside its spawn.
    chats = [s for s in trace if s["name"].startswith("chat ")]
    coordinator_chats = [s for s in chats if s["parent_span_id"] == coordinator["span_id"]]
    assert len(coordinator_chats) == 2, received  # the dispatch, then the relayed answer
    (dispatched,) = _named(trace, DISPATCH_SPAN)
    assert _ancestors(dispatched, by_id)[-2:] == [COORDINATOR_SPAN, API_SPAN], received
    assert dispatched["attributes"]["gen_ai.tool.name"] == "spawn_agent"

    # The specialist ran in the other process, under the coordinator's tool call.
    (specialist,) = _named(trace, SPECIALIST_SPAN)
    assert _ancestors(specialist, by_id)[0] == DISPATCH_SPAN, received
    assert _ancestors(specialist, by_id)[-2:] == [COORDINATOR_SPAN, API_SPAN], received
    assert specialist["attributes"]["gen_ai.agent.name"] == SPECIALIST
    (specialist_chat,) = [s for s in chats if s["parent_span_id"] == specialist["span_id"]]
    assert len(chats) == 3, received
    # Each span names the worker that made it: the coordinator pool is a process of its own.
    assert _instance(coordinator).startswith("traced-coordinator@")
    assert {_instance(s) for s in (dispatched, *coordinator_chats)} == {_instance(coordinator)}
    assert _instance(specialist).startswith("traced@")
    assert _instance(specialist_chat) == _instance(specialist)

    for model_call in [*coordinator_chats, specialist_chat]:
        attributes = model_call["attributes"]
        assert attributes["gen_ai.operation.name"] == "chat"
        assert attributes["gen_ai.request.model"] == MODEL
        assert attributes["gen_ai.usage.input_tokens"] > 0
        assert attributes["gen_ai.usage.output_tokens"] > 0
