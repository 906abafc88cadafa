"""Metrics, logs and traces: Prometheus (PromQL), Loki (LogQL) and Tempo (TraceQL) over HTTP."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import Field

from registry.tools import ToolClass, ToolContext, ToolResult, function_tool
from workers.tools._common import (
    BackendError,
    build_url,
    cap_text,
    error,
    http_json,
    not_configured,
    resolve_time,
    setting,
    to_seconds,
)

__all__ = ["TOOLS", "render_prometheus"]

MAX_SERIES = 50
MAX_LOG_LINES = 500
MAX_LINE_CHARS = 500
OUTPUT_CHARS = 16_000

Since = Annotated[str, Field(description="How far back to look, as a duration: 15m, 1h, 24h, 7d.")]


def _iso(ts: float | str) -> str:
    return datetime.fromtimestamp(float(ts), tz=UTC).isoformat(timespec="seconds")


def _labels(metric: dict[str, str]) -> str:
    name = metric.get("__name__", "")
    rest = ", ".join(f'{k}="{v}"' for k, v in sorted(metric.items()) if k != "__name__")
    return f"{name}{{{rest}}}"


def _series_line(series: dict[str, Any]) -> str:
    values = series.get("values") or []
    if "value" in series:  # an instant vector sample
        ts, value = series["value"]
        return f"{_labels(series['metric'])} = {value} @ {_iso(ts)}"
    numbers = [float(v) for _, v in values]
    if not numbers:
        return f"{_labels(series['metric'])}: no samples"
    last_ts, last = values[-1]
    return (
        f"{_labels(series['metric'])}: {len(numbers)} samples "
        f"{_iso(values[0][0])} .. {_iso(last_ts)}, min={min(numbers):g} "
        f"max={max(numbers):g} avg={sum(numbers) / len(numbers):g} last={last}"
    )


def render_prometheus(data: dict[str, Any]) -> str:
    """A Prometheus ``data`` object (vector, matrix, scalar, string) as one line per series."""
    kind, result = data.get("resultType"), data.get("result")
    if kind in ("scalar", "string") and result:
        ts, value = result
        return f"{kind}: {value} @ {_iso(ts)}"
    if not result:
        return f"{kind}: empty result (no series matched)"
    lines = [f"{kind}: {len(result)} series"]
    lines += [_series_line(series) for series in result[:MAX_SERIES]]
    if len(result) > MAX_SERIES:
        lines.append(
            f"... {len(result) - MAX_SERIES} more series not shown; aggregate "
            "(sum by, topk) to see fewer"
        )
    return "\n".join(lines)


def _prometheus_params(
    query: str, time_: str | None, start: str | None, end: str | None, step: str | None
) -> tuple[str, dict[str, str | None]]:
    if start is None and end is None and step is None:
        return "/api/v1/query", {"query": query, "time": resolve_time(time_) if time_ else None}
    if start is None:
        raise BackendError("a range query needs start (e.g. start='6h' for six hours ago)")
    now = time.time()
    return "/api/v1/query_range", {
        "query": query,
        "start": resolve_time(start, now),
        "end": resolve_time(end, now) if end else f"{now:.3f}",
        "step": step or "60s",
    }


def _prometheus_payload(payload: Any) -> dict[str, Any]:
    if not isinstance(payload, dict) or payload.get("status") != "success":
        detail = payload.get("error") if isinstance(payload, dict) else payload
        raise BackendError(f"Prometheus query failed: {detail}")
    return payload


@function_tool(ToolClass.READ, name="query_promql")
def query_promql(
    query: Annotated[
        str,
        Field(
            description="PromQL expression, e.g. "
            "'rate(node_cpu_seconds_total{mode!=\"idle\"}[5m])'."
        ),
    ],
    context: ToolContext,
    time: Annotated[
        str | None,
        Field(
            description="Instant to evaluate at: RFC 3339, unix "
            "seconds, or a duration ago ('1h'). Default "
            "now."
        ),
    ] = None,
    start: Annotated[
        str | None,
        Field(
            description="Range start (RFC 3339, unix seconds or a "
            "duration ago like '6h'); makes this a range "
            "query."
        ),
    ] = None,
    end: Annotated[str | None, Field(description="Range end; default now.")] = None,
    step: Annotated[
        str | None, Field(description="Range resolution, e.g. '30s', '5m'; default 60s.")
    ] = None,
) -> ToolResult:
    """Run a PromQL query against the configured Prometheus. Without start/end/step it is an
    instant query (one value per series, at `time` or now); with `start` it is a range query
    summarised per series as sample count, time span, min/max/avg and last value. At most 50
    series are shown: aggregate (sum by (...), topk) for wide selectors. Errors from Prometheus
    (bad syntax, unknown function) are returned verbatim."""
    base = setting(context, "prometheus_url")
    if not base:
        return not_configured(
            "query_promql", "PROMETHEUS_URL", "the Prometheus base URL, e.g. http://prometheus:9090"
        )
    try:
        path, params = _prometheus_params(query, time, start, end, step)
        payload = _prometheus_payload(
            http_json(build_url(base, path, params), service="Prometheus")
        )
    except BackendError as exc:
        return exc.result()
    text = render_prometheus(payload.get("data") or {})
    if payload.get("warnings"):
        text += "\nwarnings: " + "; ".join(map(str, payload["warnings"]))
    return ToolResult(content=cap_text(text, OUTPUT_CHARS), data=payload.get("data"))


def _render_streams(result: list[dict[str, Any]], limit: int) -> str:
    entries = [
        (int(ts), stream.get("stream", {}), line)
        for stream in result
        for ts, line in stream.get("values", [])
    ]
    entries.sort(key=lambda e: e[0], reverse=True)
    if not entries:
        return "no log lines matched"
    lines = [f"{len(entries)} log lines from {len(result)} streams, newest first"]
    for ts, labels, line in entries[:limit]:
        compact = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        lines.append(f"{_iso(ts / 1e9)} {{{compact}}} {cap_text(line, MAX_LINE_CHARS, 'line')}")
    return "\n".join(lines)


def _loki(context: ToolContext, tool: str, query: str, since: str, limit: int) -> ToolResult:
    base = setting(context, "loki_url")
    if not base:
        return not_configured(tool, "LOKI_URL", "the Loki base URL, e.g. http://loki:3100")
    if to_seconds(since) is None:
        return error(f"since={since!r} is not a duration like 15m, 1h or 7d")
    params = {"query": query, "since": since, "limit": limit, "direction": "backward"}
    try:
        payload = http_json(build_url(base, "/loki/api/v1/query_range", params), service="Loki")
    except BackendError as exc:
        return exc.result()
    data = (payload.get("data") or {}) if isinstance(payload, dict) else {}
    if data.get("resultType") == "streams":
        text = _render_streams(data.get("result") or [], limit)
    else:  # a metric query (rate, count_over_time) answers like Prometheus
        text = render_prometheus(data)
    return ToolResult(content=cap_text(f"LogQL: {query}\n{text}", OUTPUT_CHARS), data=data)


@function_tool(ToolClass.READ, name="query_logql")
def query_logql(
    query: Annotated[
        str,
        Field(
            description='Full LogQL, e.g. \'{app="nginx"} |= "error"\' '
            "or 'sum by (level) (count_over_time({job="
            '"api"}[5m]))\'.'
        ),
    ],
    context: ToolContext,
    since: Since = "1h",
    limit: Annotated[int, Field(ge=1, le=MAX_LOG_LINES, description="Max log lines.")] = 100,
) -> ToolResult:
    """Run a raw LogQL query against the configured Loki over the last `since`. Log queries
    return the newest lines first (timestamp, stream labels, line cut at 500 chars); metric
    queries (rate, count_over_time...) return per-series summaries. Use `search_logs` when you
    only need lines of one stream containing a string."""
    return _loki(context, "query_logql", query, since, limit)


def build_logql(selector: str, contains: str | None) -> str:
    """A stream selector, braces added if missing, with an optional line filter."""
    selector = selector.strip()
    if not selector.startswith("{"):
        selector = f"{{{selector}}}"
    if contains:
        # JSON string escaping is valid LogQL (Go) string syntax.
        return f"{selector} |= {json.dumps(contains, ensure_ascii=False)}"
    return selector


@function_tool(ToolClass.READ, name="search_logs")
def search_logs(
    selector: Annotated[
        str, Field(description='LogQL stream selector, e.g. \'{namespace="prod", app="api"}\'.')
    ],
    context: ToolContext,
    contains: Annotated[
        str | None,
        Field(description="Keep only lines containing this exact text (case-sensitive)."),
    ] = None,
    since: Since = "1h",
    limit: Annotated[int, Field(ge=1, le=MAX_LOG_LINES, description="Max log lines.")] = 100,
) -> ToolResult:
    """Search logs in the configured Loki: lines of the streams matching `selector` from the
    last `since`, optionally only those containing `contains`, newest first. The LogQL that
    ran is shown so you can refine it with `query_logql` (regex filters, parsers, metrics)."""
    return _loki(context, "search_logs", build_logql(selector, contains), since, limit)


def _render_traces(traces: list[dict[str, Any]]) -> str:
    if not traces:
        return "no traces matched"
    lines = [f"{len(traces)} traces"]
    for trace in traces:
        start_ns = int(trace.get("startTimeUnixNano") or 0)
        matched = sum(len(s.get("spans", [])) for s in trace.get("spanSets") or [])
        lines.append(
            f"{trace.get('traceID')} {_iso(start_ns / 1e9)} "
            f"{trace.get('rootServiceName', '?')} {trace.get('rootTraceName', '?')} "
            f"{trace.get('durationMs', '?')} ms, {matched} matching spans"
        )
    return "\n".join(lines)


@function_tool(ToolClass.READ, name="query_traceql")
def query_traceql(
    query: Annotated[
        str,
        Field(
            description='TraceQL, e.g. \'{ resource.service.name = "api" '
            "&& status = error }' or '{ duration > 2s }'."
        ),
    ],
    context: ToolContext,
    since: Since = "1h",
    limit: Annotated[int, Field(ge=1, le=200, description="Max traces.")] = 20,
) -> ToolResult:
    """Search traces in the configured Tempo with TraceQL over the last `since`. Returns one
    line per trace: trace id, start time, root service and operation, duration and how many
    spans matched."""
    base = setting(context, "tempo_url")
    if not base:
        return not_configured(
            "query_traceql", "TEMPO_URL", "the Tempo base URL, e.g. http://tempo:3200"
        )
    seconds = to_seconds(since)
    if seconds is None:
        return error(f"since={since!r} is not a duration like 15m, 1h or 7d")
    now = int(time.time())
    params = {"q": query, "limit": limit, "start": now - int(seconds), "end": now}
    try:
        payload = http_json(build_url(base, "/api/search", params), service="Tempo")
    except BackendError as exc:
        return exc.result()
    traces = (payload.get("traces") or []) if isinstance(payload, dict) else []
    return ToolResult(content=cap_text(_render_traces(traces), OUTPUT_CHARS), data=payload)


TOOLS = (query_promql, query_logql, search_logs, query_traceql)
