"""Real backend servers for tests and scenarios, each on free 127.0.0.1 ports in a directory.

Prometheus, its node exporter and ClickHouse come from Debian's packages (``./dev test``
installs them); Grafana Loki is not packaged by Debian, so :func:`start_loki` runs a binary
named by ``ONGRID_LOKI_BIN`` or a ``loki`` on ``PATH`` that says it is Grafana Loki. A missing
binary raises :class:`BackendMissing` with what installs it; a server that does not come up
within :data:`START_TIMEOUT` raises :class:`RuntimeError` with the end of its log.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "DIAG_PASSWORD",
    "DIAG_USER",
    "PROMETHEUS_PASSWORD",
    "PROMETHEUS_USER",
    "START_TIMEOUT",
    "BackendMissing",
    "ClickHouse",
    "Loki",
    "NodeExporter",
    "Prometheus",
    "find_loki",
    "free_port",
    "start_clickhouse",
    "start_loki",
    "start_node_exporter",
    "start_prometheus",
]

#: How long a server may take to answer its readiness check before the start fails.
START_TIMEOUT = 60.0
#: How long one request of a launcher's own (readiness, setup, push) may take.
REQUEST_TIMEOUT = 30.0
_LOG_TAIL = 3000


class BackendMissing(RuntimeError):
    """The server's binary is not installed here; ``reason`` says what installs it."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listened on a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _binary(name: str, package: str) -> str:
    # Debian puts some servers in /usr/sbin, which a non-root PATH may lack.
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin")
    if found is None:
        raise BackendMissing(
            f"{name} is not installed (Debian: apt-get install {package}); ./dev test installs it"
        )
    return found


def _get(url: str, headers: Mapping[str, str] | None = None, timeout: float = 2.0) -> bytes:
    request = urllib.request.Request(url, headers=dict(headers or {}))
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return bytes(response.read())


