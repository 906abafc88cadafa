"""``search_logs`` and ``query_logql`` against Loki: a real Grafana Loki where one is installed,
and always against answers recorded in the format of Loki's ``/loki/api/v1/query_range``.

Grafana Loki is not packaged in Debian (Debian's ``loki`` is an unrelated program), so the real
server runs only where ``ONGRID_LOKI_BIN`` or a ``loki`` on ``PATH`` is Grafana Loki; otherwise
those tests are skipped, saying so. The recorded answers are served over real HTTP by a small
server that also records what the tools sent (parameters, credentials, tenant).
"""

from __future__ import annotations

import json
import re
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from servers import QuietHandler, local_http

from registry.settings import Settings
from registry.tools import ToolContext, ToolResult
from workers.testing.backends import BackendMissing, Loki, find_loki, free_port, start_loki
from workers.tools import default_catalog

CATALOG = default_catalog()
#: Bound on waiting for pushed lines to be queryable (the ingester answers from memory).
INGESTED = 30.0


def call(settings: Any, name: str, **arguments: Any) -> ToolResult:
    """Validate and run one tool the way the loop does."""
    tool = CATALOG.get(name)
    return tool.run(tool.validate_arguments(arguments), ToolContext(settings=settings))


# --- answers recorded in Loki's documented format ------------------------------------------

#: A log query's answer (``resultType: streams``): values are [nanosecond string, line].
STREAMS = {
    "status": "success",
    "data": {
        "resultType": "streams",
        "result": [
            {
                "stream": {"app": "api", "level": "error"},
                "values": [
                    ["1700000002000000000", 'level=error msg="upstream timeout" path=/pay'],
                    ["1700000000000000000", 'level=error msg="db refused" path=/pay'],
                ],
            },
            {
                "stream": {"app": "api", "level": "info"},
                "values": [["1700000001000000000", "level=info msg=ok path=/health"]],
            },
        ],
        "stats": {"summary": {"totalEntriesReturned": 3}},
    },
}
#: A metric query's answer (``resultType: matrix``): values are [unix seconds, string].
MATRIX = {
    "status": "success",
    "data": {
        "resultType": "matrix",
        "result": [
            {
                "metric": {"level": "error"},
                "values": [[1700000000, "2"], [1700000060, "7"], [1700000120, "3"]],
            }
        ],
    },
}
#: Loki's answer to LogQL it cannot parse: HTTP 400, the message as plain text.
PARSE_ERROR = "parse error at line 1, col 6: syntax error: unexpected IDENTIFIER, expecting = or =~"


@dataclass
class Recorded:
    """A server answering as Loki would: ``answer`` is (status, content type, body)."""

    url: str = ""
    answer: tuple[int, str, bytes] = (200, "application/json", json.dumps(STREAMS).encode())
    tenant_required: bool = False
    requests: list[dict[str, Any]] = field(default_factory=list)

    def answer_json(self, body: dict[str, Any]) -> None:
        self.answer = (200, "application/json", json.dumps(body).encode())


@pytest.fixture
def recorded() -> Iterator[Recorded]:
    state = Recorded()

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            parsed = urllib.parse.urlsplit(self.path)
            state.requests.append(
                {
                    "path": parsed.path,
                    "params": dict(urllib.parse.parse_qsl(parsed.query)),
                    "headers": {k.lower(): v for k, v in self.headers.items()},
                }
            )
            status, kind, body = state.answer
            if state.tenant_required and not self.headers.get("X-Scope-OrgID"):
                status, kind, body = 401, "text/plain", b"no org id\n"  # Loki's own answer
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    with local_http(Handler) as state.url:
        yield state


