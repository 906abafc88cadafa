"""``query_promql`` against a real Prometheus scraping a real node exporter.

Both come from Debian's packages (``./dev test`` installs them) and are started on free local
ports by :mod:`workers.testing.backends`. The node exporter serves this machine's metrics and a
gauge the tests write to its textfile directory, so the tests know what Prometheus must answer.
Also here: the read tools' JSON schemas, and the errors a person acts on (a bad query, an
unreachable server, refused credentials, a server that does not answer in time).
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from registry.errors import ToolArgumentError
from registry.settings import Settings
from registry.tools import ToolContext, ToolResult
from workers.testing.backends import (
    PROMETHEUS_PASSWORD,
    PROMETHEUS_USER,
    BackendMissing,
    NodeExporter,
    Prometheus,
    free_port,
    start_node_exporter,
    start_prometheus,
)
from workers.tools import default_catalog

CATALOG = default_catalog()
#: Bound on each wait for Prometheus to have scraped what a test needs (it scrapes every second).
SCRAPED = 60.0


def call(settings: Any, name: str = "query_promql", **arguments: Any) -> ToolResult:
    """Validate and run one tool the way the loop does."""
    tool = CATALOG.get(name)
    return tool.run(tool.validate_arguments(arguments), ToolContext(settings=settings))


def write_gauge(directory: Path, value: float) -> None:
    """``ongrid_test_gauge{site="lab"} value`` in the exporter's textfile directory, replaced
    whole (the exporter reads only ``*.prom``, so it never sees a half-written file)."""
    partial = directory / "ongrid.prom.partial"
    partial.write_text(
        f'# TYPE ongrid_test_gauge gauge\nongrid_test_gauge{{site="lab"}} {value:g}\n'
    )
    os.replace(partial, directory / "ongrid.prom")


def value_is(expected: float) -> Any:
    return lambda result: bool(result) and float(result[0]["value"][1]) == expected


@pytest.fixture(scope="module")
def textfiles(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("textfile")
    write_gauge(directory, 1)
    return directory


@pytest.fixture(scope="module")
def exporter(tmp_path_factory: pytest.TempPathFactory, textfiles: Path) -> Iterator[NodeExporter]:
    try:
        server = start_node_exporter(tmp_path_factory.mktemp("node"), textfile_dir=textfiles)
    except BackendMissing as exc:
        pytest.fail(exc.reason)  # a Debian package: ./dev test installs it, so never skipped
    yield server
    server.stop()


def _prometheus(root: Path, exporter: NodeExporter, *, auth: bool = False) -> Prometheus:
    try:
        server = start_prometheus(root, {"node": [exporter.address]}, auth=auth)
    except BackendMissing as exc:
        pytest.fail(exc.reason)
    return server


@pytest.fixture(scope="module")
def prometheus(
    tmp_path_factory: pytest.TempPathFactory, exporter: NodeExporter
) -> Iterator[Prometheus]:
    server = _prometheus(tmp_path_factory.mktemp("prometheus"), exporter)
    server.wait_for('up{job="node"}', value_is(1), SCRAPED)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def guarded(
    tmp_path_factory: pytest.TempPathFactory, exporter: NodeExporter
) -> Iterator[Prometheus]:
    """A Prometheus whose API requires basic auth (``--web.config.file``)."""
    server = _prometheus(tmp_path_factory.mktemp("guarded"), exporter, auth=True)
    yield server
    server.stop()


@pytest.fixture
def settings(prometheus: Prometheus) -> Settings:
    return Settings(prometheus_url=prometheus.url)


# --- queries ------------------------------------------------------------------------------


def test_an_instant_query_of_up_shows_the_scraped_target(
    settings: Settings, exporter: NodeExporter
) -> None:
    result = call(settings, query='up{job="node"}')
    assert not result.is_error, result.content
    lines = result.content.splitlines()
    assert lines[0] == "vector: 1 series"
    assert re.fullmatch(rf'up\{{instance="{exporter.address}", job="node"\}} = 1 @ \S+', lines[1])


def test_a_node_metric_has_the_value_the_machine_reports(settings: Settings) -> None:
    with open("/proc/meminfo") as meminfo:
        total_kib = next(int(line.split()[1]) for line in meminfo if line.startswith("MemTotal:"))
    result = call(settings, query='node_memory_MemTotal_bytes{job="node"}')
    assert not result.is_error, result.content
    value = result.content.splitlines()[1].split(" = ")[1].split(" @ ")[0]
    assert float(value) == total_kib * 1024


def test_a_range_query_is_summarised_per_series(
    settings: Settings, prometheus: Prometheus, textfiles: Path
) -> None:
    write_gauge(textfiles, 1)
    prometheus.wait_for("ongrid_test_gauge", value_is(1), SCRAPED)
    write_gauge(textfiles, 5)
    prometheus.wait_for("ongrid_test_gauge", value_is(5), SCRAPED)
    result = call(settings, query='ongrid_test_gauge{site="lab"}', start="10m", step="1s")
    assert not result.is_error, result.content
    lines = result.content.splitlines()
    assert lines[0] == "matrix: 1 series"
    summary = re.fullmatch(
        r'ongrid_test_gauge\{instance="[^"]+", job="node", site="lab"\}: (\d+) samples '
        r"\S+ \.\. \S+, min=1 max=5 avg=\S+ last=5",
        lines[1],
    )
    assert summary, lines[1]
    assert int(summary.group(1)) >= 2
    assert result.data["resultType"] == "matrix"


def test_a_wide_selector_shows_fifty_series_and_says_how_to_see_fewer(
    settings: Settings,
) -> None:
    result = call(settings, query='{__name__=~"node_.+", job="node"}')
    assert not result.is_error, result.content
    total = int(result.content.splitlines()[0].split()[1])
    assert total > 50
    shown = [ln for ln in result.content.splitlines() if ln.startswith("node_")]
    assert len(shown) == 50
    assert f"... {total - 50} more series not shown; aggregate (sum by, topk)" in result.content


# --- errors a person acts on --------------------------------------------------------------


def test_bad_promql_comes_back_with_prometheus_own_message(
    settings: Settings, prometheus: Prometheus
) -> None:
    with pytest.raises(RuntimeError) as direct:  # what Prometheus itself says to this query
        prometheus.query("sum(rate(up[5m])")
    own = str(direct.value).split("}: ", 1)[1]  # after the parameters it names
    result = call(settings, query="sum(rate(up[5m])")
    assert result.is_error
    assert result.content.startswith("Prometheus rejected the query (HTTP 400): bad_data: ")
    assert own in result.content and "parse error" in own


def test_too_many_points_come_back_with_prometheus_own_advice(settings: Settings) -> None:
    result = call(settings, query="up", start="7d", step="1s")
    assert result.is_error
    assert "exceeded maximum resolution of 11,000 points per timeseries" in result.content


def test_time_and_a_range_together_are_refused_before_any_call() -> None:
    settings = Settings(prometheus_url=f"http://127.0.0.1:{free_port()}")  # nothing listens
    result = call(settings, query="up", time="1h", start="2h")
    assert result.is_error and "time is the instant of an instant query" in result.content


def test_an_unreachable_prometheus_names_the_url_and_the_setting() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = call(Settings(prometheus_url=url), query="up")
    assert result.is_error
    assert result.content.startswith(f"could not reach Prometheus at {url} (")
    assert "is PROMETHEUS_URL right?" in result.content


def test_a_base_url_with_a_path_is_named_as_the_mistake(prometheus: Prometheus) -> None:
    result = call(Settings(prometheus_url=prometheus.url + "/graph"), query="up")
    assert result.is_error
    assert "HTTP 404 (404 page not found) for /graph/api/v1/query" in result.content
    assert "PROMETHEUS_URL should be its base URL" in result.content


def test_refused_credentials_name_the_settings(guarded: Prometheus) -> None:
    none_sent = call(Settings.load(environ={"PROMETHEUS_URL": guarded.url}), query="up")
    assert none_sent.is_error
    assert none_sent.content.startswith(
        f"Prometheus at {guarded.url} refused the request (HTTP 401: Unauthorized)"
    )
    assert "the credentials are missing (none were sent)" in none_sent.content
    assert "set PROMETHEUS_USER / PROMETHEUS_PASSWORD or PROMETHEUS_BEARER_TOKEN" in (
        none_sent.content
    )
    wrong = Settings.load(
        environ={
            "PROMETHEUS_URL": guarded.url,
            "PROMETHEUS_USER": PROMETHEUS_USER,
            "PROMETHEUS_PASSWORD": "not-the-password",
        }
    )
    refused = call(wrong, query="up")
    assert refused.is_error and "the credentials were refused" in refused.content


def test_the_right_credentials_are_let_in(guarded: Prometheus) -> None:
    settings = Settings.load(
        environ={
            "PROMETHEUS_URL": guarded.url,
            "PROMETHEUS_USER": PROMETHEUS_USER,
            "PROMETHEUS_PASSWORD": PROMETHEUS_PASSWORD,
        }
    )
    assert PROMETHEUS_PASSWORD not in repr(settings)
    guarded.wait_for('up{job="node"}', value_is(1), SCRAPED)
    result = call(settings, query='up{job="node"}')
    assert not result.is_error, result.content
    assert result.content.splitlines()[0] == "vector: 1 series"


def test_a_backend_that_does_not_answer_in_time_says_to_ask_for_less() -> None:
    with socket.socket() as silent:  # accepts connections (the backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        settings = Settings.load(
            environ={"PROMETHEUS_URL": url, "ONGRID_BACKEND_TIMEOUT_SECONDS": "0.5"}
        )
        result = call(settings, query="up")
    assert result.is_error
    assert result.content.startswith(f"Prometheus at {url} did not answer within 0.5 s: ask")
    assert "ONGRID_BACKEND_TIMEOUT_SECONDS" in result.content


# --- the schemas the model sees -----------------------------------------------------------

READ_TOOLS = [
    "query_promql",
    "query_logql",
    "search_logs",
    "query_traceql",
    "query_clickhouse_system",
]


@pytest.mark.parametrize("name", READ_TOOLS)
def test_every_argument_is_described_and_bounded(name: str) -> None:
    schema = CATALOG.get(name).parameters
    assert schema["additionalProperties"] is False
    for field, spec in schema["properties"].items():
        assert spec.get("description"), f"{name}.{field} has no description"
        kinds = spec.get("anyOf", [spec])
        for kind in kinds:
            if kind["type"] == "string":
                assert "pattern" in kind or "maxLength" in kind, f"{name}.{field} is unbounded"
            if kind["type"] == "integer":
                assert {"minimum", "maximum"} <= set(kind), f"{name}.{field} is unbounded"
    required = set(schema["required"])
    assert required and all(schema["properties"][r].get("minLength") == 1 for r in required)


@pytest.mark.parametrize(
    ("name", "arguments", "field"),
    [
        ("query_promql", {"query": ""}, "query"),
        ("query_promql", {"query": "up", "time": "yesterday"}, "time"),
        ("query_promql", {"query": "up", "start": "1 hour"}, "start"),
        ("query_promql", {"query": "up", "start": "1h", "step": "fast"}, "step"),
        ("query_promql", {"query": "up", "timeout": "5s"}, "timeout"),
        ("query_logql", {"query": '{a="b"}', "since": "1.5h"}, "since"),
        ("search_logs", {"selector": '{a="b"}', "limit": 501}, "limit"),
        ("query_traceql", {"query": "{}", "since": "an hour"}, "since"),
        ("query_clickhouse_system", {"sql": ""}, "sql"),
    ],
)
def test_arguments_outside_the_schema_are_refused_naming_the_field(
    name: str, arguments: dict[str, Any], field: str
) -> None:
    tool = CATALOG.get(name)
    with pytest.raises(ToolArgumentError, match=rf"invalid arguments for {name}: {field}"):
        tool.validate_arguments(arguments)


@pytest.mark.parametrize(
    "when", ["1714564800", "1714564800.5", "90s", "6h", "7d", "2024-05-01T12:00:00Z"]
)
def test_every_documented_time_form_is_accepted(when: str) -> None:
    tool = CATALOG.get("query_promql")
    tool.validate_arguments({"query": "up", "start": when, "end": when, "time": None})
    tool.validate_arguments({"query": "up", "time": "2024-05-01T12:00:00.250+02:00"})