@dataclass
class _Server:
    """A started server process: where it answers, and how to end it."""

    name: str
    url: str
    proc: subprocess.Popen[bytes]
    root: Path
    logs: tuple[Path, ...] = field(default=(), repr=False)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        """The end of each of the server's log files."""
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-_LOG_TAIL:]}"
            for p in (self.root / "stdout.log", *self.logs)
            if p.exists()
        )

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def _wait_ready(self, ready: Callable[[], bool], timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if ready():
                    return
            except OSError:  # refused while starting, or a 503 "not ready yet"
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                exited = self.proc.poll()
                self.stop()
                state = f"exited with {exited}" if exited is not None else f"{timeout:g} s passed"
                raise RuntimeError(
                    f"{self.name} did not come up on {self.url} ({state}):\n{self.log()}"
                )
            time.sleep(0.2)


def _spawn(argv: Sequence[str], root: Path) -> subprocess.Popen[bytes]:
    with open(root / "stdout.log", "ab") as log:  # the child keeps its own descriptor
        return subprocess.Popen(
            list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=root
        )


# --- node exporter -------------------------------------------------------------------------


@dataclass
class NodeExporter(_Server):
    """``prometheus-node-exporter``: this machine's metrics on ``/metrics``."""

    address: str = ""
    """``127.0.0.1:port``, as a Prometheus scrape target."""


def start_node_exporter(root: Path, *, textfile_dir: Path | None = None) -> NodeExporter:
    """A node exporter on a free port; ``textfile_dir`` holds ``*.prom`` files it also serves
    (default: an empty directory under ``root``, not the system's)."""
    binary = _binary("prometheus-node-exporter", "prometheus-node-exporter")
    root.mkdir(parents=True, exist_ok=True)
    textfiles = textfile_dir or root / "textfile"
    textfiles.mkdir(parents=True, exist_ok=True)
    address = f"127.0.0.1:{free_port()}"
    argv = [
        binary,
        f"--web.listen-address={address}",
        f"--collector.textfile.directory={textfiles}",
        "--log.level=warn",
    ]
    server = NodeExporter("prometheus-node-exporter", f"http://{address}", _spawn(argv, root), root)
    server.address = address
    server._wait_ready(lambda: b"node_" in _get(server.url + "/metrics", timeout=5))
    return server


# --- Prometheus ----------------------------------------------------------------------------

#: The basic-auth user a Prometheus started with ``auth=True`` accepts (and only it).
PROMETHEUS_USER, PROMETHEUS_PASSWORD = "ongrid", "scrape-secret-for-tests"
# bcrypt of PROMETHEUS_PASSWORD (cost 10), as Prometheus's web config wants it; computed once
# (no bcrypt library is a dependency of the project).
_PROMETHEUS_HASH = "$2b$10$EG8J9HtFOcWrMWNUL4z9k.ng9HEbJ3RGF4O2lJogG0s.fvCnkhbjy"


@dataclass
class Prometheus(_Server):
    """A Prometheus server scraping the targets it was started with."""

    auth: tuple[str, str] | None = None
    """The basic-auth user and password it requires, if any."""

    def _headers(self) -> dict[str, str]:
        if self.auth is None:
            return {}
        token = base64.b64encode(f"{self.auth[0]}:{self.auth[1]}".encode()).decode()
        return {"Authorization": f"Basic {token}"}

    def api(self, path: str, params: Mapping[str, str]) -> Any:
        """The ``data`` of a successful ``/api/v1`` answer; a failure raises with its error."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            body = json.loads(_get(url, self._headers(), timeout=REQUEST_TIMEOUT))
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read() or b"{}")
        if body.get("status") != "success":
            raise RuntimeError(f"Prometheus refused {params}: {body.get('error', body)}")
        return body["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The instant vector of ``promql`` now (an empty list when no series matched)."""
        return list(self.api("query", {"query": promql})["result"])

    def wait_for(
        self,
        promql: str,
        predicate: Callable[[list[dict[str, Any]]], bool] = bool,
        timeout: float = START_TIMEOUT,
    ) -> list[dict[str, Any]]:
        """Query ``promql`` until ``predicate`` holds for its result (default: any series), and
        return that result; fails naming the query and its last answer after ``timeout``."""
        deadline = time.monotonic() + timeout
        result: list[dict[str, Any]] = []
        while True:
            if not self.alive():
                raise RuntimeError(f"prometheus exited while waiting for {promql}:\n{self.log()}")
            result = self.query(promql)
            if predicate(result):
                return result
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{timeout:g} s passed waiting for Prometheus to answer {promql} as "
                    f"expected; its last answer: {result}"
                )
            time.sleep(0.25)


