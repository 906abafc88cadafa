"""``query_clickhouse_system``: read-only SELECTs over ClickHouse's ``system`` database.

Two lines of defence. The server's: the tool connects as a user that may read only the
``system`` database (``CLICKHOUSE_USER`` / ``CLICKHOUSE_PASSWORD``; the README gives the GRANT),
and every query carries ``readonly=1``. Ours, before any network call: the guard of
:mod:`workers.tools._clickhouse_sql` (one SELECT, every table ``system.*``).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from registry.tools import ToolClass, ToolContext, ToolResult, function_tool
from workers.tools._clickhouse_sql import SqlRefused, check_system_select
from workers.tools._common import (
    BackendError,
    Service,
    backend_timeout,
    build_url,
    cap_text,
    error,
    http_json,
    not_configured,
    setting,
)

__all__ = ["TOOLS", "SqlRefused", "check_system_select"]

MAX_ROWS = 200
MAX_CELL_CHARS = 300
OUTPUT_CHARS = 24_000

CLICKHOUSE = Service("ClickHouse", "CLICKHOUSE_URL", "CLICKHOUSE_USER / CLICKHOUSE_PASSWORD")


def _render(payload: dict[str, Any]) -> str:
    names = [column["name"] for column in payload.get("meta", [])]
    rows = payload.get("data", [])
    lines = ["\t".join(names)]
    for row in rows[:MAX_ROWS]:
        lines.append("\t".join(cap_text(str(cell), MAX_CELL_CHARS, "cell") for cell in row))
    footer = f"({min(len(rows), MAX_ROWS)} rows)"
    if len(rows) > MAX_ROWS:
        footer += " - more rows exist: add WHERE/LIMIT or aggregate"
    return cap_text("\n".join([*lines, footer]), OUTPUT_CHARS)


def _headers(context: ToolContext) -> dict[str, str]:
    user, password = setting(context, "clickhouse_user"), setting(context, "clickhouse_password")
    headers = {"X-ClickHouse-User": str(user)} if user else {}
    if password:
        headers["X-ClickHouse-Key"] = str(password)
    return headers


@function_tool(ToolClass.READ, name="query_clickhouse_system", requires=("clickhouse_url",))
def query_clickhouse_system(
    sql: Annotated[
        str,
        Field(
            description="One SELECT over system.* tables, e.g. 'SELECT table, "
            "sum(bytes_on_disk) AS b FROM system.parts WHERE "
            "active GROUP BY table ORDER BY b DESC LIMIT 10'.",
            min_length=1,
            max_length=20_000,
        ),
    ],
    context: ToolContext,
) -> ToolResult:
    """Query ClickHouse's own `system` tables (read-only) to diagnose the server: system.parts
    (part counts, sizes - too many parts), system.merges and system.mutations (stuck work),
    system.replication_queue and system.replicas (lag, readonly replicas), system.query_log and
    system.processes (slow or running queries), system.errors, system.disks, system.metrics /
    system.events / system.asynchronous_metrics. Only one SELECT whose tables are all
    `system.<table>` (written qualified) is accepted; cluster('name', system.x) is allowed.
    The result is a tab-separated table of at most 200 rows; ClickHouse's own error (unknown
    column, syntax, access) comes back verbatim."""
    base = setting(context, "clickhouse_url")
    try:
        sendable = check_system_select(sql)
    except SqlRefused as exc:
        return error(f"refused: {exc}")
    if not base:
        return not_configured(
            "query_clickhouse_system",
            "CLICKHOUSE_URL",
            "the ClickHouse HTTP interface, e.g. http://clickhouse:8123",
        )
    # Wrapping caps the rows without a settings change, which readonly=1 would forbid.
    wrapped = f"SELECT * FROM ({sendable}) LIMIT {MAX_ROWS + 1} FORMAT JSONCompact"
    try:
        url = build_url(base, "/", {"readonly": 1})
        payload = http_json(
            url,
            service=CLICKHOUSE,
            body=wrapped.encode(),
            headers=_headers(context),
            timeout=backend_timeout(context),
        )
    except BackendError as exc:
        return exc.result()
    if not isinstance(payload, dict):
        return error(f"ClickHouse returned an unexpected answer: {str(payload)[:200]}")
    return ToolResult(
        content=_render(payload), data={"meta": payload.get("meta"), "rows": payload.get("data")}
    )


TOOLS = (query_clickhouse_system,)
