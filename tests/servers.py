"""Real backend servers for the tests, each started on free local ports in a directory of its own.

A server that is not installed fails the fixture with the command that installs it (``./dev
test`` installs them from Debian's packages); one that does not come up fails with its log.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ClickHouse", "free_port", "start_clickhouse"]

START_TIMEOUT = 60.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


#: The read-only diagnostics user of ``query_clickhouse_system`` (a users.xml profile: Debian's
#: ClickHouse predates SQL-defined users; README gives the CREATE USER / GRANT of newer ones).
DIAG_USER, DIAG_PASSWORD = "ongrid_diag", "diag-password-for-tests"

_CONFIG = """<?xml version="1.0"?>
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
_USERS = """<?xml version="1.0"?>
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
class ClickHouse:
    url: str
    proc: subprocess.Popen[bytes]
    root: Path

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
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.read().decode()
        except urllib.error.HTTPError as exc:
            raise RuntimeError(exc.read().decode(errors="replace")) from None

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start_clickhouse(root: Path) -> ClickHouse:
    binary = shutil.which("clickhouse-server") or shutil.which(
        "clickhouse-server", path="/usr/sbin:/usr/bin"
    )
    if binary is None:
        raise RuntimeError(
            "clickhouse-server is not installed (Debian: apt-get install clickhouse-server); "
            "./dev test installs it"
        )
    http_port, tcp_port = free_port(), free_port()
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.xml").write_text(
        _CONFIG.format(root=root, http_port=http_port, tcp_port=tcp_port)
    )
    (root / "users.xml").write_text(_USERS.format(user=DIAG_USER, password=DIAG_PASSWORD))
    with open(root / "stdout.log", "wb") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen(
            [binary, f"--config-file={root / 'config.xml'}"], stdout=log, stderr=subprocess.STDOUT
        )
    server = ClickHouse(f"http://127.0.0.1:{http_port}", proc, root)
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        try:
            with urllib.request.urlopen(server.url + "/ping", timeout=2) as response:
                if response.read().strip() == b"Ok.":
                    return server
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            server.stop()
            logs = "".join(
                p.read_text(errors="replace")[-2000:]
                for p in (root / "stdout.log", root / "error.log")
                if p.exists()
            )
            raise RuntimeError(f"clickhouse-server did not come up on {server.url}:\n{logs}")
        time.sleep(0.2)
