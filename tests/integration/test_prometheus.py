"""A real Prometheus server scrapes the API's ``/metrics`` and a worker's metrics port.

Debian's ``prometheus`` (started by the test, scraping every second, its data in the test's
directory) reads both targets; a query for the spawns in flight returns the number the test
holds on a real worker (their model calls held by the fake LLM), then zero once they are let go.
"""

from __future__ import annotations

import shutil
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
from faults import release
from harness import Cluster, Proc, final, wait_for
from procs import free_port, ongrid

from workers.testing.backends import Prometheus, start_prometheus

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PERSONA = "holder"
#: Spawns the test holds in flight at once.
HELD = 3
#: Liveness deadline of a start or of a value to show up in Prometheus (scrapes every second).
DEADLINE = 120.0

pytestmark = pytest.mark.skipif(
    not Path(PROMETHEUS).is_file(),
    reason=f"no Prometheus server at {PROMETHEUS}: install Debian's `prometheus` package",
)


def wait_value(prometheus: Prometheus, promql: str, expected: float) -> None:
    """Until the instant value of ``promql`` is ``expected`` (it scrapes every second)."""

    def equal(result: list[dict[str, Any]]) -> bool:
        return bool(result) and float(result[0]["value"][1]) == expected

    prometheus.wait_for(promql, equal, DEADLINE)


@dataclass
class Targets:
    api: int
    worker: int


@pytest.fixture
def targets(cluster: Cluster) -> Targets:
    """The API (a real ``ongrid api`` process) and a worker serving metrics, both answering."""
    found = Targets(api=free_port(), worker=free_port())
    env = {**cluster.env, "ONGRID_DATABASE_URL": f"sqlite:///{cluster.root / 'ongrid.db'}"}
    cluster.persona(PERSONA, body="# Holder")  # before the worker starts: it loads it then
    api = Proc("api", ongrid("api", f"--port={found.api}"), cluster.root, env)
    cluster.workers.append(api)  # type: ignore[arg-type]  # killed and logged on close
    cluster.start_worker(env={"ONGRID_METRICS_PORT": str(found.worker)})
    wait_for(lambda: _answers(api, found.api), DEADLINE, "the API's /metrics", every=0.2)
    return found


def _answers(proc: Proc, port: int) -> bool:
    assert proc.alive(), proc.log()
    try:
        return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture
def prometheus(cluster: Cluster, targets: Targets) -> Iterator[Prometheus]:
    jobs = {"api": [f"127.0.0.1:{targets.api}"], "worker": [f"127.0.0.1:{targets.worker}"]}
    server = start_prometheus(cluster.root / "prometheus", jobs)
    try:
        yield server
    finally:
        server.stop()


def test_prometheus_scrapes_the_api_and_the_worker(prometheus: Prometheus):
    wait_value(prometheus, 'up{job="api"}', 1)
    wait_value(prometheus, 'up{job="worker"}', 1)
    # The API's own series: the queue depths it read from Redis at the scrape.
    wait_value(prometheus, 'ongrid_queue_depth_up{job="api"}', 1)
    wait_value(prometheus, 'ongrid_queue_depth{job="api",queue="ongrid.interactive"}', 0)


def test_a_query_for_spawns_in_flight_counts_those_held_on_the_worker(
    cluster: Cluster, prometheus: Prometheus
):
    cluster.fake.script([final("Released.", hold="in-flight")])
    spawned = [cluster.client.spawn(PERSONA, f"hold {n}") for n in range(HELD)]
    for n in range(HELD):
        cluster.fake.wait_requests(f"hold {n}", 1)  # each spawn waits on its model call

    wait_value(prometheus, "sum(ongrid_spawns_in_flight)", HELD)
    wait_value(prometheus, f'sum(ongrid_spawns_in_flight{{persona="{PERSONA}"}})', HELD)

    release(cluster.fake, "in-flight")
    for record in spawned:
        cluster.wait_status(record.spawn_id, "ok")
    wait_value(prometheus, "sum(ongrid_spawns_in_flight)", 0)
    wait_value(prometheus, f'sum(ongrid_spawns_finished_total{{persona="{PERSONA}"}})', HELD)


def _free_pair() -> int:
    """A free port whose next one is free too."""
    for _ in range(50):
        port = free_port()
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise AssertionError("no two consecutive free ports")


def test_a_plain_worker_serves_its_coordinator_pool_on_the_next_port(cluster: Cluster):
    port = _free_pair()
    env = {**cluster.env, "ONGRID_METRICS_PORT": str(port)}
    worker = Proc("plain", ongrid("worker", "-c", "2", "--coordinator-slots=1"), cluster.root, env)
    cluster.workers.append(worker)  # type: ignore[arg-type]  # killed and logged on close

    for served in (port, port + 1):
        wait_for(partial(_answers, worker, served), DEADLINE, f"metrics on port {served}")
    pids = {
        _process_pid(httpx.get(f"http://127.0.0.1:{p}/metrics", timeout=30).text)
        for p in (port, port + 1)
    }
    assert len(pids) == 2  # two processes, one port each


def _process_pid(exposition: str) -> str:
    # Any per-process series tells the processes apart: their start times differ.
    return next(ln for ln in exposition.splitlines() if ln.startswith("process_start_time"))


def test_a_metrics_port_in_use_stops_the_worker_naming_the_port_and_the_setting(
    cluster: Cluster,
):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        worker = cluster.start_worker(env={"ONGRID_METRICS_PORT": str(port)}, ready=False)
        wait_for(lambda: not worker.alive(), DEADLINE, "the worker to exit", every=0.2)
    assert worker.proc.returncode != 0
    assert f"cannot serve metrics on 127.0.0.1:{port}" in worker.log()
    assert "ONGRID_METRICS_PORT" in worker.log()
