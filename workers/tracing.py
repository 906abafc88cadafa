"""OpenTelemetry traces of the runtime: API request → spawn → turn → model call / tool call.

:func:`init_tracing` installs an SDK tracer provider exporting over OTLP/HTTP only when an
endpoint is configured (``Settings.otlp_endpoint``, from ``OTEL_EXPORTER_OTLP_ENDPOINT``);
otherwise the API's no-op tracer stays: a span with a parent from another process costs about
3 µs (it only carries that context on), any other about 0.15 µs, and no SDK is imported.

The trace context crosses process boundaries as a W3C ``traceparent``: :func:`inject` writes
the current one into a dict (a spawn record, Celery headers) and :func:`extract` turns such a
dict back into the parent of the next span, so a spawn's spans, its child spawns' and the API
request that started them form one trace. Spans carry the GenAI
semantic-convention attributes (the constants below) that trace viewers group agents by.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from registry.settings import Settings
from workers.messages import Usage

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

__all__ = [
    "AGENT_NAME",
    "CHAT",
    "CONVERSATION_ID",
    "EXECUTE_TOOL",
    "INVOKE_AGENT",
    "OPERATION_NAME",
    "REQUEST_MODEL",
    "TOOL_CALL_ID",
    "TOOL_NAME",
    "USAGE_INPUT_TOKENS",
    "USAGE_OUTPUT_TOKENS",
    "agent_span",
    "chat_span",
    "extract",
    "flush_tracing",
    "init_tracing",
    "inject",
    "record_usage",
    "shutdown_tracing",
    "span",
    "tool_span",
    "tracing_enabled",
]

log = logging.getLogger(__name__)

# GenAI semantic conventions (https://opentelemetry.io/docs/specs/semconv/gen-ai/).
OPERATION_NAME = "gen_ai.operation.name"
AGENT_NAME = "gen_ai.agent.name"
REQUEST_MODEL = "gen_ai.request.model"
USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
CONVERSATION_ID = "gen_ai.conversation.id"
#: Values of :data:`OPERATION_NAME`: a spawn, one model call, one tool call.
INVOKE_AGENT = "invoke_agent"
CHAT = "chat"
EXECUTE_TOOL = "execute_tool"

_TRACER_NAME = "ongrid"
_NOOP = trace.NoOpTracer()
#: What a span is when nothing records: the no-op tracer's would only re-attach the current
#: context (its span is the parent's context again), so nothing is attached at all.
_UNRECORDED = contextlib.nullcontext(trace.INVALID_SPAN)
_propagator = TraceContextTextMapPropagator()
_tracer: trace.Tracer = _NOOP
_provider: TracerProvider | None = None


def init_tracing(
    settings: Settings,
    service_name: str,
    *,
    instance: str = "",
    exporter: SpanExporter | None = None,
) -> bool:
    """Export this process's spans as ``service_name``: to ``settings.otlp_endpoint`` over
    OTLP/HTTP, or to ``exporter`` when given (tests pass an in-memory one). With neither,
    nothing is installed and spans stay no-ops. Returns whether spans are now recorded.

    ``instance`` names this process among those of the service (``service.instance.id``; a
    worker gives its node name, so a span says which worker ran it); by default the SDK's
    random one.

    A process traces to one place: calling this again replaces the previous provider (which is
    shut down, its spans flushed)."""
    global _tracer, _provider
    if exporter is None and not settings.otlp_endpoint:
        return False
    from opentelemetry.sdk.resources import SERVICE_INSTANCE_ID, SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=traces_url(settings.otlp_endpoint))
    shutdown_tracing()
    attributes = {SERVICE_NAME: service_name}
    if instance:
        attributes[SERVICE_INSTANCE_ID] = instance
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    # Not made the global provider: libraries that trace through it on their own would then
    # add spans of theirs to every request (FastAPI's native telemetry: a second server span,
    # operation spans, request validation errors with the values sent, i.e. prompts).
    _provider, _tracer = provider, provider.get_tracer(_TRACER_NAME)
    if settings.otlp_endpoint:
        log.info("exporting traces to %s", traces_url(settings.otlp_endpoint))
    return True


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL of a base endpoint, as the OpenTelemetry SDKs derive it."""
    return endpoint.rstrip("/") + "/v1/traces"


def shutdown_tracing() -> None:
    """Flush and stop the provider :func:`init_tracing` installed; spans are no-ops again."""
    global _tracer, _provider
    provider, _provider, _tracer = _provider, None, _NOOP
    if provider is not None:
        provider.shutdown()


def flush_tracing(timeout_seconds: float = 30.0) -> bool:
    """Export the spans ended so far now, not at the next batch; whether all were exported."""
    if _provider is None:
        return True
    return _provider.force_flush(int(timeout_seconds * 1000))


def tracing_enabled() -> bool:
    """Whether spans are recorded and exported (cheap: for skipping attribute work)."""
    return _provider is not None


def span(
    name: str,
    *,
    context: Context | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Mapping[str, AttributeValue] | None = None,
) -> Any:
    """A context manager: a span named ``name``, current while the block runs, ended after it
    (an exception escaping it is recorded and sets the error status). Its parent is the current
    span, or the one of ``context`` (from :func:`extract`)."""
    if _provider is None and context is None:
        return _UNRECORDED
    return _tracer.start_as_current_span(name, context=context, kind=kind, attributes=attributes)


def agent_span(persona: str, *, context: Context | None = None, session_id: str = "") -> Any:
    """The span of one spawn attempt of ``persona`` (``invoke_agent <persona>``)."""
    attributes: dict[str, AttributeValue] = {OPERATION_NAME: INVOKE_AGENT, AGENT_NAME: persona}
    if session_id:
        attributes[CONVERSATION_ID] = session_id
    return span(f"{INVOKE_AGENT} {persona}", context=context, attributes=attributes)


def chat_span(model: str) -> Any:
    """The span of one model call (``chat <model>``); see :func:`record_usage`."""
    if _provider is None:
        return _UNRECORDED
    return span(
        f"{CHAT} {model}",
        kind=SpanKind.CLIENT,
        attributes={OPERATION_NAME: CHAT, REQUEST_MODEL: model},
    )


def tool_span(tool: str, call_id: str = "") -> Any:
    """The span of one tool call (``execute_tool <tool>``)."""
    if _provider is None:
        return _UNRECORDED
    attributes: dict[str, AttributeValue] = {OPERATION_NAME: EXECUTE_TOOL, TOOL_NAME: tool}
    if call_id:
        attributes[TOOL_CALL_ID] = call_id
    return span(f"{EXECUTE_TOOL} {tool}", attributes=attributes)


def record_usage(current: Span, usage: Usage) -> None:
    """Put a model call's token usage on its span."""
    if current.is_recording():
        current.set_attribute(USAGE_INPUT_TOKENS, usage.prompt_tokens)
        current.set_attribute(USAGE_OUTPUT_TOKENS, usage.completion_tokens)


def inject() -> dict[str, str]:
    """The current trace context as W3C headers (``traceparent``, ``tracestate`` when set);
    empty when there is none."""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier


def extract(carrier: Mapping[str, str] | None) -> Context:
    """The context whose span is the parent ``carrier`` (from :func:`inject`) names; an empty
    context when it names none, so the next span starts a trace of its own."""
    return _propagator.extract(dict(carrier or {}), context=Context())
