"""The fleet view of the API: ``GET /api/v1/workers`` and the ``fleet`` section of ``/readyz``.

The real app, in-process (TestClient), on Redis database 7 (flushed around each test) and a
SQLite file. The worker reports are written by real :class:`~workers.fleet.FleetReporter`\\ s
from registries read from directories of their own, as worker processes on other hosts would.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis_server
from fastapi.testclient import TestClient

from coordinator.api import create_app
from registry.defaults import build_registry
from registry.settings import Settings, TokenGrant, token_digest
from workers.celery_app import QUEUES
from workers.consumers import QueueAdvertiser
from workers.fleet import FleetReport, FleetReporter, persona_digests
from workers.reload import broadcast_reload

REDIS_URL = redis_server.url(7)
TOKENS = {
    "alice": ("fleet-alice-admin-token-001", "admin"),
    "bob": ("fleet-bob-viewer-token-0002", "viewer"),
}


def persona_file(folder: Path, name: str, body: str = "") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.md").write_text(
        f"---\nname: {name}\ndescription: Persona {name}.\nwhen_to_use: When {name}.\n---\n"
        f"{body or f'# {name}'}\n",
        encoding="utf-8",
    )


def as_user(user: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[user][0]}"}


@pytest.fixture
def r() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def site(tmp_path: Path) -> Path:
    for name in ("reviewer", "triage"):
        persona_file(tmp_path / "agents", name)
    return tmp_path


@pytest.fixture
def client(site: Path, r: redis.Redis) -> Iterator[TestClient]:
    settings = Settings(
        agents_dir=site / "agents",
        marketplace_root=site / "marketplace",
        redis_url=REDIS_URL,
        database_url=f"sqlite:///{site / 'ongrid.db'}",
        data_dir=site / ".ongrid",
        shipped_agents=False,
        token_grants={
            token_digest(t): TokenGrant(user=u, role=rl) for u, (t, rl) in TOKENS.items()
        },
    )
    with TestClient(create_app(settings, console_dist=site / "no-console")) as made:
        yield made


class Host:
    """A worker's registry on a host of its own: an agents directory and the version it is at."""

    def __init__(self, agents: Path, member: str, version: int = 0) -> None:
        # Built as a worker builds its registry: the builtins, then the host's directories.
        settings = Settings(
            agents_dir=agents, marketplace_root=agents.parent / "marketplace", shipped_agents=False
        )
        self.registry = build_registry(settings)
        self.member = member
        self.version = version

    def report(self) -> FleetReport:
        snapshot = self.registry.snapshot()
        return FleetReport(
            member=self.member,
            host="elsewhere",
            pid=4242,
            queues=["ongrid.interactive"],
            registry_version=self.version,
            persona_digest=snapshot.digest,
            personas=persona_digests(snapshot),
        )


@pytest.fixture
def hosts(r: redis.Redis, site: Path) -> Iterator[Callable[..., Host]]:
    reporters: list[FleetReporter] = []

    def start(agents: Path, member: str, version: int = 0) -> Host:
        host = Host(agents, member, version)
        reporter = FleetReporter(r, member, host.report, every=0.1, watch=lambda: host.version)
        reporter.start()
        reporters.append(reporter)
        return host

    yield start
    for reporter in reporters:
        reporter.stop()


