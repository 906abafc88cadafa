"""Metrics, logs and traces: Prometheus (PromQL), Loki (LogQL) and Tempo (TraceQL) over HTTP.

Each call sends the backend's credentials when they are set (``<backend>_bearer_token``, else
``<backend>_user`` / ``_password``) and gives up after ``backend_timeout_seconds``; an error
says what to fix: the URL setting, the credentials, or the query (the backend's own message).
Prometheus and Loki are tested against the real servers; Tempo, which Debian does not package,
against answers in the format of its documented ``/api/search``.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import Field

from registry.tools import ToolClass, ToolContext, ToolResult, function_tool
from workers.tools._common import (
    BackendError,
    Service,
    auth_headers,
    backend_timeout,
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
MAX_TRACES = 200
MAX_LINE_CHARS = 500
OUTPUT_CHARS = 16_000
MAX_QUERY_CHARS = 10_000

PROMETHEUS = Service(
    "Prometheus",
    "PROMETHEUS_URL",
    "PROMETHEUS_USER / PROMETHEUS_PASSWORD or PROMETHEUS_BEARER_TOKEN",
)
LOKI = Service(
    "Loki",
    "LOKI_URL",
    "LOKI_USER / LOKI_PASSWORD or LOKI_BEARER_TOKEN (and LOKI_TENANT for a multi-tenant Loki)",
)
TEMPO = Service("Tempo", "TEMPO_URL", "TEMPO_USER / TEMPO_PASSWORD or TEMPO_BEARER_TOKEN")

_DURATION = r"[0-9]+(ms|s|m|h|d|w)"
#: RFC 3339, unix seconds, or a duration ago: what :func:`resolve_time` passes on or resolves.
_INSTANT = (
    rf"^([0-9]+(\.[0-9]+)?|{_DURATION}"
    r"|[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?(Z|[+-][0-9]{2}:[0-9]{2}))$"
)

Since = Annotated[
    str,
    Field(
        description="How far back to look, as a whole number and a unit: 15m, 1h, 24h, 7d.",
        pattern=f"^{_DURATION}$",
    ),
]
_WHEN = "RFC 3339 (2024-05-01T12:00:00Z), unix seconds (1714564800) or a duration ago ('6h')"
Instant = Annotated[str | None, Field(pattern=_INSTANT)]


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
    if time_ is not None:
        raise BackendError(
            "time is the instant of an instant query; a range query takes start, end and step"
        )
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
        raise BackendError(f"Prometheus rejected the query: {detail}")
    return payload


@function_tool(ToolClass.READ, name="query_promql", requires=("prometheus_url",))
def query_promql(
    query: Annotated[
        str,
        Field(
            description="PromQL expression, e.g. "
            "'rate(node_cpu_seconds_total{mode!=\"idle\"}[5m])'.",
            min_length=1,
            max_length=MAX_QUERY_CHARS,
        ),
    ],
    context: ToolContext,
    time: Annotated[
        Instant, Field(description=f"Instant query: when to evaluate, as {_WHEN}. Default now.")
    ] = None,
    start: Annotated[
        Instant, Field(description=f"Range start, as {_WHEN}; makes this a range query.")
    ] = None,
    end: Annotated[Instant, Field(description=f"Range end, as {_WHEN}; default now.")] = None,
    step: Annotated[
        str | None,
        Field(
            description="Range resolution: a duration ('30s', '5m') or seconds ('15'); "
            "default 60s. Prometheus refuses more than 11,000 points per series.",
            pattern=rf"^([0-9]+(\.[0-9]+)?|{_DURATION})$",
        ),
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
    timeout = backend_timeout(context)
    try:
        path, params = _prometheus_params(query, time, start, end, step)
        # Prometheus stops evaluating when we stop waiting, rather than at its own 2 minutes.
        params["timeout"] = f"{timeout:g}s"
        url = build_url(base, path, params)
        headers = auth_headers(context, "prometheus")
        payload = _prometheus_payload(
            http_json(url, service=PROMETHEUS, headers=headers, timeout=timeout)
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
    if len(entries) >= limit:
        lines.append(
            f"[limit of {limit} lines reached: older lines in the window are not shown; "
            f"narrow the selector, filter or since, or raise limit (at most {MAX_LOG_LINES})]"
        )
    return "\n".join(lines)


def _loki(context: ToolContext, tool: str, query: str, since: str, limit: int) -> ToolResult:
    base = setting(context, "loki_url")
    if not base:
        return not_configured(tool, "LOKI_URL", "the Loki base URL, e.g. http://loki:3100")
    seconds = to_seconds(since)
    if seconds is None:
        return error(f"since={since!r} is not a duration like 15m, 1h or 7d")
    # Explicit bounds in nanoseconds rather than Loki's `since`, whose units vary by version.
    end = time.time_ns()
    params = {
        "query": query,
        "start": end - int(seconds * 1e9),
        "end": end,
        "limit": limit,
        "direction": "backward",
    }
    headers = auth_headers(context, "loki")
    tenant = setting(context, "loki_tenant")
    if tenant:
        headers["X-Scope-OrgID"] = str(tenant)
    try:
        url = build_url(base, "/loki/api/v1/query_range", params)
        timeout = backend_timeout(context)
        payload = http_json(url, service=LOKI, headers=headers, timeout=timeout)
    except BackendError as exc:
        return exc.result()
    if not isinstance(payload, dict) or payload.get("status") not in (None, "success"):
        return error(f"Loki rejected the query: {str(payload)[:2000]}")
    data = payload.get("data") or {}
    if data.get("resultType") == "streams":
        text = _render_streams(data.get("result") or [], limit)
    else:  # a metric query (rate, count_over_time) answers like Prometheus
        text = render_prometheus(data)
    return ToolResult(content=cap_text(f"LogQL: {query}\n{text}", OUTPUT_CHARS), data=data)


@function_tool(ToolClass.READ, name="query_logql", requires=("loki_url",))
def query_logql(
    query: Annotated[
        str,
        Field(
            description='Full LogQL, e.g. \'{app="nginx"} |= "error"\' '
            "or 'sum by (level) (count_over_time({job="
            '"api"}[5m]))\'.',
            min_length=1,
            max_length=MAX_QUERY_CHARS,
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


@function_tool(ToolClass.READ, name="search_logs", requires=("loki_url",))
def search_logs(
    selector: Annotated[
        str,
        Field(
            description='LogQL stream selector, e.g. \'{namespace="prod", app="api"}\' (the '
            "braces may be left out).",
            min_length=1,
            max_length=MAX_QUERY_CHARS,
        ),
    ],
    context: ToolContext,
    contains: Annotated[
        str | None,
        Field(
            description="Keep only lines containing this exact text (case-sensitive).",
            max_length=MAX_QUERY_CHARS,
        ),
    ] = None,
    since: Since = "1h",
    limit: Annotated[int, Field(ge=1, le=MAX_LOG_LINES, description="Max log lines.")] = 100,
) -> ToolResult:
    """Search logs in the configured Loki: lines of the streams matching `selector` from the
    last `since`, optionally only those containing `contains`, newest first. The LogQL that
    ran is shown so you can refine it with `query_logql` (regex filters, parsers, metrics)."""
    return _loki(context, "search_logs", build_logql(selector, contains), since, limit)


def _render_traces(traces: list[dict[str, Any]], limit: int) -> str:
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
    if len(traces) >= limit:
        lines.append(
            f"[limit of {limit} traces reached: more may match; narrow the query or since, "
            f"or raise limit (at most {MAX_TRACES})]"
        )
    return "\n".join(lines)


@function_tool(ToolClass.READ, name="query_traceql", requires=("tempo_url",))
def query_traceql(
    query: Annotated[
        str,
        Field(
            description='TraceQL, e.g. \'{ resource.service.name = "api" '
            "&& status = error }' or '{ duration > 2s }'.",
            min_length=1,
            max_length=MAX_QUERY_CHARS,
        ),
    ],
    context: ToolContext,
    since: Since = "1h",
    limit: Annotated[int, Field(ge=1, le=MAX_TRACES, description="Max traces.")] = 20,
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
        url = build_url(base, "/api/search", params)
        headers = auth_headers(context, "tempo")
        timeout = backend_timeout(context)
        payload = http_json(url, service=TEMPO, headers=headers, timeout=timeout)
    except BackendError as exc:
        return exc.result()
    traces = (payload.get("traces") or []) if isinstance(payload, dict) else []
    text = _render_traces(traces, limit)
    return ToolResult(content=cap_text(text, OUTPUT_CHARS), data=payload)


TOOLS = (query_promql, query_logql, search_logs, query_traceql)
