"""The runtime's traces: nothing recorded unless configured, a W3C context that survives a trip
through a dict, spans that nest as spawn → model call / tool call with the GenAI attributes, and
an exported trace that continues one started elsewhere."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from registry.settings import Settings
from workers import tracing
from workers.messages import Usage

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    assert tracing.init_tracing(Settings(), "ongrid-test", exporter=memory)
    yield memory
    tracing.shutdown_tracing()


def finished(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    """The spans ended so far, by name (the batch processor exports them when flushed)."""
    assert tracing.flush_tracing()
    return {s.name: s for s in exporter.get_finished_spans()}


def test_without_an_endpoint_nothing_is_installed_and_spans_record_nothing():
    assert not tracing.init_tracing(Settings(), "ongrid-test")
    assert not tracing.tracing_enabled()
    with tracing.agent_span("probe") as current:
        assert not current.is_recording()
        assert tracing.inject() == {}  # no trace, nothing to carry


def test_without_an_endpoint_a_callers_context_still_passes_through():
    """A process that exports nothing does not break the trace of those around it."""
    parent = tracing.extract({"traceparent": TRACEPARENT})
    with tracing.agent_span("relay", context=parent), tracing.tool_span("spawn_agent") as tool:
        assert not tool.is_recording()
        carried = tracing.inject()  # what a child spawn's record would carry
    assert carried == {"traceparent": TRACEPARENT}


def test_an_endpoint_installs_the_otlp_exporter():
    settings = Settings(otlp_endpoint="http://127.0.0.1:4318/")
    try:
        assert tracing.init_tracing(settings, "ongrid-test")
        assert tracing.tracing_enabled()
    finally:
        tracing.shutdown_tracing()  # nothing was recorded: no export is attempted
    assert tracing.traces_url(settings.otlp_endpoint) == "http://127.0.0.1:4318/v1/traces"
    assert Settings.load({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}).otlp_endpoint == (
        "http://c:4318"
    )


def test_inject_then_extract_continues_the_same_trace(exporter: InMemorySpanExporter):
    with tracing.span("api request") as request:
        carrier = tracing.inject()
    assert set(carrier) == {"traceparent"}
    with tracing.agent_span("probe", context=tracing.extract(carrier)):
        pass

    spans = finished(exporter)
    agent = spans["invoke_agent probe"]
    assert agent.context.trace_id == request.get_span_context().trace_id
    assert agent.parent is not None
    assert agent.parent.span_id == request.get_span_context().span_id
    assert agent.parent.is_remote


def test_extract_of_nothing_starts_a_trace_of_its_own(exporter: InMemorySpanExporter):
    with tracing.span("outer") as outer, tracing.span("fresh", context=tracing.extract(None)):
        pass
    fresh = finished(exporter)["fresh"]
    assert fresh.parent is None
    assert fresh.context.trace_id != outer.get_span_context().trace_id


def test_spans_nest_spawn_model_call_tool_call_with_the_genai_attributes(
    exporter: InMemorySpanExporter,
):
    parent = tracing.extract({"traceparent": TRACEPARENT})
    with tracing.agent_span("probe", context=parent, session_id="s1") as agent:
        with tracing.chat_span("openai/gpt-4o-mini") as chat:
            tracing.record_usage(chat, Usage(prompt_tokens=12, completion_tokens=5))
        with tracing.tool_span("host_probe", "call-1"):
            pass

    spans = finished(exporter)
    agent_id = agent.get_span_context().span_id
    chat_span, tool = spans["chat openai/gpt-4o-mini"], spans["execute_tool host_probe"]
    assert chat_span.parent is not None and chat_span.parent.span_id == agent_id
    assert tool.parent is not None and tool.parent.span_id == agent_id
    assert {s.context.trace_id for s in spans.values()} == {int(TRACEPARENT.split("-")[1], 16)}
    assert dict(spans["invoke_agent probe"].attributes or {}) == {
        tracing.OPERATION_NAME: tracing.INVOKE_AGENT,
        tracing.AGENT_NAME: "probe",
        tracing.CONVERSATION_ID: "s1",
    }
    assert dict(chat_span.attributes or {}) == {
        tracing.OPERATION_NAME: tracing.CHAT,
        tracing.REQUEST_MODEL: "openai/gpt-4o-mini",
        tracing.USAGE_INPUT_TOKENS: 12,
        tracing.USAGE_OUTPUT_TOKENS: 5,
    }
    assert dict(tool.attributes or {}) == {
        tracing.OPERATION_NAME: tracing.EXECUTE_TOOL,
        tracing.TOOL_NAME: "host_probe",
        tracing.TOOL_CALL_ID: "call-1",
    }
    assert spans["invoke_agent probe"].resource.attributes["service.name"] == "ongrid-test"


def test_concurrent_spawns_on_one_event_loop_keep_their_own_parents(
    exporter: InMemorySpanExporter,
):
    async def spawn(persona: str) -> None:
        with tracing.agent_span(persona):
            await asyncio.sleep(0)  # the other spawn runs in between
            with tracing.chat_span(f"model-of-{persona}"):
                await asyncio.sleep(0)

    async def both() -> None:
        await asyncio.gather(spawn("a"), spawn("b"))

    asyncio.run(both())
    spans = finished(exporter)
    for persona in ("a", "b"):
        chat = spans[f"chat model-of-{persona}"]
        assert chat.parent is not None
        assert chat.parent.span_id == spans[f"invoke_agent {persona}"].context.span_id


def test_an_exception_escaping_a_span_is_recorded_as_its_error(exporter: InMemorySpanExporter):
    with pytest.raises(RuntimeError), tracing.tool_span("bash"):
        raise RuntimeError("boom")
    tool = finished(exporter)["execute_tool bash"]
    assert tool.status.status_code is StatusCode.ERROR
    assert [e.name for e in tool.events] == ["exception"]