def test_log_lines_come_newest_first_with_their_labels(recorded: Recorded) -> None:
    result = call(
        Settings(loki_url=recorded.url), "search_logs", selector='app="api"', contains="path=/"
    )
    assert not result.is_error, result.content
    assert result.content.splitlines() == [
        'LogQL: {app="api"} |= "path=/"',
        "3 log lines from 2 streams, newest first",
        '2023-11-14T22:13:22+00:00 {app=api,level=error} level=error msg="upstream timeout" '
        "path=/pay",
        "2023-11-14T22:13:21+00:00 {app=api,level=info} level=info msg=ok path=/health",
        '2023-11-14T22:13:20+00:00 {app=api,level=error} level=error msg="db refused" path=/pay',
    ]
    [sent] = recorded.requests
    assert sent["path"] == "/loki/api/v1/query_range"
    params = sent["params"]
    assert (params["query"], params["limit"], params["direction"]) == (
        '{app="api"} |= "path=/"',
        "100",
        "backward",
    )
    assert int(params["end"]) - int(params["start"]) == 3600 * 10**9  # since=1h, nanoseconds
    assert abs(int(params["end"]) / 1e9 - time.time()) < 3600  # about now, not 1970
    assert "authorization" not in sent["headers"] and "x-scope-orgid" not in sent["headers"]


def test_a_metric_query_is_summarised_like_prometheus(recorded: Recorded) -> None:
    recorded.answer_json(MATRIX)
    query = 'sum by (level) (count_over_time({app="api"}[1m]))'
    result = call(Settings(loki_url=recorded.url), "query_logql", query=query, since="15m")
    assert not result.is_error, result.content
    lines = result.content.splitlines()
    assert lines[:2] == [f"LogQL: {query}", "matrix: 1 series"]
    assert re.fullmatch(
        r'\{level="error"\}: 3 samples \S+ \.\. \S+, min=2 max=7 avg=4 last=3', lines[2]
    )
    assert recorded.requests[0]["params"]["query"] == query


def test_reaching_the_limit_and_long_lines_are_said_not_hidden(recorded: Recorded) -> None:
    long_line = "x" * 700
    answer = json.loads(json.dumps(STREAMS))
    answer["data"]["result"][1]["values"][0][1] = long_line
    recorded.answer_json(answer)
    result = call(Settings(loki_url=recorded.url), "search_logs", selector="{app='api'}", limit=3)
    assert not result.is_error, result.content
    assert "x" * 500 + "\n[line truncated: 200 more characters not shown]" in result.content
    assert result.content.splitlines()[-1] == (
        "[limit of 3 lines reached: older lines in the window are not shown; narrow the "
        "selector, filter or since, or raise limit (at most 500)]"
    )
    fewer = call(Settings(loki_url=recorded.url), "search_logs", selector="{app='api'}", limit=4)
    assert "limit of" not in fewer.content


def test_bad_logql_comes_back_with_loki_own_message(recorded: Recorded) -> None:
    recorded.answer = (400, "text/plain; charset=utf-8", PARSE_ERROR.encode())
    result = call(Settings(loki_url=recorded.url), "query_logql", query="{app api}")
    assert result.is_error
    assert result.content == f"Loki rejected the query (HTTP 400): {PARSE_ERROR}"


def test_credentials_and_tenant_are_sent_as_configured(recorded: Recorded) -> None:
    recorded.tenant_required = True
    missing = call(Settings(loki_url=recorded.url), "search_logs", selector='{app="api"}')
    assert missing.is_error
    assert missing.content.startswith(
        f"Loki at {recorded.url} refused the request (HTTP 401: no org id): the credentials "
        "are missing (none were sent); set LOKI_USER / LOKI_PASSWORD or LOKI_BEARER_TOKEN "
        "(and LOKI_TENANT for a multi-tenant Loki)"
    )
    env = {"LOKI_URL": recorded.url, "LOKI_TENANT": "team-a", "LOKI_BEARER_TOKEN": "tok-123"}
    result = call(Settings.load(environ=env), "search_logs", selector='{app="api"}')
    assert not result.is_error, result.content
    sent = recorded.requests[-1]["headers"]
    assert (sent["x-scope-orgid"], sent["authorization"]) == ("team-a", "Bearer tok-123")
    basic = {"LOKI_URL": recorded.url, "LOKI_TENANT": "t", "LOKI_USER": "u", "LOKI_PASSWORD": "p"}
    call(Settings.load(environ=basic), "search_logs", selector='{app="api"}')
    assert recorded.requests[-1]["headers"]["authorization"] == "Basic dTpw"  # base64 "u:p"


