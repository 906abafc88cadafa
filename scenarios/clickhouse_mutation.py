"""A ClickHouse mutation stuck behind a failing part, on a real ClickHouse server.

``analytics.orders`` has three monthly parts; one row of the October part holds ``'n/a'`` where
an amount should be. ``ALTER TABLE ... UPDATE amount = toUInt32(amount_raw)`` is applied to the
other parts and fails on that one again and again: ``is_done = 0``, ``parts_to_do = 1`` for
good. (Debian's ClickHouse, 18.16, has no ``latest_fail_reason``: the reason is only in the
server's log.) The tools connect as ``sre_diag``, a read-only user that may see the ``system``
and ``analytics`` databases, as a site would grant its diagnostics user; it is added to the
server's own ``users.d``. The server is stopped at teardown. The shipped
``specialist-clickhouse`` investigates.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from scenarios._base import Scenario, Staged, alert, host, kb_cite, kb_line, knowledge_first
from workers.testing.backends import ClickHouse, start_clickhouse
from workers.testing.fake_openai import Reply
from workers.testing.recipe_model import Conversation, answer, call

USER, PASSWORD = "sre_diag", "sre-diag-password-for-scenarios"
_USERS = f"""<?xml version="1.0"?>
<yandex><users><{USER}>
  <password>{PASSWORD}</password><networks><ip>127.0.0.1</ip></networks>
  <profile>diagnostics</profile><quota>default</quota>
  <allow_databases><database>system</database><database>analytics</database></allow_databases>
</{USER}></users></yandex>
"""
_TABLE = (
    "CREATE TABLE analytics.orders (day Date, id UInt32, amount_raw String, amount UInt32) "
    "ENGINE = MergeTree() PARTITION BY toYYYYMM(day) ORDER BY id"
)
BAD_ID = 1500
#: Bound on the server applying the mutation to every part it can.
SETTLE_TIMEOUT = 60.0


def _wait(what: str, ready: Callable[[], object], timeout: float = SETTLE_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if ready():
                return
        except RuntimeError:  # not yet (the users file is re-read every few seconds)
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.2)


def _load(server: ClickHouse) -> None:
    server.admin("CREATE DATABASE analytics")
    server.admin(_TABLE)
    for number, month in enumerate(("09", "10", "11")):  # one insert, one part, per month
        first = number * 1000
        server.admin(
            f"INSERT INTO analytics.orders SELECT toDate('2026-{month}-01'), number + {first}, "
            f"if(number + {first} = {BAD_ID}, 'n/a', toString(number)), 0 FROM numbers(1000)"
        )
    server.admin(
        "ALTER TABLE analytics.orders UPDATE amount = toUInt32(amount_raw) WHERE amount = 0"
    )


@contextmanager
def stage(root: Path) -> Iterator[Staged]:
    server = start_clickhouse(root / "clickhouse")
    try:
        (server.root / "users.d").mkdir(exist_ok=True)
        (server.root / "users.d" / "sre-diagnostics.xml").write_text(_USERS, encoding="utf-8")
        _wait(f"the user {USER}", lambda: server.query("SELECT 1", user=USER, password=PASSWORD))
        _load(server)
        pending = "SELECT parts_to_do FROM system.mutations WHERE table = 'orders' AND is_done = 0"
        _wait(
            "the mutation to be done on every part but one", lambda: server.admin(pending) == "1\n"
        )
        stuck = server.admin(f"SELECT _part FROM analytics.orders WHERE id = {BAD_ID}").strip()
        mutation = server.admin(pending.replace("parts_to_do", "mutation_id")).strip()
        yield Staged(
            alert=alert(
                "ClickHouseMutationStuck",
                "a mutation has not finished for 10 minutes",
                host=host(),
                instance=server.url.removeprefix("http://"),
                severity="warning",
            ),
            evidence={"mutation": mutation, "part": stuck},
            env={
                "CLICKHOUSE_URL": server.url,
                "CLICKHOUSE_USER": USER,
                "CLICKHOUSE_PASSWORD": PASSWORD,
            },
        )
    finally:
        server.stop()


# --- the specialist-clickhouse recipe, as the playbook orders it -------------------------------


def _rows(result: str) -> list[dict[str, str]]:
    """The tool's tab-separated table (header, rows, a ``(N rows)`` footer) as dicts."""
    lines = [ln for ln in result.splitlines() if ln and not ln.startswith("(")]
    if not lines:
        return []
    header = lines[0].split("\t")
    return [dict(zip(header, ln.split("\t"), strict=False)) for ln in lines[1:]]


