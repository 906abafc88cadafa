"""The fleet view across real processes: an ``ongrid api`` process and two ``ongrid worker``
processes whose agents directories differ by one persona, as two hosts deployed apart would.

``GET /api/v1/workers`` flags the worker that differs, naming the persona, while ``/readyz``
stays ready; a reload broadcast moves every process's registry version; a worker that is killed
leaves the list once its report expires, one stopped cleanly withdraws it.

Redis database 8 (flushed before and after), a SQLite file shared by the three processes.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import redis_server
import yaml
from harness import Cluster, FakeLLM, Proc, Worker, wait_for
from procs import api_client, free_port, ongrid

REDIS_URL = redis_server.url(8)
TOKEN = "fleet-tests-admin-token-000001"
#: Liveness deadline of one HTTP request, and of a condition the processes reach on their own.
DEADLINE = 120.0


@dataclass
class Site:
    cluster: Cluster
    env: dict[str, str]
    api: httpx.Client

    def fleet(self) -> dict[str, Any]:
        response = self.api.get("/api/v1/workers")
        assert response.status_code == 200, response.text
        return response.json()  # type: ignore[no-any-return]

    def wait_fleet(self, condition: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            body = self.fleet()
            return body if condition(body) else None

        return wait_for(reached, DEADLINE, what, every=0.2)


def _failed(request: pytest.FixtureRequest) -> bool:
    reports = (getattr(request.node, f"rep_{when}", None) for when in ("setup", "call"))
    return any(r is not None and r.failed for r in reports)


@pytest.fixture
def site(tmp_path: Path, fake: FakeLLM, request: pytest.FixtureRequest) -> Iterator[Site]:
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    root = tmp_path / "site"
    root.mkdir()
    cluster = Cluster(root, fake, REDIS_URL)
    for name in ("reviewer", "triage"):  # before the API reads its registry
        cluster.persona(name)
    config = root / "ongrid.yaml"
    config.write_text(
        yaml.safe_dump({"auth": {"tokens": {TOKEN: {"user": "alice", "role": "admin"}}}})
    )
    env = {
        **cluster.env,
        "ONGRID_CONFIG": str(config),
        "ONGRID_DATABASE_URL": f"sqlite:///{root / 'ongrid.db'}",
        # A killed worker leaves the fleet within 4 s, not the production 10 (test_fleet.py of
        # the workers holds that default).
        "ONGRID_PRESENCE_TTL_SECONDS": "4",
    }
    port = free_port()
    api = Proc("api", ongrid("api", f"--port={port}"), root, env, forked=True)
    cluster.workers.append(api)  # type: ignore[arg-type]  # killed and logged on close
    try:
        http = api_client(api, port, TOKEN, DEADLINE)
    except BaseException:
        cluster.close(True)
        client.close()
        raise
    yield Site(cluster, env, http)
    http.close()
    cluster.close(_failed(request))
    client.flushdb()
    client.close()


def _member_of(body: dict[str, Any], name: str, worker: Worker) -> dict[str, Any]:
    (found,) = [
        w
        for w in body["workers"]
        if w["member"].startswith(f"{name}@") and w["member"].endswith(f" pid {worker.pid}")
    ]
    return found  # type: ignore[no-any-return]


def test_the_fleet_flags_a_host_that_differs_follows_reloads_and_drops_the_dead(site: Site):
    cluster = site.cluster
    other_host = cluster.root / "agents-b"
    shutil.copytree(cluster.agents, other_host)
    (other_host / "extra_one.md").write_text(
        (cluster.agents / "triage.md").read_text().replace("triage", "extra_one")
    )
    a = cluster.start_worker(
        "a", queues="ongrid.interactive,ongrid.background", ready=False, env=site.env
    )
    b = cluster.start_worker(
        "coordinator",
        queues="ongrid.coordinator",
        ready=False,
        env={**site.env, "ONGRID_AGENTS_DIR": str(other_host)},
    )
    a.wait_ready()
    b.wait_ready()

    body = site.wait_fleet(lambda f: len(f["workers"]) == 2, "both workers in the fleet")

    assert body["cluster_version"] == 0 and body["api"]["registry_version"] == 0
    same, odd = _member_of(body, "a", a), _member_of(body, "coordinator", b)
    assert same["status"] == "ok" and same["flags"] == [], body
    assert same["persona_digest"] == body["api"]["persona_digest"]
    assert same["queues"] == ["ongrid.background", "ongrid.interactive"]
    assert odd["status"] == "differs"
    assert odd["flags"] == ["personas differ from the API's at version 0: extra: extra_one"]
    assert odd["queues"] == ["ongrid.coordinator"] and odd["pid"] == b.pid
    assert body["consistent"] is False

    ready = site.api.get("/readyz")
    assert ready.status_code == 200, ready.text  # a host that differs still answers chats
    assert ready.json()["fleet"]["flagged"] == {odd["member"]: odd["flags"]}

    # The persona is deployed to the API's host too, and the reload broadcast.
    shutil.copy(other_host / "extra_one.md", cluster.agents / "extra_one.md")
    reloaded = site.api.post("/api/v1/agents/reload")
    assert reloaded.status_code == 200, reloaded.text
    version = reloaded.json()["registry_version"]
    body = site.wait_fleet(
        lambda f: (
            all(w["registry_version"] == version for w in f["workers"])
            and f["api"]["registry_version"] == version
        ),
        f"every process at registry version {version}",
    )
    assert body["cluster_version"] == version
    assert [w["status"] for w in body["workers"]] == ["ok", "ok"]
    assert body["consistent"] is True

    b.kill()  # no withdrawal: its report expires
    body = site.wait_fleet(
        lambda f: [w["member"] for w in f["workers"]] == [same["member"]],
        "the killed worker to leave the fleet",
    )
    assert body["consistent"] is True

    a.stop()  # a clean shutdown withdraws the report: gone at once, not after the TTL
    assert a.proc.returncode is not None
    assert site.fleet()["workers"] == []