def fleet(client: TestClient, user: str = "bob") -> dict[str, Any]:
    response = client.get("/api/v1/workers", headers=as_user(user))
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def workers_of(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {w["member"]: w for w in body["workers"]}


def test_a_worker_whose_disk_personas_differ_is_flagged_naming_them(
    client: TestClient, site: Path, hosts: Callable[..., Host]
):
    for name in ("reviewer", "triage"):  # the same files, another directory
        persona_file(site / "host-a" / "agents", name)
        persona_file(site / "host-b" / "agents", name)
    persona_file(site / "host-b" / "agents", "extra_one")
    hosts(site / "host-a" / "agents", "a@h1 pid 1")
    hosts(site / "host-b" / "agents", "b@h2 pid 2")

    body = fleet(client)

    services = client.app.state.services  # type: ignore[attr-defined]
    assert body["cluster_version"] == 0
    assert body["api"] == {
        "registry_version": 0,
        "persona_digest": services.registry.snapshot().digest,
        "flags": [],
    }
    workers = workers_of(body)
    assert workers["a@h1 pid 1"]["status"] == "ok" and workers["a@h1 pid 1"]["flags"] == []
    odd = workers["b@h2 pid 2"]
    assert odd["status"] == "differs"
    assert odd["flags"] == ["personas differ from the API's at version 0: extra: extra_one"]
    assert set(odd["personas"]) == {"generalist", "reviewer", "triage", "extra_one"}
    assert odd["host"] == "elsewhere" and odd["pid"] == 4242
    assert odd["queues"] == ["ongrid.interactive"]
    assert 0 < odd["started_at"] <= odd["reported_at"]
    assert body["consistent"] is False


def test_a_reload_the_workers_did_not_follow_shows_them_lagging(
    client: TestClient, site: Path, r: redis.Redis, hosts: Callable[..., Host]
):
    host = hosts(site / "agents", "a@h1 pid 1")
    assert fleet(client)["consistent"] is True

    version = broadcast_reload(r)

    body = fleet(client)
    assert body["cluster_version"] == version and body["api"]["registry_version"] == version
    (worker,) = body["workers"]
    assert worker["status"] == "lagging"
    assert worker["flags"][0].startswith(f"registry at version 0, cluster at {version} (reported")

    host.version = version  # the worker reloads: reported at once
    moved = _wait(client, lambda b: b["workers"][0]["registry_version"] == version)
    assert moved["consistent"] is True


def test_an_api_behind_a_worker_is_flagged_on_the_api_entry(
    client: TestClient,
    site: Path,
    r: redis.Redis,
    hosts: Callable[..., Host],
    monkeypatch: pytest.MonkeyPatch,
):
    services = client.app.state.services  # type: ignore[attr-defined]
    monkeypatch.setattr(services.follower, "catch_up", lambda: False)  # missed the broadcast
    version = broadcast_reload(r)
    hosts(site / "agents", "a@h1 pid 1", version=version)

    body = fleet(client)

    assert body["api"]["flags"] == [
        f"API registry at version 0, cluster at {version}",
        f"API registry at version 0 is behind a@h1 pid 1 (version {version})",
    ]
    assert body["workers"][0]["status"] == "ok"
    assert body["consistent"] is False


def test_the_fleet_needs_a_token_and_is_documented(client: TestClient):
    assert client.get("/api/v1/workers").status_code == 401
    assert fleet(client, "alice")["workers"] == []

    spec = client.get("/openapi.json").json()
    answer = spec["paths"]["/api/v1/workers"]["get"]["responses"]["200"]
    assert answer["content"]["application/json"]["schema"]["$ref"].endswith("/FleetOut")
    worker = spec["components"]["schemas"]["WorkerOut"]
    assert worker["properties"]["status"]["enum"] == ["ok", "lagging", "differs"]
    assert {"registry_version", "persona_digest", "personas", "flags"} <= set(worker["properties"])


def test_readyz_lists_flagged_workers_and_stays_ready(
    client: TestClient, site: Path, r: redis.Redis, hosts: Callable[..., Host]
):
    advertiser = QueueAdvertiser(r, "a@h1", lambda: QUEUES.values())
    advertiser.start()
    try:
        persona_file(site / "host-b" / "agents", "reviewer")  # triage is missing there
        hosts(site / "agents", "a@h1 pid 1")
        hosts(site / "host-b" / "agents", "b@h2 pid 2")

        ready = client.get("/readyz")

        assert ready.status_code == 200, ready.text
        body = ready.json()
        assert body["status"] == "ok"
        assert body["fleet"] == {
            "workers": 2,
            "consistent": False,
            "flagged": {
                "b@h2 pid 2": ["personas differ from the API's at version 0: missing: triage"]
            },
            "api": [],
            "error": None,
        }
        assert "fleet" not in body["checks"]
    finally:
        advertiser.stop()


def _wait(client: TestClient, condition: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        body = fleet(client)
        if condition(body):
            return body
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for the fleet to change: {body}")
        time.sleep(0.05)