def test_an_unreachable_loki_names_the_url_and_the_setting() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = call(Settings(loki_url=url), "search_logs", selector='{app="api"}')
    assert result.is_error
    assert result.content.startswith(f"could not reach Loki at {url} (")
    assert "is LOKI_URL right?" in result.content


# --- a real Grafana Loki, where one is installed -------------------------------------------


def test_a_loki_that_is_not_grafana_loki_is_named_and_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    impostor = tmp_path / "loki"  # what Debian's `loki` package would put on PATH
    impostor.write_text("#!/bin/sh\necho 'Loki 2.4.7: MCMC linkage analysis'\n")
    impostor.chmod(0o755)
    monkeypatch.setenv("ONGRID_LOKI_BIN", str(impostor))
    with pytest.raises(BackendMissing) as missing:
        find_loki()
    assert missing.value.reason.startswith(f"{impostor} is not Grafana Loki (its -version printed")
    assert "Grafana Loki is not packaged in Debian" in missing.value.reason


@pytest.fixture(scope="module")
def loki(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loki]:
    try:
        server = start_loki(tmp_path_factory.mktemp("loki"))
    except BackendMissing as exc:
        pytest.skip(f"the real-Loki tests do not run here: {exc.reason}")
    yield server
    server.stop()


def _lines_of(settings: Settings, selector: str, expected: int) -> ToolResult:
    """``search_logs`` of ``selector`` once Loki returns ``expected`` lines for it."""
    deadline = time.monotonic() + INGESTED
    while True:
        result = call(settings, "search_logs", selector=selector)
        assert not result.is_error, result.content
        if f"{expected} log lines" in result.content:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{INGESTED:g} s passed waiting for Loki to return {expected} lines of "
                f"{selector}; its last answer: {result.content}"
            )
        time.sleep(0.25)


def test_pushed_lines_are_found_newest_first(loki: Loki, tmp_path: Path) -> None:
    run = tmp_path.name  # a label value of this test's own
    loki.push({"app": "checkout", "run": run}, ["start", "level=error msg=declined", "done"])
    settings = Settings(loki_url=loki.url)
    everything = _lines_of(settings, f'{{run="{run}"}}', 3)
    bodies = [ln.rsplit("} ", 1)[1] for ln in everything.content.splitlines()[2:]]
    assert bodies == ["done", "level=error msg=declined", "start"]
    only = call(settings, "search_logs", selector=f'run="{run}"', contains="error")
    assert not only.is_error, only.content
    assert only.content.splitlines()[1] == "1 log lines from 1 streams, newest first"
    assert only.content.endswith("{app=checkout,run=" + run + "} level=error msg=declined")


def test_a_real_metric_query_counts_the_pushed_lines(loki: Loki, tmp_path: Path) -> None:
    run = tmp_path.name
    loki.push({"app": "worker", "run": run}, [f"job {n}" for n in range(4)])
    settings = Settings(loki_url=loki.url)
    _lines_of(settings, f'{{run="{run}"}}', 4)
    result = call(
        settings, "query_logql", query=f'sum(count_over_time({{run="{run}"}}[10m]))', since="10m"
    )
    assert not result.is_error, result.content
    assert "matrix: 1 series" in result.content and "max=4" in result.content


def test_real_loki_bad_logql_comes_back_verbatim(loki: Loki) -> None:
    result = call(Settings(loki_url=loki.url), "query_logql", query="{app api}")
    assert result.is_error
    assert result.content.startswith("Loki rejected the query (HTTP 400): ")
    assert "parse error" in result.content