def start_prometheus(
    root: Path,
    targets: dict[str, list[str]],
    *,
    scrape_interval: str = "1s",
    auth: bool = False,
) -> Prometheus:
    """A Prometheus scraping ``targets`` (job name -> ``host:port`` list) every
    ``scrape_interval``, its data under ``root``; with ``auth`` its HTTP API and UI require
    :data:`PROMETHEUS_USER` / :data:`PROMETHEUS_PASSWORD` (``--web.config.file``)."""
    binary = _binary("prometheus", "prometheus")
    root.mkdir(parents=True, exist_ok=True)
    config = {
        "global": {"scrape_interval": scrape_interval, "scrape_timeout": scrape_interval},
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": list(hosts)}]}
            for job, hosts in targets.items()
        ],
    }
    (root / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    port = free_port()
    argv = [
        binary,
        f"--config.file={root / 'prometheus.yml'}",
        f"--storage.tsdb.path={root / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    if auth:
        web = {"basic_auth_users": {PROMETHEUS_USER: _PROMETHEUS_HASH}}
        (root / "web.yml").write_text(yaml.safe_dump(web), encoding="utf-8")
        argv.append(f"--web.config.file={root / 'web.yml'}")
    server = Prometheus("prometheus", f"http://127.0.0.1:{port}", _spawn(argv, root), root)
    if auth:
        server.auth = (PROMETHEUS_USER, PROMETHEUS_PASSWORD)
    server._wait_ready(lambda: _get(server.url + "/-/ready", server._headers()) != b"")
    return server


# --- ClickHouse ----------------------------------------------------------------------------

#: The read-only diagnostics user of ``query_clickhouse_system`` (a users.xml profile: Debian's
#: ClickHouse predates SQL-defined users; README gives the CREATE USER / GRANT of newer ones).
DIAG_USER, DIAG_PASSWORD = "ongrid_diag", "diag-password-for-tests"

_CLICKHOUSE_CONFIG = """<?xml version="1.0"?>
<yandex>
  <logger><level>warning</level><log>{root}/server.log</log><errorlog>{root}/error.log</errorlog>
    <console>0</console></logger>
  <http_port>{http_port}</http_port>
  <tcp_port>{tcp_port}</tcp_port>
  <listen_host>127.0.0.1</listen_host>
  <path>{root}/data/</path>
  <tmp_path>{root}/tmp/</tmp_path>
  <user_files_path>{root}/user_files/</user_files_path>
  <format_schema_path>{root}/format_schemas/</format_schema_path>
  <users_config>{root}/users.xml</users_config>
  <default_profile>default</default_profile>
  <default_database>default</default_database>
  <mark_cache_size>5368709</mark_cache_size>
  <max_concurrent_queries>50</max_concurrent_queries>
  <query_log><database>system</database><table>query_log</table>
    <flush_interval_milliseconds>500</flush_interval_milliseconds></query_log>
</yandex>
"""
_CLICKHOUSE_USERS = """<?xml version="1.0"?>
<yandex>
  <profiles>
    <default><log_queries>1</log_queries></default>
    <diagnostics><readonly>1</readonly><log_queries>1</log_queries></diagnostics>
  </profiles>
  <users>
    <default><password></password><networks><ip>127.0.0.1</ip></networks>
      <profile>default</profile><quota>default</quota></default>
    <{user}><password>{password}</password><networks><ip>127.0.0.1</ip></networks>
      <profile>diagnostics</profile><quota>default</quota>
      <allow_databases><database>system</database></allow_databases></{user}>
  </users>
  <quotas><default></default></quotas>
</yandex>
"""


@dataclass
class ClickHouse(_Server):
    """A ClickHouse server with an unrestricted ``default`` user and :data:`DIAG_USER`."""

    def admin(self, sql: str) -> str:
        """Run ``sql`` as the unrestricted default user (to set up tables)."""
        return self.query(sql, user="default", password="")

    def query(self, sql: str, *, user: str, password: str, readonly: bool = False) -> str:
        url = self.url + ("/?readonly=1" if readonly else "/")
        request = urllib.request.Request(
            url,
            data=sql.encode(),
            headers={"X-ClickHouse-User": user, "X-ClickHouse-Key": password},
        )
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT) as response:
                return str(response.read().decode())
        except urllib.error.HTTPError as exc:
            raise RuntimeError(exc.read().decode(errors="replace")) from None


def start_clickhouse(root: Path) -> ClickHouse:
    """A ClickHouse server on free HTTP and native ports, its data and logs under ``root``."""
    binary = _binary("clickhouse-server", "clickhouse-server")
    http_port, tcp_port = free_port(), free_port()
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.xml").write_text(
        _CLICKHOUSE_CONFIG.format(root=root, http_port=http_port, tcp_port=tcp_port)
    )
    (root / "users.xml").write_text(
        _CLICKHOUSE_USERS.format(user=DIAG_USER, password=DIAG_PASSWORD)
    )
    argv = [binary, f"--config-file={root / 'config.xml'}"]
    server = ClickHouse(
        "clickhouse-server",
        f"http://127.0.0.1:{http_port}",
        _spawn(argv, root),
        root,
        (root / "error.log",),
    )
    server._wait_ready(lambda: _get(server.url + "/ping").strip() == b"Ok.")
    return server