def _sql(conv: Conversation) -> list[list[dict[str, str]]]:
    return [_rows(o.result) for o in conv.of("query_clickhouse_system")]


def _block(mutation: dict[str, str]) -> str:
    """The mutation's block number: ``[4]`` or ``['4']`` (64-bit numbers come quoted)."""
    numbers = re.findall(r"\d+", mutation.get("block_numbers.number", ""))
    return numbers[0] if numbers else "0"


def follow(conv: Conversation) -> Reply:
    """Step 0, then the unfinished mutations → the parts below its block → replication."""
    first = knowledge_first(conv)
    if first is not None:
        return first
    answered = _sql(conv)
    if not answered:
        return call(
            "query_clickhouse_system", sql="SELECT * FROM system.mutations WHERE is_done = 0"
        )
    if not answered[0]:
        return answer(_report(conv, None, [], []))
    mutation = answered[0][0]
    where = f"database = '{mutation['database']}' AND table = '{mutation['table']}'"
    if len(answered) == 1:
        block = _block(mutation)
        return call(
            "query_clickhouse_system",
            sql="SELECT name, partition, rows, data_version, modification_time FROM system.parts "
            f"WHERE {where} AND active AND data_version < {block} ORDER BY name",
        )
    if len(answered) == 2:
        return call(
            "query_clickhouse_system",
            sql="SELECT database, table, is_readonly, absolute_delay, queue_size "
            f"FROM system.replicas WHERE {where}",
        )
    return answer(_report(conv, mutation, answered[1], answered[2]))


def _report(
    conv: Conversation,
    mutation: dict[str, str] | None,
    parts: list[dict[str, str]],
    replicas: list[dict[str, str]],
) -> str:
    if mutation is None:
        return "\n".join(
            [
                "Status: ok. system.mutations has no unfinished mutation now.",
                "Evidence:",
                "- system.mutations: is_done = 0 -> 0 rows",
                "Recommendation: observation only",
                kb_line(conv),
            ]
        )
    table = f"{mutation['database']}.{mutation['table']}"
    names = ", ".join(p["name"] for p in parts) or "none"
    reason = mutation.get("latest_fail_reason") or "not shown by this server version"
    conversion = "toUInt" in mutation["command"] or "toDate" in mutation["command"]
    replication = (
        "not replicated (no system.replicas row)"
        if not replicas
        else f"absolute_delay {replicas[0]['absolute_delay']}, "
        f"queue_size {replicas[0]['queue_size']}"
    )
    return "\n".join(
        [
            f"Status: degraded. Mutation {mutation['mutation_id']} on {table} is stuck: is_done 0, "
            f"parts_to_do {mutation['parts_to_do']}, blocked on part {names}.{kb_cite(conv)}",
            "Evidence:",
            f"- system.mutations: {mutation['mutation_id']} | {mutation['command']} | created "
            f"{mutation['create_time']} | block {_block(mutation)} | parts_to_do "
            f"{mutation['parts_to_do']} | is_done {mutation['is_done']} | fail reason: {reason}",
            *(
                f"- system.parts: {p['name']} (partition {p['partition']}, {p['rows']} rows, "
                f"data_version {p['data_version']} < {_block(mutation)}, "
                f"modified {p['modification_time']})"
                for p in parts
            ),
            f"- system.replicas: {table} -> {replication}",
            "Recommendation: dispatch specialist-ops to kill mutation "
            f"{mutation['mutation_id']} and re-issue it with an expression that does not throw on "
            f"the rows of {names}"
            + (" (a conversion: use its OrNull/OrZero variant)" if conversion else "")
            + ", under reviewer",
            kb_line(conv),
        ]
    )


SCENARIO = Scenario("clickhouse_mutation", "specialist-clickhouse", stage, follow)
