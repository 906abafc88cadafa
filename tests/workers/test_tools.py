"""The standard tool catalog, exercised for real: real commands, real files, a real HTTP server."""

from __future__ import annotations

import json
import os
import socket
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from servers import QuietHandler, local_http

from registry.errors import ToolArgumentError
from registry.tools import AGENT_TOOL_NAME, ToolContext, ToolResult
from workers.tools import default_catalog

CATALOG = default_catalog()


def call(name: str, settings: Any = None, **arguments: Any) -> ToolResult:
    """Validate and run one tool the way the loop does."""
    tool = CATALOG.get(name)
    return tool.run(tool.validate_arguments(arguments), ToolContext(settings=settings))


# --- a tiny backend on 127.0.0.1 ------------------------------------------------------------


@dataclass
class Backend:
    url: str
    responses: dict[str, Any] = field(default_factory=dict)  # path -> JSON body
    requests: list[dict[str, Any]] = field(default_factory=list)


@pytest.fixture
def backend() -> Iterator[Backend]:
    state = Backend(url="")

    class Handler(QuietHandler):
        def _answer(self) -> None:
            parsed = urllib.parse.urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            state.requests.append(
                {
                    "path": parsed.path,
                    "params": dict(urllib.parse.parse_qsl(parsed.query)),
                    "body": self.rfile.read(length).decode(),
                }
            )
            body = json.dumps(state.responses.get(parsed.path, {"status": "error"})).encode()
            self.send_response(200 if parsed.path in state.responses else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

    with local_http(Handler) as state.url:
        yield state


# --- catalog and schemas --------------------------------------------------------------------


def test_catalog_holds_every_standard_tool_and_no_agent_tool() -> None:
    expected = {
        "host_probe",
        "get_edge_summary",
        "bash",
        "host_bash",
        "host_restart_service",
        "host_reboot",
        "query_promql",
        "query_logql",
        "search_logs",
        "query_traceql",
        "query_clickhouse_system",
        "expand_topology",
        "find_topology_node",
        "query_devices",
        "query_knowledge",
        "search_knowledge",
        "read_repo",
    }
    assert set(CATALOG.names()) == expected
    assert AGENT_TOOL_NAME not in CATALOG


@pytest.mark.parametrize("tool", list(CATALOG), ids=lambda t: t.name)
def test_every_tool_has_a_schema_and_rejects_unknown_arguments(tool: Any) -> None:
    schema = tool.parameters
    assert schema["type"] == "object"
    assert "properties" in schema
    assert "context" not in schema["properties"]
    assert len(tool.description) > 40
    with pytest.raises(ToolArgumentError, match="bogus"):
        tool.validate_arguments({"bogus": 1})


def test_tool_classes() -> None:
    classes = {t.name: t.tool_class.value for t in CATALOG}
    assert classes["host_restart_service"] == "write"
    assert classes["host_reboot"] == "destructive"
    assert {c for n, c in classes.items() if n not in ("host_restart_service", "host_reboot")} == {
        "read"
    }


# --- host -----------------------------------------------------------------------------------


def test_host_probe_reports_real_numbers_for_root() -> None:
    result = call("host_probe", section="disk")
    assert not result.is_error
    report = json.loads(result.content)
    assert report["hostname"] == socket.gethostname()
    root = next(fs for fs in report["filesystems"] if fs["mountpoint"] == "/")
    st = os.statvfs("/")
    assert root["total_gib"] == pytest.approx(st.f_blocks * st.f_frsize / 1024**3, abs=0.01)
    assert root["total_gib"] > 0
    assert 0 <= root["used_percent"] <= 100
    assert root["inodes_total"] == st.f_files
    assert "cpu" not in report and "processes" not in report


def test_host_probe_all_sections() -> None:
    report = call("host_probe").data
    assert report["cpu"]["logical_cpus"] == os.cpu_count()
    assert report["memory"]["total_gib"] > 0
    assert report["load_average"]["1m"] >= 0
    assert report["processes"]["process_count"] > 0
    assert report["processes"]["top_memory"][0]["rss_mib"] > 0
    assert any(nic["interface"] == "lo" for nic in report["network"]) or report["network"]


def test_host_probe_rejects_unknown_section() -> None:
    with pytest.raises(ToolArgumentError, match="section"):
        CATALOG.get("host_probe").validate_arguments({"section": "gpu"})


def test_edge_summary_is_short_and_real() -> None:
    result = call("get_edge_summary")
    assert not result.is_error
    assert socket.gethostname() in result.content
    assert "fullest filesystem:" in result.content
    assert len(result.content.splitlines()) == 5


# --- Prometheus, Loki, Tempo ----------------------------------------------------------------

VECTOR = {
    "status": "success",
    "data": {
        "resultType": "vector",
        "result": [
            {
                "metric": {"__name__": "up", "instance": "edge-12:9100", "job": "node"},
                "value": [1700000000, "1"],
            },
            {
                "metric": {"__name__": "up", "instance": "edge-13:9100", "job": "node"},
                "value": [1700000000, "0"],
            },
        ],
    },
}
MATRIX = {
    "status": "success",
    "data": {
        "resultType": "matrix",
        "result": [
            {"metric": {"instance": "edge-12"}, "values": [[1700000000, "1"], [1700000060, "3"]]},
        ],
    },
}


def test_query_promql_instant(backend: Backend) -> None:
    backend.responses["/api/v1/query"] = VECTOR
    result = call("query_promql", SimpleNamespace(prometheus_url=backend.url), query="up == 0")
    assert not result.is_error
    assert 'up{instance="edge-13:9100", job="node"} = 0' in result.content
    assert "vector: 2 series" in result.content
    assert backend.requests == [  # Prometheus stops evaluating when the tool stops waiting
        {"path": "/api/v1/query", "params": {"query": "up == 0", "timeout": "10s"}, "body": ""}
    ]


def test_query_promql_range(backend: Backend) -> None:
    backend.responses["/api/v1/query_range"] = MATRIX
    settings = SimpleNamespace(prometheus_url=backend.url + "/")
    result = call("query_promql", settings, query="up", start="1h", step="1m")
    assert not result.is_error
    assert "2 samples" in result.content and "max=3" in result.content
    params = backend.requests[0]["params"]
    assert params["step"] == "1m"
    assert float(params["end"]) - float(params["start"]) == pytest.approx(3600, abs=1)


def test_query_promql_reports_backend_errors(backend: Backend) -> None:
    result = call("query_promql", SimpleNamespace(prometheus_url=backend.url), query="up")
    assert result.is_error and "HTTP 404" in result.content


def test_query_promql_not_configured() -> None:
    for settings in (None, SimpleNamespace(prometheus_url=None), SimpleNamespace()):
        result = call("query_promql", settings, query="up")
        assert result.is_error
        assert "query_promql is not configured: set PROMETHEUS_URL" in result.content


def test_query_promql_unreachable() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = call(
        "query_promql", SimpleNamespace(prometheus_url=f"http://127.0.0.1:{port}"), query="up"
    )
    assert result.is_error and "could not reach Prometheus" in result.content


def test_search_logs_builds_logql(backend: Backend) -> None:
    backend.responses["/loki/api/v1/query_range"] = {
        "status": "success",
        "data": {
            "resultType": "streams",
            "result": [
                {"stream": {"app": "api"}, "values": [["1700000000000000000", 'GET / 500 "oops"']]},
            ],
        },
    }
    settings = SimpleNamespace(loki_url=backend.url)
    result = call(
        "search_logs", settings, selector='app="api"', contains='500 "oops"', since="30m", limit=10
    )
    assert not result.is_error
    assert '{app=api} GET / 500 "oops"' in result.content
    params = backend.requests[0]["params"]
    assert params["query"] == '{app="api"} |= "500 \\"oops\\""'
    assert params["limit"] == "10"
    assert int(params["end"]) - int(params["start"]) == 30 * 60 * 10**9  # nanoseconds
    assert call("query_logql", None, query='{a="b"}').content.startswith(
        "query_logql is not configured: set LOKI_URL"
    )


def test_query_traceql(backend: Backend) -> None:
    backend.responses["/api/search"] = {
        "traces": [
            {
                "traceID": "abc123",
                "rootServiceName": "api",
                "rootTraceName": "GET /",
                "startTimeUnixNano": "1700000000000000000",
                "durationMs": 2300,
                "spanSets": [{"spans": [{}, {}]}],
            }
        ]
    }
    result = call(
        "query_traceql", SimpleNamespace(tempo_url=backend.url), query="{ duration > 2s }"
    )
    assert not result.is_error
    assert "abc123" in result.content and "2300 ms, 2 matching spans" in result.content
    assert backend.requests[0]["params"]["q"] == "{ duration > 2s }"
    assert call("query_traceql", None, query="{}").is_error


# --- ClickHouse -----------------------------------------------------------------------------


def test_clickhouse_refuses_before_any_network_call(backend: Backend) -> None:
    settings = SimpleNamespace(clickhouse_url=backend.url)
    result = call("query_clickhouse_system", settings, sql="SELECT * FROM default.t")
    assert result.is_error and result.content.startswith("refused:")
    assert backend.requests == []


def test_clickhouse_query_is_readonly_and_capped(backend: Backend) -> None:
    backend.responses["/"] = {
        "meta": [{"name": "table", "type": "String"}, {"name": "parts", "type": "UInt64"}],
        "data": [["events", "812"], ["logs", "12"]],
        "rows": 2,
    }
    settings = SimpleNamespace(clickhouse_url=backend.url)
    result = call(
        "query_clickhouse_system",
        settings,
        sql="SELECT table, count() AS parts FROM system.parts GROUP BY table;",
    )
    assert not result.is_error
    assert result.content.splitlines()[:3] == ["table\tparts", "events\t812", "logs\t12"]
    sent = backend.requests[0]
    assert sent["params"] == {"readonly": "1"}
    assert sent["body"] == (
        "SELECT * FROM (SELECT table, count() AS parts FROM system.parts "
        "GROUP BY table) LIMIT 201 FORMAT JSONCompact"
    )


def test_clickhouse_not_configured() -> None:
    result = call("query_clickhouse_system", sql="SELECT * FROM system.parts")
    assert result.is_error and "set CLICKHOUSE_URL" in result.content


# --- topology -------------------------------------------------------------------------------

TOPOLOGY = """
nodes:
  - {id: site-lis, name: Lisbon, kind: site, labels: {region: eu}}
  - {id: sw-1, name: Core switch 1, kind: switch, labels: {site: lisbon}}
  - {id: edge-12, name: Edge 12, kind: host, labels: {site: lisbon, role: edge}}
  - {id: edge-13, name: Edge 13, kind: host, labels: {site: porto}}
  - {id: api, name: API service, kind: service, labels: {team: core}}
edges:
  - {from: site-lis, to: sw-1, kind: contains}
  - {from: sw-1, to: edge-12, kind: connects}
  - {from: edge-12, to: api, kind: runs}
"""


@pytest.fixture
def topology(tmp_path: Any) -> SimpleNamespace:
    path = tmp_path / "topology.yaml"
    path.write_text(TOPOLOGY)
    return SimpleNamespace(topology_file=str(path))


def test_find_topology_node(topology: SimpleNamespace) -> None:
    found = call("find_topology_node", topology, query="EDGE").data
    assert [n["id"] for n in found] == ["edge-12", "edge-13"]
    assert [n["id"] for n in call("find_topology_node", topology, query="site=lisbon").data] == [
        "sw-1",
        "edge-12",
    ]
    assert call("find_topology_node", topology, query="edge 12").data[0]["id"] == "edge-12"


def test_expand_topology(topology: SimpleNamespace) -> None:
    both = call("expand_topology", topology, node_id="sw-1").data
    assert {n["id"]: n["distance"] for n in both["nodes"]} == {
        "sw-1": 0,
        "site-lis": 1,
        "edge-12": 1,
    }
    down = call("expand_topology", topology, node_id="site-lis", depth=3, direction="down").data
    assert [n["id"] for n in down["nodes"]] == ["site-lis", "sw-1", "edge-12", "api"]
    up = call("expand_topology", topology, node_id="API service", depth=2, direction="up").data
    assert [n["id"] for n in up["nodes"]] == ["api", "edge-12", "sw-1"]
    assert {"from": "edge-12", "to": "api", "kind": "runs"} in up["edges"]
    missing = call("expand_topology", topology, node_id="nope")
    assert missing.is_error and "find_topology_node" in missing.content


def test_query_devices(topology: SimpleNamespace) -> None:
    assert [n["id"] for n in call("query_devices", topology, kind="HOST").data] == [
        "edge-12",
        "edge-13",
    ]
    assert [
        n["id"] for n in call("query_devices", topology, kind="host", label="site=lisbon").data
    ] == ["edge-12"]
    assert [n["id"] for n in call("query_devices", topology, label="team").data] == ["api"]
    assert len(call("query_devices", topology).data) == 5


def test_topology_file_problems_name_the_file(tmp_path: Any) -> None:
    missing = str(tmp_path / "absent.yaml")
    result = call("query_devices", SimpleNamespace(topology_file=missing))
    assert result.is_error and missing in result.content
    broken = tmp_path / "broken.yaml"
    broken.write_text("nodes: [{name: no id}]\n")
    result = call("find_topology_node", SimpleNamespace(topology_file=str(broken)), query="x")
    assert result.is_error and str(broken) in result.content and "needs an id" in result.content
    result = call("expand_topology", None, node_id="x")
    assert result.is_error and "ONGRID_TOPOLOGY_FILE" in result.content


# --- knowledge ------------------------------------------------------------------------------

DISK_MD = """# Disk runbook

Owned by the storage team.

## Disk full on /var

When a filesystem is full, check usage with df -h and inodes with df -i.
Find the biggest directories with du. Inode exhaustion: many small files.

## Slow disk IO

Check iostat for await and utilisation. A slow disk shows high await.

```
# this is not a heading
```
"""
NETWORK_MD = """# Network

## Packet loss on uplink

Check ip -s link for errors and drops, then the switch port counters.
"""
CLICKHOUSE_MD = """## Too many parts

ClickHouse refuses inserts when a table has too many active parts. Check system.parts.
"""


@pytest.fixture
def knowledge(tmp_path: Any) -> SimpleNamespace:
    (tmp_path / "storage").mkdir()
    (tmp_path / "storage" / "disk.md").write_text(DISK_MD)
    (tmp_path / "network.md").write_text(NETWORK_MD)
    other = tmp_path / "other"
    other.mkdir()
    (other / "clickhouse.md").write_text(CLICKHOUSE_MD)
    (other / "notes.txt").write_text("disk full disk full disk full")  # not Markdown: ignored
    return SimpleNamespace(knowledge_dirs=os.pathsep.join([str(tmp_path), str(other)]))


def test_knowledge_ranks_the_right_section_first(knowledge: SimpleNamespace) -> None:
    result = call("search_knowledge", knowledge, query="disk full inodes")
    assert not result.is_error
    best = result.data[0]
    assert best["title"] == "Disk runbook > Disk full on /var"
    assert best["path"].endswith("disk.md") and best["line"] == 5
    assert 0.6 <= best["score"] <= 1.0
    assert "df -i" in best["excerpt"]
    assert len(result.data) <= 3
    assert [r["score"] for r in result.data] == sorted(
        (r["score"] for r in result.data), reverse=True
    )


def test_knowledge_scores_partial_matches_low(knowledge: SimpleNamespace) -> None:
    result = call("query_knowledge", knowledge, query="packet loss kubernetes ingress certificate")
    assert result.data[0]["title"] == "Network > Packet loss on uplink"
    assert result.data[0]["score"] < 0.6
    parts = call("query_knowledge", knowledge, query="too many parts", limit=1).data
    assert parts[0]["title"] == "Too many parts" and parts[0]["score"] >= 0.6


def test_knowledge_is_deterministic_and_honest(knowledge: SimpleNamespace) -> None:
    first = call("search_knowledge", knowledge, query="slow disk await").content
    assert first == call("search_knowledge", knowledge, query="slow disk await").content
    assert "Slow disk IO" in first.splitlines()[0]
    none = call("search_knowledge", knowledge, query="zebra")
    assert not none.is_error and none.data == []
    result = call("search_knowledge", None, query="disk")
    assert result.is_error and "ONGRID_KNOWLEDGE_DIRS" in result.content


def test_knowledge_accepts_a_list_setting(knowledge: SimpleNamespace) -> None:
    dirs = knowledge.knowledge_dirs.split(os.pathsep)
    result = call("query_knowledge", SimpleNamespace(knowledge_dirs=dirs), query="too many parts")
    assert result.data[0]["path"].endswith("clickhouse.md")


# --- read_repo ------------------------------------------------------------------------------


@pytest.fixture
def repo(tmp_path: Any) -> SimpleNamespace:
    root = tmp_path / "repo"
    (root / "deploy").mkdir(parents=True)
    (root / "deploy" / "app.yaml").write_text("".join(f"line {i}\n" for i in range(1, 301)))
    (root / "README.md").write_text("hello\n")
    (tmp_path / "secret.txt").write_text("top secret\n")
    (root / "escape").symlink_to(tmp_path / "secret.txt")
    return SimpleNamespace(repo_root=str(root))


def test_read_repo_reads_and_pages(repo: SimpleNamespace) -> None:
    result = call("read_repo", repo, path="deploy/app.yaml", start_line=100, max_lines=5)
    assert not result.is_error
    lines = result.content.splitlines()
    assert lines[0] == "deploy/app.yaml: lines 100-104 of 300 (continue with start_line=105)"
    assert lines[1].split() == ["100", "line", "100"]
    assert len(lines) == 6


def test_read_repo_lists_directories(repo: SimpleNamespace) -> None:
    result = call("read_repo", repo, path=".")
    assert not result.is_error
    assert "deploy/" in result.content.splitlines()
    assert "README.md" in result.data


@pytest.mark.parametrize("path", ["../secret.txt", "deploy/../../secret.txt", "escape", "/etc"])
def test_read_repo_refuses_escapes(repo: SimpleNamespace, path: str) -> None:
    result = call("read_repo", repo, path=path)
    assert result.is_error
    assert "outside the repository root" in result.content
    assert "top secret" not in result.content


def test_read_repo_missing_and_not_configured(repo: SimpleNamespace) -> None:
    assert "does not exist" in call("read_repo", repo, path="nope.txt").content
    result = call("read_repo", None, path="README.md")
    assert result.is_error and "ONGRID_REPO_ROOT" in result.content


def test_read_repo_reads_only_regular_files(repo: SimpleNamespace) -> None:
    root = Path(repo.repo_root)
    os.mkfifo(root / "pipe")  # opening it for reading would block until a writer came
    (root / "null").symlink_to("/dev/null")
    fifo = call("read_repo", repo, path="pipe")
    assert fifo.is_error and "not a regular file" in fifo.content
    device = call("read_repo", repo, path="null")
    assert device.is_error and "outside the repository root" in device.content


def test_read_repo_streams_big_files_and_says_when_it_stopped_counting(
    repo: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers.tools import _repo

    monkeypatch.setattr(_repo, "MAX_READ_BYTES", 10_000)
    big = Path(repo.repo_root) / "big.log"
    big.write_text("".join(f"entry {i}\n" for i in range(100_000)))
    result = call("read_repo", repo, path="big.log", start_line=3, max_lines=2)
    assert not result.is_error
    header, *lines = result.content.splitlines()
    assert header.startswith("big.log: lines 3-4 of more than ")
    assert [line.split()[-1] for line in lines] == ["2", "3"]
    assert result.data["total_lines"] is None


def test_tool_arguments_are_bounded_for_every_tool() -> None:
    for tool in CATALOG:
        with pytest.raises(ToolArgumentError, match="NUL"):
            tool.validate_arguments({"x": "a\0b"})
        with pytest.raises(ToolArgumentError, match="larger than 64 KiB"):
            tool.validate_arguments({"x": "y" * 70_000})
        deep: dict[str, Any] = {}
        for _ in range(30):
            deep = {"d": deep}
        with pytest.raises(ToolArgumentError, match="deeper than"):
            tool.validate_arguments(deep)


def test_read_repo_holds_no_more_than_a_window_of_one_enormous_line(
    repo: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers.tools import _repo

    monkeypatch.setattr(_repo, "MAX_LINE_BYTES", 100)
    huge = Path(repo.repo_root) / "one-line.json"
    huge.write_text("x" * 10_000 + "\nsecond\n")
    result = call("read_repo", repo, path="one-line.json")
    assert not result.is_error
    header, first, second = result.content.splitlines()
    assert header == "one-line.json: lines 1-2 of 2"
    assert first.split()[1] == "x" * 100  # only the kept part of the line
    assert second.split() == ["2", "second"]
