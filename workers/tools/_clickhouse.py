"""``query_clickhouse_system``: read-only SELECTs over ClickHouse's ``system`` database.

The SQL is checked here before any network call (one SELECT, every table in ``system.``, no table
functions that reach outside), and the server enforces the rest with ``readonly=1``.
"""

from __future__ import annotations

import re
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
    setting,
)

__all__ = ["TOOLS", "SqlRefused", "check_system_select"]

MAX_ROWS = 200
MAX_CELL_CHARS = 300
OUTPUT_CHARS = 24_000

# String literals and comments, in one left-to-right pass so "--" inside a string is not a comment.
_LEXEME = re.compile(r"'(?:[^'\\]|\\.|'')*'|--[^\n]*|#[^\n]*|/\*.*?\*/", re.S)
_TABLE_REF = re.compile(r"\b(FROM|JOIN)\s+(?!\()([^\s,()]+)(\s*\()?", re.I)
_SYSTEM_TABLE = re.compile(r"^system\.[A-Za-z0-9_]+$")
# cluster('name', system.x) runs the same system query on every replica: an SRE staple.
_CLUSTER_ARGS = re.compile(r"\s*(\w+)\s*,\s*`?system`?\.`?\w+`?\s*\)")
_CLUSTER_FUNCTIONS = {"cluster", "clusterallreplicas"}
# Functions that read other tables, files or hosts even outside a FROM clause.
_OUTSIDE_READERS = re.compile(
    r"\b(url|file|s3\w*|gcs|hdfs\w*|azureBlobStorage\w*|remote\w*|mysql|postgresql|mongodb|"
    r"redis|jdbc|odbc|sqlite|input|executable|dictGet\w*|joinGet\w*)\s*\(",
    re.I,
)
# FROM inside these calls is syntax, not a table: extract(DAY FROM t), trim(BOTH ' ' FROM s).
_FROM_SYNTAX_CALLS = {"extract", "trim", "substring", "position", "overlay"}


class SqlRefused(Exception):
    """SQL the tool will not send; the message says what is allowed."""


def _scrub(sql: str, keep_strings: bool) -> str:
    def replace(match: re.Match[str]) -> str:
        token = match.group(0)
        if token.startswith("'"):
            return token if keep_strings else " _str_ "  # no quote left to confuse the checks
        return " "

    return _LEXEME.sub(replace, sql)


def _enclosing_call(sql: str, pos: int) -> str:
    """The name of the function whose unclosed parenthesis contains ``pos``, or ""."""
    depth = 0
    for i in range(pos - 1, -1, -1):
        if sql[i] == ")":
            depth += 1
        elif sql[i] == "(":
            if depth == 0:
                name = re.search(r"(\w+)\s*$", sql[:i])
                return name.group(1).lower() if name else ""
            depth -= 1
    return ""


def _check_table(sql: str, match: re.Match[str]) -> None:
    keyword, target, call = match.group(1).upper(), match.group(2), match.group(3)
    if keyword == "JOIN" and re.search(r"\bARRAY\s+$", sql[: match.start()], re.I):
        return  # ARRAY JOIN unfolds a column, it names no table
    if keyword == "FROM" and _enclosing_call(sql, match.start()) in _FROM_SYNTAX_CALLS:
        return
    if call:
        if target.lower() in _CLUSTER_FUNCTIONS and _CLUSTER_ARGS.match(sql, match.end()):
            return
        raise SqlRefused(f"table function {target}() is not allowed; read system.* tables only")
    table = target.replace("`", "").replace('"', "")
    if not _SYSTEM_TABLE.match(table):
        raise SqlRefused(
            f"{target} is not a table of the system database; only system.* tables "
            "may be read (write them qualified, e.g. system.parts)"
        )
    after = sql[match.end() :]
    if re.match(r"\s*(?:(?:AS\s+)?(?!(?:WHERE|GROUP|ORDER|LIMIT|FINAL)\b)\w+\s*)?,", after, re.I):
        raise SqlRefused("comma joins are not supported; use JOIN ... ON/USING")


def check_system_select(sql: str) -> str:
    """Return ``sql`` ready to send (comments and a trailing ``;`` removed), or raise
    :class:`SqlRefused` unless it is one SELECT reading only ``system.*`` tables."""
    sendable = _scrub(sql, keep_strings=True).strip().rstrip(";").strip()
    checked = _scrub(sendable, keep_strings=False)
    if "'" in checked:
        raise SqlRefused("unterminated string literal")
    if ";" in checked:
        raise SqlRefused("send one statement at a time")
    if not re.match(r"SELECT\b", checked, re.I):
        raise SqlRefused("only a single SELECT statement is allowed")
    if re.search(r"\bINTO\s+OUTFILE\b|\bFORMAT\s+\w+\s*$", checked, re.I):
        raise SqlRefused("leave out INTO OUTFILE / FORMAT: the tool chooses the output format")
    outside = _OUTSIDE_READERS.search(checked)
    if outside:
        raise SqlRefused(f"{outside.group(1)}() reads outside the system database")
    for match in _TABLE_REF.finditer(checked):
        _check_table(checked, match)
    return sendable


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


@function_tool(ToolClass.READ, name="query_clickhouse_system")
def query_clickhouse_system(
    sql: Annotated[
        str,
        Field(
            description="One SELECT over system.* tables, e.g. 'SELECT table, "
            "sum(bytes_on_disk) AS b FROM system.parts WHERE "
            "active GROUP BY table ORDER BY b DESC LIMIT 10'."
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
    The result is a tab-separated table of at most 200 rows."""
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
            url, service="ClickHouse", body=wrapped.encode(), headers=_headers(context)
        )
    except BackendError as exc:
        return exc.result()
    if not isinstance(payload, dict):
        return error(f"ClickHouse returned an unexpected answer: {str(payload)[:200]}")
    return ToolResult(
        content=_render(payload), data={"meta": payload.get("meta"), "rows": payload.get("data")}
    )


TOOLS = (query_clickhouse_system,)