# --- Loki ----------------------------------------------------------------------------------

_LOKI_MISSING = (
    "no Grafana Loki binary: Debian's package named `loki` is an unrelated program (MCMC "
    "linkage analysis), Grafana Loki is not packaged in Debian, and its Go module is AGPL and "
    "not installable here; set ONGRID_LOKI_BIN to a Grafana Loki binary (or put one named "
    "`loki` on PATH) to run the Loki tests"
)

_LOKI_CONFIG = """\
auth_enabled: false
server:
  http_listen_address: 127.0.0.1
  http_listen_port: {http_port}
  grpc_listen_address: 127.0.0.1
  grpc_listen_port: {grpc_port}
  log_level: warn
common:
  instance_addr: 127.0.0.1
  path_prefix: {root}/data
  replication_factor: 1
  ring:
    kvstore:
      store: inmemory
  storage:
    filesystem:
      chunks_directory: {root}/data/chunks
      rules_directory: {root}/data/rules
ingester:
  lifecycler:
    min_ready_duration: 0s
    final_sleep: 0s
schema_config:
  configs:
    - from: 2020-10-24
      store: tsdb
      object_store: filesystem
      schema: v13
      index:
        prefix: index_
        period: 24h
limits_config:
  reject_old_samples: false
  allow_structured_metadata: false
analytics:
  reporting_enabled: false
"""


def find_loki() -> str:
    """The Grafana Loki binary (``ONGRID_LOKI_BIN``, else ``loki`` on ``PATH``), checked by what
    its ``-version`` prints; :class:`BackendMissing` saying why there is none."""
    named = os.environ.get("ONGRID_LOKI_BIN")
    candidate = named or shutil.which("loki")
    if not candidate:
        raise BackendMissing(_LOKI_MISSING)
    try:
        shown = subprocess.run(
            [candidate, "-version"],
            capture_output=True,
            timeout=REQUEST_TIMEOUT,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        banner = (shown.stdout + shown.stderr).decode(errors="replace")
    except (OSError, subprocess.TimeoutExpired) as exc:
        banner = str(exc)
    if "loki, version" not in banner:
        raise BackendMissing(
            f"{candidate} is not Grafana Loki (its -version printed {banner[:200]!r}); "
            + _LOKI_MISSING
        )
    return candidate


@dataclass
class Loki(_Server):
    """A single-binary Grafana Loki keeping its chunks and index under ``root``."""

    def push(self, labels: Mapping[str, str], lines: Sequence[str]) -> None:
        """Push ``lines`` into the stream ``labels`` through ``/loki/api/v1/push``, stamped now
        and one nanosecond apart in the given order (the last line is the newest)."""
        now = time.time_ns() - len(lines)
        values = [[str(now + n), line] for n, line in enumerate(lines)]
        body = json.dumps({"streams": [{"stream": dict(labels), "values": values}]}).encode()
        request = urllib.request.Request(
            self.url + "/loki/api/v1/push",
            data=body,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT):
                pass
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            raise RuntimeError(f"Loki refused the push: HTTP {exc.code} {detail}") from None


def start_loki(root: Path) -> Loki:
    """A Grafana Loki (see :func:`find_loki`) on free HTTP and gRPC ports, ready for pushes."""
    binary = find_loki()
    root.mkdir(parents=True, exist_ok=True)
    http_port, grpc_port = free_port(), free_port()
    config = _LOKI_CONFIG.format(root=root, http_port=http_port, grpc_port=grpc_port)
    (root / "loki.yml").write_text(config, encoding="utf-8")
    argv = [binary, f"-config.file={root / 'loki.yml'}"]
    server = Loki("loki", f"http://127.0.0.1:{http_port}", _spawn(argv, root), root)
    server._wait_ready(lambda: _get(server.url + "/ready").strip() == b"ready")
    return server
