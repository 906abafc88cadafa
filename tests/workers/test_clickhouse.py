"""``query_clickhouse_system`` against a real ClickHouse server: the guard, and the server's own
refusal of everything the guard might miss (the diagnostics user reads only ``system``)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from servers import DIAG_PASSWORD, DIAG_USER, ClickHouse, free_port

from registry.tools import ToolContext, ToolResult
from workers.tools import default_catalog
from workers.tools._clickhouse_sql import SqlRefused, check_system_select, tokenize

TOOL = default_catalog().get("query_clickhouse_system")
#: Bound on waiting for the server to finish a mutation of a few rows.
MUTATED = 60.0

#: Ways past a guard that reads SQL with regular expressions (each was seen to work once).
BYPASSES = [
    'SELECT x FROM system.one AS "o", secrets.vault',
    "SELECT x FROM system.one AS `o`, secrets.vault",
    "SELECT x FROM system.one o, secrets.vault",
    "SELECT x FROM (SELECT 1) AS s, secrets.vault",
    "SELECT x FROM system.one, secrets.vault",
    "SELECT 1 FROM system.one JOIN secrets.vault USING dummy",
    "SELECT 1 FROM system.one WHERE 'top' IN secrets.vault",
    "SELECT 1 FROM system.one WHERE 'top' NOT IN `secrets`.`vault`",
    "SELECT 1 FROM system.one WHERE in('top', secrets.vault)",
    "SELECT 1 FROM system.one WHERE globalIn('top', secrets.vault)",
    "SELECT `a'b` FROM secrets.vault WHERE x = 'c'",
    "SELECT \"a'b\" FROM secrets.vault WHERE x = 'c'",
    "SELECT * FROM system.one WHERE 1 IN (SELECT x FROM secrets.vault)",
    "SELECT (SELECT any(x) FROM secrets.vault)",
    "SELECT * FROM numbers(1), secrets.vault",
    "SELECT * FROM merge('secrets', '')",
    "SELECT * FROM remote('127.0.0.1', secrets.vault)",
    "SELECT * FROM cluster('c', secrets.vault)",
    "SELECT joinGet('secrets.vault', 'x', 1)",
    "SELECT dictGetString('secrets', 'x', toUInt64(1))",
    "SELECT hasColumnInTable('secrets', 'vault', 'x')",
    "SELECT * FROM url('http://127.0.0.1:1/', CSV, 'a String')",
    "SELECT * FROM file('/etc/passwd', CSV, 'a String')",
    "SELECT x FROM secrets.vault -- FROM system.one",
    "SELECT x FROM /* system.one */ secrets.vault",
    "SELECT 1 # \nFROM secrets.vault",
    "SELECT $$x$$ FROM secrets.vault",
    "SELECT x FROM secrets.vault;",
    "SELECT x FROM system.one; SELECT x FROM secrets.vault",
    "SELECT x FROM SYSTEM.one, secrets.vault",
    "SELECT x FROM vault",
]


def call(settings: Any, sql: str) -> ToolResult:
    return TOOL.run(TOOL.validate_arguments({"sql": sql}), ToolContext(settings=settings))


@pytest.fixture(scope="module")
def loaded(clickhouse: ClickHouse) -> Iterator[ClickHouse]:
    """A table with parts and a mutation in it, and a secret the diagnostics user must not read.

    The table lives in the ``system`` database: Debian's ClickHouse (18.16) restricts a user by
    ``allow_databases``, which also hides other databases' rows of system.parts (newer servers
    show them to a user granted SHOW TABLES; see the README).
    """
    clickhouse.admin("CREATE DATABASE IF NOT EXISTS secrets")
    clickhouse.admin("CREATE TABLE IF NOT EXISTS secrets.vault (x String) ENGINE = Memory")
    clickhouse.admin("INSERT INTO secrets.vault VALUES ('top-secret-value')")
    clickhouse.admin(
        "CREATE TABLE IF NOT EXISTS system.ongrid_events (d Date, id UInt64, kind String) "
        "ENGINE = MergeTree(d, id, 8192)"
    )
    for batch in range(3):  # three inserts: three parts
        clickhouse.admin(
            f"INSERT INTO system.ongrid_events VALUES ('2026-11-0{batch + 1}', {batch}, 'k')"
        )
    clickhouse.admin("ALTER TABLE system.ongrid_events DELETE WHERE id = 1")
    yield clickhouse


@pytest.fixture
def settings(loaded: ClickHouse) -> SimpleNamespace:
    return SimpleNamespace(
        clickhouse_url=loaded.url, clickhouse_user=DIAG_USER, clickhouse_password=DIAG_PASSWORD
    )


# --- the guard ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM system.parts",
        "select table, count() from system.parts where active group by table;",
        "SELECT * FROM `system`.`parts` AS p JOIN system.tables t ON p.table = t.name",
        'SELECT * FROM "system"."parts" p, system.tables t WHERE p.table = t.name',
        "SELECT * FROM system.parts WHERE table = 'x FROM default.t; DROP TABLE y'",
        "SELECT * FROM system.parts WHERE table = 'it''s' OR table = 'a\\'b'",
        "SELECT extract(DAY FROM event_time) FROM system.query_log",
        "SELECT position(query IN 'x') FROM system.processes",
        "SELECT * FROM clusterAllReplicas('main', system.replicas)",
        "SELECT 1 -- FROM default.t\nFROM system.one",
        "SELECT name FROM system.tables ARRAY JOIN [1, 2] AS n",
        "SELECT table FROM system.parts WHERE database IN ('app', 'logs')",
        "SELECT table FROM system.parts WHERE table IN (SELECT table FROM system.mutations)",
        "SELECT format('{}', name) FROM system.tables",
    ],
)
def test_the_guard_accepts_diagnostics(sql: str) -> None:
    assert check_system_select(sql)


@pytest.mark.parametrize("sql", BYPASSES)
def test_the_guard_refuses_every_bypass(sql: str) -> None:
    with pytest.raises(SqlRefused):
        check_system_select(sql)


@pytest.mark.parametrize(
    ("sql", "why"),
    [
        ("DROP TABLE x", "single SELECT"),
        ("SELECT * FROM default.t", "not a table of the system database"),
        ("SELECT * FROM parts", "write them qualified"),
        ("SELECT 1 FROM system.one; DROP TABLE x", "one statement"),
        ("SELECT * FROM url('http://evil/', CSV, 'a String')", "table function url()"),
        ("SELECT dictGet('d', 'x', 1) FROM system.one", "dictGet() reads outside"),
        ("SELECT * FROM system.one INTO OUTFILE '/tmp/x'", "OUTFILE"),
        ("SELECT * FROM system.one FORMAT JSON", "FORMAT"),
        ("INSERT INTO system.one SELECT 1", "single SELECT"),
        ("SELECT 'unterminated FROM system.one", "unterminated string"),
        ("SELECT `unterminated FROM system.one", "unterminated quoted identifier"),
        ("SELECT 1 /* /* */ */ FROM system.one", "nested"),
        ("SELECT * FROM numbers(10)", "table function numbers()"),
    ],
)
def test_the_guard_says_why(sql: str, why: str) -> None:
    with pytest.raises(SqlRefused, match=re.escape(why)):
        check_system_select(sql)


def test_the_tokenizer_covers_the_text_exactly() -> None:
    sql = "SELECT `a'b`, \"c\"\"d\", 'e''f\\'g' -- x\n/* y */ FROM system.one"
    tokens = list(tokenize(sql))
    assert "".join(t.text for t in tokens) == sql
    names = [t.name for t in tokens if t.kind == "quoted"]
    assert names == ["a'b", 'c"d']


def test_comments_and_trailing_semicolons_are_not_sent() -> None:
    sent = check_system_select("SELECT 1 -- note\nFROM system.one /* x */ ;;")
    assert sent == "SELECT 1  \nFROM system.one"


# --- the real server ----------------------------------------------------------------------------


def test_diagnostics_read_real_system_tables(settings: SimpleNamespace) -> None:
    result = call(
        settings,
        "SELECT table, count() AS parts FROM system.parts "
        "WHERE table = 'ongrid_events' AND active GROUP BY table",
    )
    assert not result.is_error, result.content
    header, row = result.content.splitlines()[:2]
    assert header == "table\tparts"
    assert row.split("\t")[0] == "ongrid_events" and int(row.split("\t")[1]) >= 1
    mutations = call(settings, "SELECT command FROM system.mutations WHERE table = 'ongrid_events'")
    assert "DELETE WHERE id = 1" in mutations.content


def test_rows_are_capped_with_a_note(settings: SimpleNamespace) -> None:
    result = call(settings, "SELECT name FROM system.functions")
    assert not result.is_error
    assert (
        result.content.splitlines()[-1]
        == "(200 rows) - more rows exist: add WHERE/LIMIT or aggregate"
    )


@pytest.mark.parametrize("sql", BYPASSES)
def test_the_server_refuses_what_the_guard_might_miss(loaded: ClickHouse, sql: str) -> None:
    """Each bypass sent straight to the server as the diagnostics user, no guard in front:
    it reads no secret (refused, or a syntax error, never the value)."""
    try:
        answer = loaded.query(sql, user=DIAG_USER, password=DIAG_PASSWORD, readonly=True)
    except RuntimeError as exc:
        answer = str(exc)
    assert "top-secret-value" not in answer
    # ...while the unrestricted user does read it: the refusal is the user's, not the query's.
    assert "top-secret-value" in loaded.admin("SELECT x FROM secrets.vault")


def test_errors_name_their_cause(loaded: ClickHouse, settings: SimpleNamespace) -> None:
    wrong = SimpleNamespace(**{**vars(settings), "clickhouse_password": "wrong-password"})
    result = call(wrong, "SELECT 1 FROM system.one")
    assert result.is_error
    assert result.content.startswith(f"ClickHouse at {loaded.url} refused the request (HTTP 401")
    assert f"Wrong password for user {DIAG_USER}" in result.content  # the server's own words
    assert "the credentials were refused; set CLICKHOUSE_USER / CLICKHOUSE_PASSWORD" in (
        result.content
    )
    no_password = SimpleNamespace(**{**vars(settings), "clickhouse_password": ""})
    unset = call(no_password, "SELECT 1 FROM system.one")
    assert unset.is_error and f"Password required for user {DIAG_USER}" in unset.content
    bad = call(settings, "SELECT no_such_column FROM system.one")
    assert bad.is_error
    assert bad.content.startswith("ClickHouse rejected the query (HTTP 404): Code: 47")
    assert "Unknown identifier: no_such_column" in bad.content
    down = SimpleNamespace(
        **{**vars(settings), "clickhouse_url": f"http://127.0.0.1:{free_port()}"}
    )
    unreachable = call(down, "SELECT 1 FROM system.one")
    assert unreachable.is_error and "could not reach ClickHouse" in unreachable.content
    assert "is CLICKHOUSE_URL right?" in unreachable.content


def test_a_slow_query_gives_up_at_the_backend_timeout(settings: SimpleNamespace) -> None:
    impatient = SimpleNamespace(**{**vars(settings), "backend_timeout_seconds": 0.5})
    result = call(impatient, "SELECT sleep(3) FROM system.one")
    assert result.is_error
    assert "did not answer within 0.5 s: ask for less" in result.content


def _wait_mutation_done(settings: SimpleNamespace, table: str) -> str:
    """The tool's view of ``table``'s mutations once every one of them is done."""
    sql = f"SELECT command, is_done, parts_to_do FROM system.mutations WHERE table = '{table}'"
    deadline = time.monotonic() + MUTATED
    while True:
        result = call(settings, sql)
        assert not result.is_error, result.content
        rows = result.content.splitlines()[1:-1]
        if rows and all(row.split("\t")[1] == "1" for row in rows):
            return result.content
        if time.monotonic() > deadline:
            raise AssertionError(f"{MUTATED:g} s passed waiting for the mutation: {result.content}")
        time.sleep(0.2)


def test_a_table_and_its_mutation_as_the_diagnostics_user_sees_them(
    loaded: ClickHouse, settings: SimpleNamespace
) -> None:
    table = "ongrid_orders"
    loaded.admin(
        f"CREATE TABLE system.{table} (d Date, id UInt64, amount UInt32) "
        "ENGINE = MergeTree(d, id, 8192)"
    )
    try:
        for month, amounts in ((1, "10, 500"), (2, "20, 30, 900"), (3, "40")):
            values = ", ".join(
                f"('2026-0{month}-01', {n}, {a})" for n, a in enumerate(amounts.split(", "))
            )
            loaded.admin(f"INSERT INTO system.{table} VALUES {values}")  # one part per month
        parts_sql = (
            f"SELECT partition, sum(rows) AS rows, count() AS parts FROM system.parts "
            f"WHERE table = '{table}' AND active GROUP BY partition ORDER BY partition"
        )
        before = call(settings, parts_sql)
        assert not before.is_error, before.content
        assert before.content.splitlines() == [
            "partition\trows\tparts",
            "202601\t2\t1",
            "202602\t3\t1",
            "202603\t1\t1",
            "(3 rows)",
        ]
        loaded.admin(f"ALTER TABLE system.{table} DELETE WHERE amount > 100")
        mutations = _wait_mutation_done(settings, table)
        assert mutations.splitlines() == [
            "command\tis_done\tparts_to_do",
            "DELETE WHERE amount > 100\t1\t0",
            "(1 rows)",
        ]
        after = call(settings, parts_sql)
        assert after.content.splitlines()[1:4] == ["202601\t1\t1", "202602\t2\t1", "202603\t1\t1"]
    finally:
        loaded.admin(f"DROP TABLE IF EXISTS system.{table}")


def test_refused_sql_never_reaches_the_server(
    loaded: ClickHouse, settings: SimpleNamespace
) -> None:
    marker = "never-sent-9f3a"
    result = call(settings, f"SELECT '{marker}' FROM secrets.vault")
    assert result.is_error and result.content.startswith("refused:")
    loaded.admin("SYSTEM FLUSH LOGS")
    logged = loaded.admin(
        f"SELECT count() FROM system.query_log WHERE query LIKE '%{marker}%' "
        "AND query NOT LIKE '%query_log%'"
    )
    assert logged.strip() == "0"
