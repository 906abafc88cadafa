"""The HTTP API over real HTTP: uvicorn on a free port, real Redis, a real database, real workers.

- Redis: database 11, flushed before and after each test.
- Database: a SQLite file per test; the persona CRUD tests also run on PostgreSQL (a fresh database
  per test on the server in ``ONGRID_TEST_POSTGRES_URL``, skipped when it does not answer).
- Spawns: a ``python -m coordinator worker`` process per test that needs one, with the fake
  OpenAI server (:mod:`workers.testing.fake_openai`, one per module, rules set per test) as its
  model. Its log is printed when the test fails.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import redis
import redis_server
import yaml
from postgres import fresh_database
from servers import AppServer

from coordinator.api import create_app
from coordinator.storage.engine import make_engine, upgrade
from registry.settings import Settings, TokenGrant, token_digest
from workers.loop import Approval, LoopState, approval_hash
from workers.messages import Message, ToolCall
from workers.spawns import SpawnRecord
from workers.testing.fake_openai import start_subprocess

REDIS_URL = redis_server.url(11)
#: The spawn tests' database: flushed around the module (its worker outlives each test).
WORKER_REDIS_URL = redis_server.url(10)
MODEL = "openai/gpt-4o-mini"
#: Tokens of the test's users: alice and carol are admins, dave an operator, bob a viewer.
TOKENS = {
    "alice": ("alice-admin-token-0000001", "admin"),
    "carol": ("carol-admin-token-0000003", "admin"),
    "dave": ("dave-operator-token-000004", "operator"),
    "bob": ("bob-viewer-token-00000002", "viewer"),
}
WORKER_START = 90.0
T = TypeVar("T")


def migrate(url: str) -> None:
    engine = make_engine(url)
    try:
        upgrade(engine)
    finally:
        engine.dispose()


def wait_for(predicate: Callable[[], T], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.05)


# -- SSE -------------------------------------------------------------------------------------------


def sse(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """The SSE messages of a streaming response: ``{"id", "event", "data"}`` each."""
    fields: dict[str, str] = {}
    for line in response.iter_lines():
        if not line:
            if "data" in fields:
                yield {
                    "id": int(fields["id"]),
                    "event": fields["event"],
                    "data": json.loads(fields["data"]),
                }
            fields = {}
        elif not line.startswith(":"):
            key, _, value = line.partition(":")
            fields[key] = value.removeprefix(" ")


def read_all(response: httpx.Response) -> list[dict[str, Any]]:
    assert response.status_code == 200, response.read()
    assert response.headers["content-type"].startswith("text/event-stream")
    return list(sse(response))


def text_of(events: list[dict[str, Any]]) -> str:
    return "".join(e["data"]["text"] for e in events if e["event"] == "text")


# -- the fake model ------------------------------------------------------------------------------


class Fake:
    def __init__(self) -> None:
        self.proc, self.base_url = start_subprocess(None)
        self.root = self.base_url.removesuffix("/v1")

    def script(self, rules: list[dict[str, Any]]) -> None:
        httpx.post(f"{self.root}/_reset", timeout=10).raise_for_status()
        httpx.post(f"{self.root}/_script", json=rules, timeout=10).raise_for_status()

    def requests(self) -> list[dict[str, Any]]:
        return httpx.get(f"{self.root}/_requests", timeout=10).json()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def first_user(request: dict[str, Any]) -> str:
    return next(str(m["content"]) for m in request["messages"] if m["role"] == "user")


def system_of(request: dict[str, Any]) -> str:
    return str(request["messages"][0]["content"])


@pytest.fixture(scope="module")
def fake() -> Iterator[Fake]:
    server = Fake()
    yield server
    server.stop()


# -- the site: Redis, database, agents directory ---------------------------------------------------


@pytest.fixture
def redis_db() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ongrid.db'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def any_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ongrid.db'}"
        return
    admin, reason = request.getfixturevalue("postgres_admin")
    if admin is None:
        pytest.skip(reason)
    with fresh_database(admin, "ongrid_api") as url:
        yield url


class Site:
    """A working directory with ``agents/`` and ``marketplace/``, shared by the API and workers."""

    def __init__(self, root: Path, db_url: str, redis_url: str = REDIS_URL) -> None:
        self.root, self.db_url, self.redis_url = root, db_url, redis_url
        self.agents = root / "agents"
        self.marketplace = root / "marketplace"
        self.agents.mkdir(parents=True)
        self.marketplace.mkdir()

    def persona(self, name: str, body: str = "", **fields: Any) -> Path:
        front = {
            "name": name,
            "description": f"Test persona {name}.",
            "when_to_use": f"When a test needs {name}.",
            "model": MODEL,
            **fields,
        }
        path = self.agents / f"{name}.md"
        text = f"---\n{yaml.safe_dump(front, sort_keys=False)}---\n{body or f'# {name}'}\n"
        path.write_text(text, encoding="utf-8")
        return path

    def settings(self, **overrides: Any) -> Settings:
        grants = {token_digest(t): TokenGrant(user=u, role=r) for u, (t, r) in TOKENS.items()}
        values: dict[str, Any] = {
            "agents_dir": self.agents,
            "marketplace_root": self.marketplace,
            "redis_url": self.redis_url,
            "database_url": self.db_url,
            "data_dir": self.root / ".ongrid",
            "token_grants": grants,
        }
        return Settings(**{**values, **overrides})


# -- the API server --------------------------------------------------------------------------------


class Api:
    """The app under uvicorn in a thread, on a free port."""

    def __init__(self, settings: Settings) -> None:
        self.app = create_app(settings)
        self.services = self.app.state.services
        self._http = AppServer(self.app)
        self.base_url = self._http.base_url
        self._clients: list[httpx.Client] = []

    def client(self, user: str | None = "alice", token: str | None = None) -> httpx.Client:
        headers = {}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        elif user is not None:
            headers["Authorization"] = f"Bearer {TOKENS[user][0]}"
        made = httpx.Client(base_url=self.base_url, headers=headers, timeout=60)
        self._clients.append(made)
        return made

    def close(self) -> None:
        for made in self._clients:
            made.close()
        self._http.stop()


@pytest.fixture
def site(tmp_path: Path, sqlite_url: str) -> Site:
    return Site(tmp_path / "site", sqlite_url)


@pytest.fixture
def api(site: Site, redis_db: redis.Redis) -> Iterator[Api]:
    server = Api(site.settings())
    yield server
    server.close()


# -- workers ---------------------------------------------------------------------------------------


class Worker:
    QUEUES = "ongrid.interactive,ongrid.background,ongrid.coordinator"

    def __init__(self, site: Site, fake: Fake) -> None:
        self.log_path = site.root / f"worker-{time.monotonic_ns()}.log"
        dropped = ("ONGRID_", "OPENAI_", "ANTHROPIC_", "REDIS_", "LITELLM_", "CELERY", "FAKE_")
        env = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
        env.update(
            REDIS_URL=site.redis_url,
            ONGRID_DATABASE_URL=site.db_url,
            ONGRID_MARKETPLACE_ROOT=str(site.marketplace),
            ONGRID_DEFAULT_PROVIDER="openai",
            ONGRID_DEFAULT_MODEL=MODEL,
            OPENAI_API_BASE=fake.base_url,
            OPENAI_API_KEY="sk-test",
            PYTHONUNBUFFERED="1",
        )
        argv = [sys.executable, "-m", "coordinator", "worker", "-c", "8", "--loglevel=INFO"]
        argv.append(f"--queues={self.QUEUES}")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                argv, cwd=site.root, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        wait_for(
            lambda: " ready." in self.log() or self.proc.poll() is not None,
            WORKER_START,
            "the worker to be ready",
        )
        assert self.proc.poll() is None, self.log()

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


class Cluster:
    """One worker for the module's spawn tests (a worker's first spawn imports litellm, ~10 s),
    its site (agents directory, SQLite file) and its own Redis database."""

    def __init__(self, root: Path, fake: Fake) -> None:
        self.redis = redis.Redis.from_url(WORKER_REDIS_URL)
        self.redis.flushdb()
        self.fake = fake
        self.site = Site(root, f"sqlite:///{root / 'ongrid.db'}", WORKER_REDIS_URL)
        self.site.persona("warm_up")
        migrate(self.site.db_url)  # as a deployment does before its workers start
        self.worker = Worker(self.site, fake)
        try:
            self._warm_up()
        except BaseException:
            print(self.worker.log())
            self.close()
            raise

    def _warm_up(self) -> None:
        from workers.client import SpawnClient

        client = SpawnClient(self.site.settings())
        try:
            record = client.spawn("warm_up", "warm up")
            done = client.wait(record.spawn_id, timeout=WORKER_START)
            assert done.status == "ok", done.error
        finally:
            client.redis.close()

    def close(self) -> None:
        self.worker.stop()
        self.redis.flushdb()
        self.redis.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, fake: Fake) -> Iterator[Cluster]:
    made = Cluster(tmp_path_factory.mktemp("cluster") / "site", fake)
    yield made
    made.close()


@pytest.fixture
def spawning(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[Api]:
    """An API on the cluster's site; the worker's log is printed if the test fails."""
    server = Api(cluster.site.settings())
    start = len(cluster.worker.log())
    yield server
    server.close()
    reports = (getattr(request.node, f"rep_{when}", None) for when in ("setup", "call"))
    if any(r is not None and r.failed for r in reports):
        print(f"\n===== worker log =====\n{cluster.worker.log()[start:]}")


def error_of(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"} and {"code", "message", "details"} <= set(body["error"])
    return body["error"]


# == health ========================================================================================


def test_healthz_and_readyz(spawning: Api, cluster: Cluster):
    anonymous = spawning.client(user=None)
    assert anonymous.get("/healthz").json() == {"status": "ok"}
    ready = anonymous.get("/readyz")
    assert ready.status_code == 200, ready.text
    queues = Worker.QUEUES.split(",")  # each served by the cluster's worker
    body = ready.json()
    assert body["status"] == "ok"
    assert body["checks"] == {"redis": "ok", "database": "ok", **dict.fromkeys(queues, "ok")}
    assert set(body["queues"]) == set(queues)
    for queue in body["queues"].values():
        assert queue["consumers"] == len(queue["workers"])
        assert any(w.endswith(f" pid {cluster.worker.proc.pid}") for w in queue["workers"])


def test_readyz_503_when_the_database_is_down(site: Site, redis_db: redis.Redis):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]
    server = Api(site.settings(database_url=f"postgresql://postgres@127.0.0.1:{dead}/test"))
    try:
        client = server.client()
        ready = client.get("/readyz")
        assert ready.status_code == 503
        body = ready.json()
        assert body["status"] == "unavailable" and body["checks"]["redis"] == "ok"
        assert f"127.0.0.1:{dead}" in body["checks"]["database"]
        assert "unreachable" in body["checks"]["database"]
        # The API still serves what needs no database, and says why the rest fails.
        assert "generalist" in [a["name"] for a in client.get("/api/v1/agents").json()]
        warnings = client.get("/api/v1/agents/warnings").json()
        assert any("user personas could not be read" in w["reason"] for w in warnings)
        sessions = client.get("/api/v1/chat/sessions")
        assert sessions.status_code == 503
        assert error_of(sessions)["code"] == "database_unavailable"
    finally:
        server.close()


# == auth and bad input ============================================================================


def test_auth_rules(api: Api):
    anonymous = api.client(user=None)
    missing = anonymous.get("/api/v1/agents")
    assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
    assert error_of(missing)["code"] == "unauthorized"
    bad = api.client(token="not-a-token-anybody-has")
    refused = bad.get("/api/v1/agents")
    assert refused.status_code == 401
    assert refused.headers["www-authenticate"] == 'Bearer error="invalid_token"'
    assert "not-a-token" not in refused.text
    assert api.client(user=None).post("/v1/agents/custom", json={}).status_code == 401

    viewer = api.client("bob")
    assert viewer.get("/api/v1/agents").status_code == 200
    persona = {"name": "x_agent", "description": "d", "when_to_use": "w"}
    for response in (
        viewer.post("/v1/agents/custom", json=persona),
        viewer.patch("/v1/agents/custom/generalist", json={"description": "x"}),
        viewer.delete("/v1/agents/custom/generalist"),
        viewer.post("/api/v1/agents/reload"),
        viewer.post(
            "/api/v1/spawns/abc/decisions",
            json={"call_id": "c", "args_hash": "h", "approve": True},
        ),
    ):
        assert response.status_code == 403, response.text
        assert "viewer" in error_of(response)["message"]
    assert api.client().get("/api/v1/agents/x_agent").status_code == 404  # nothing was made


def test_another_users_session_and_spawn_are_404(api: Api):
    services = api.services
    session_id = services.chats.create_session("alice", "alice's")
    services.chats.add_message(session_id, "user", "hello", spawn_id="s1")
    record = SpawnRecord(session_id=session_id, persona="generalist", prompt="hello", user="alice")
    services.client.store.create(record)
    alice, bob = api.client("alice"), api.client("bob")
    assert alice.get(f"/api/v1/chat/sessions/{session_id}").status_code == 200
    assert alice.get(f"/api/v1/spawns/{record.spawn_id}").json()["status"] == "queued"
    for response in (
        bob.get(f"/api/v1/chat/sessions/{session_id}"),
        bob.get(f"/api/v1/chat/sessions/{session_id}/events"),
        bob.post(f"/api/v1/chat/sessions/{session_id}/messages", json={"content": "hi"}),
        bob.post(f"/api/v1/chat/sessions/{session_id}/spawns/{record.spawn_id}/cancel"),
        bob.get(f"/api/v1/spawns/{record.spawn_id}"),
        alice.get("/api/v1/chat/sessions/no-such-session"),
    ):
        assert response.status_code == 404, response.text
        assert error_of(response)["code"] == "not_found"
    assert bob.get("/api/v1/chat/sessions").json() == []
    assert [s["id"] for s in alice.get("/api/v1/chat/sessions").json()] == [session_id]


def _waiting_spawn(api: Api, owner: str) -> SpawnRecord:
    """A spawn of ``owner`` parked on a write call, as a worker leaves it."""
    call = ToolCall(id="call_restart_1", name="host_restart_service", arguments='{"unit": "nginx"}')
    record_id = uuid.uuid4().hex
    record = SpawnRecord(
        session_id=uuid.uuid4().hex,
        persona="restarter",
        prompt="restart nginx",
        user=owner,
        status="waiting",
        state=LoopState(
            messages=[Message(role="assistant", content="", tool_calls=[call])],
            pending=[call],
            approvals={call.id: Approval(args_hash=approval_hash(record_id, call))},
        ),
        spawn_id=record_id,
    )
    api.services.client.store.create(record)
    return record


@pytest.fixture
def approvers_api(site: Site, redis_db: redis.Redis) -> Iterator[Api]:
    """Carol approves alice's calls; dave (an operator, who may approve) is nobody's approver."""
    server = Api(site.settings(approvers={"alice": ["carol"]}))
    yield server
    server.close()


def test_only_the_owner_and_their_approvers_see_and_decide(approvers_api: Api):
    record = _waiting_spawn(approvers_api, "alice")
    url = f"/api/v1/spawns/{record.spawn_id}"
    args_hash = approval_hash(record.spawn_id, record.state.pending[0])  # type: ignore[union-attr]
    decision = {"call_id": "call_restart_1", "args_hash": args_hash, "approve": True}
    dave = approvers_api.client("dave")
    missing = dave.post("/api/v1/spawns/no-such-spawn/decisions", json=decision)
    assert missing.status_code == 404
    for response in (  # every way in answers like a spawn that does not exist
        dave.get(url),
        dave.post(f"{url}/decisions", json=decision),
        dave.post(f"{url}/decisions", json={**decision, "call_id": "guess"}),
    ):
        assert response.status_code == 404, response.text
        assert error_of(response)["code"] == "not_found"
        assert "call_restart_1" not in response.text and "nginx" not in response.text
    assert dave.get("/api/v1/approvals").json() == []
    carol = approvers_api.client("carol")
    (pending,) = carol.get("/api/v1/approvals").json()
    assert pending["spawn_id"] == record.spawn_id and pending["owner"] == "alice"
    assert pending["call"] == {
        "id": "call_restart_1",
        "name": "host_restart_service",
        "arguments": '{"unit": "nginx"}',
    }
    assert carol.get(url).status_code == 200
    decided = carol.post(f"{url}/decisions", json=decision)
    assert decided.status_code == 200, decided.text
    assert decided.json()["call"]["arguments"] == '{"unit": "nginx"}'
    assert decided.json()["approvals"]["call_restart_1"]["approved_by"] == ["carol"]
    assert approvers_api.client("bob").get("/api/v1/approvals").json() == []


def test_a_context_too_deep_or_too_big_is_422_and_starts_nothing(api: Api):
    client = api.client()
    deep: dict[str, Any] = {"leaf": 1}
    for _ in range(300):
        deep = {"d": deep}
    too_deep = client.post(
        "/api/v1/chat", json={"prompt": "hi", "agent": "generalist", "context": deep}
    )
    assert too_deep.status_code == 422, too_deep.text
    assert "deeper than 8 levels" in error_of(too_deep)["message"]
    big = {"blob": "x" * 20_000}
    too_big = client.post(
        "/api/v1/chat", json={"prompt": "hi", "agent": "generalist", "context": big}
    )
    assert too_big.status_code == 422 and "bytes as JSON" in error_of(too_big)["message"]
    assert client.get("/api/v1/chat/sessions").json() == []


def test_bad_bodies_get_clear_4xx_and_change_nothing(api: Api):
    client = api.client()
    big = client.post("/api/v1/chat", json={"prompt": "x" * (300 * 1024)})
    assert big.status_code == 413 and error_of(big)["code"] == "payload_too_large"
    chunked = client.post(
        "/v1/agents/custom",
        content=iter([b'{"name": "big", "body": "', b"y" * (300 * 1024), b'"}']),
        headers={"Content-Type": "application/json"},
    )
    assert chunked.status_code == 413
    malformed = client.post(
        "/api/v1/chat", content=b'{"prompt": ', headers={"Content-Type": "application/json"}
    )
    assert malformed.status_code == 422
    assert "malformed JSON" in error_of(malformed)["message"]
    unknown = client.post("/api/v1/chat", json={"prompt": "hi", "colour": "red"})
    assert unknown.status_code == 422
    assert error_of(unknown)["details"]["problems"][0]["field"] == "colour"
    wrong_type = client.post("/api/v1/chat", json={"prompt": ["hi"]})
    assert wrong_type.status_code == 422
    nul = client.post("/api/v1/chat", json={"prompt": "a\u0000b"})
    assert nul.status_code == 422 and "NUL" in error_of(nul)["message"]
    assert client.get("/api/v1/chat/sessions").json() == []
    not_json = client.post("/api/v1/chat", content=b"prompt=hi")
    assert not_json.status_code == 422
    assert client.get("/no/such/route").status_code == 404
    assert error_of(client.put("/api/v1/agents")).get("code") == "method_not_allowed"
    bad_header = client.get("/api/v1/chat/sessions/x/events", headers={"Last-Event-ID": "soon"})
    assert bad_header.status_code in (404, 422)


def test_unknown_or_unavailable_agent_starts_nothing(api: Api, site: Site):
    site.persona("gated_agent", metadata={"requires": {"bins": ["no-such-binary-ongrid-test"]}})
    client = api.client()
    client.post("/api/v1/agents/reload").raise_for_status()
    unknown = client.post("/api/v1/chat", json={"prompt": "hi", "agent": "nobody"})
    assert unknown.status_code == 404
    details = error_of(unknown)["details"]
    assert details["name"] == "nobody" and "generalist" in details["choices"]
    gated = client.post("/api/v1/chat", json={"prompt": "hi", "agent": "gated_agent"})
    assert gated.status_code == 409
    assert "no-such-binary-ongrid-test" in error_of(gated)["message"]
    assert client.get("/api/v1/chat/sessions").json() == []
    listed = {a["name"]: a for a in client.get("/api/v1/agents").json()}
    assert listed["gated_agent"]["available"] is False
    assert "no-such-binary" in listed["gated_agent"]["unavailable_reason"]


# == agents ========================================================================================


def _persona(name: str, **fields: Any) -> dict[str, Any]:
    return {
        "name": name,
        "description": f"{name} description",
        "when_to_use": f"When {name} fits.\nSecond line.",
        "model": MODEL,
        "body": f"# {name}\n\nYou are {name}.\n",
        **fields,
    }


@pytest.fixture
def any_db_api(tmp_path: Path, any_db_url: str, redis_db: redis.Redis) -> Iterator[Api]:
    site = Site(tmp_path / "site", any_db_url)
    site.persona("disk_doctor", body="# Disk doctor (from disk)")
    server = Api(site.settings())
    yield server
    server.close()


def test_custom_persona_lifecycle(any_db_api: Api, redis_db: redis.Redis):
    client = any_db_api.client()
    version = int(redis_db.get("ongrid:registry:version") or 0)
    created = client.post(
        "/v1/agents/custom", json=_persona("net_checker", effort="high", tools="query_*, bash")
    )
    assert created.status_code == 201, created.text
    body = created.json()
    assert (body["source"], body["shadows"], body["notice"]) == ("user", None, None)
    assert body["tools"] == ["query_*", "bash"] and body["unknown_fields"] == {"effort": "high"}
    assert body["registry_version"] == version + 1 == int(redis_db.get("ongrid:registry:version"))
    assert created.headers["location"] == "/api/v1/agents/net_checker"
    assert (
        client.get("/api/v1/agents/net_checker").json()["body"]
        == "# net_checker\n\nYou are net_checker.\n"
    )

    again = client.post("/v1/agents/custom", json=_persona("net_checker"))
    assert again.status_code == 409 and "PATCH" in error_of(again)["message"]

    patched = client.patch(
        "/v1/agents/custom/net_checker", json={"description": "v2", "max_turns": 3, "model": None}
    )
    assert patched.status_code == 200, patched.text
    assert (patched.json()["description"], patched.json()["max_turns"]) == ("v2", 3)
    assert patched.json()["model"] == "" and patched.json()["unknown_fields"] == {"effort": "high"}
    renamed = client.patch("/v1/agents/custom/net_checker", json={"name": "other"})
    assert renamed.status_code == 422
    assert error_of(renamed)["details"]["problems"][0]["field"] == "name"
    nulled = client.patch("/v1/agents/custom/net_checker", json={"description": None})
    assert nulled.status_code == 422
    missing = client.patch("/v1/agents/custom/nobody", json={"description": "x"})
    assert missing.status_code == 404 and "net_checker" in error_of(missing)["details"]["choices"]

    assert client.delete("/v1/agents/custom/net_checker").status_code == 204
    assert client.get("/api/v1/agents/net_checker").status_code == 404
    assert client.delete("/v1/agents/custom/net_checker").status_code == 404


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"name": "Bad Name"}, "name"),
        ({"permission_mode": "yolo"}, "permission_mode"),
        ({"max_turns": -1}, "max_turns"),
        ({"metadata": {"os": 3}}, "metadata.os"),
        ({"initial_prompt": "{{range .x}}{{end}}"}, "initial_prompt"),
        ({"source": "builtin"}, ""),
        ({"description": "   "}, "description"),
    ],
)
def test_invalid_persona_is_422_naming_the_field_and_changes_nothing(
    api: Api, change: dict[str, Any], field: str
):
    client = api.client()
    before = client.get("/api/v1/agents").json()
    response = client.post("/v1/agents/custom", json={**_persona("fine_name"), **change})
    assert response.status_code == 422, response.text
    problems = error_of(response)["details"]["problems"]
    assert field in [p["field"] for p in problems], problems
    assert client.get("/api/v1/agents").json() == before


def test_builtin_and_disk_personas_are_read_only_and_shadowed_by_name(any_db_api: Api):
    client = any_db_api.client()
    for name, words in (("generalist", "builtin"), ("disk_doctor", "disk persona")):
        for response in (
            client.patch(f"/v1/agents/custom/{name}", json={"description": "x"}),
            client.delete(f"/v1/agents/custom/{name}"),
        ):
            assert response.status_code == 409, response.text
            error = error_of(response)
            assert error["code"] == "read_only" and words in error["message"]
            assert "user persona with the same name" in error["message"]
    disk = client.get("/api/v1/agents/disk_doctor").json()
    assert disk["source"] == "disk" and disk["path"].endswith("disk_doctor.md")

    shadow = client.post("/v1/agents/custom", json=_persona("disk_doctor"))
    assert shadow.status_code == 201, shadow.text
    assert (
        shadow.json()["shadows"] == "disk" and "shadows the disk persona" in shadow.json()["notice"]
    )
    now = client.get("/api/v1/agents/disk_doctor").json()
    assert (now["source"], now["shadows"], now["body"]) == (
        "user",
        "disk",
        "# disk_doctor\n\nYou are disk_doctor.\n",
    )
    builtin_override = client.post("/v1/agents/custom", json=_persona("generalist"))
    assert builtin_override.json()["shadows"] == "builtin"

    assert client.delete("/v1/agents/custom/disk_doctor").status_code == 204
    restored = client.get("/api/v1/agents/disk_doctor").json()
    assert restored["source"] == "disk" and restored["body"].startswith("# Disk doctor (from disk)")


def test_warnings_and_reload(api: Api, site: Site, redis_db: redis.Redis):
    client = api.client()
    (site.agents / "broken.md").write_text("no frontmatter here\n")
    site.persona("late_arrival")
    assert client.get("/api/v1/agents/late_arrival").status_code == 404
    reloaded = client.post("/api/v1/agents/reload")
    assert reloaded.status_code == 200
    assert reloaded.json()["registry_version"] == int(redis_db.get("ongrid:registry:version"))
    assert client.get("/api/v1/agents/late_arrival").json()["source"] == "disk"
    warnings = client.get("/api/v1/agents/warnings").json()
    loads = [w for w in warnings if w["kind"] == "load"]
    assert [w["path"] for w in loads] == [str(site.agents / "broken.md")]
    assert "frontmatter" in loads[0]["reason"] and warnings[0] == loads[0]


def test_warnings_hold_the_lint_findings_by_kind(api: Api, site: Site):
    typo_path = site.persona("typo", tools=["host_probe", "query_promq"])
    site.persona("disk_twin", tools=["host_probe"], when_to_use="When disks fill up.")
    site.persona("disk_copy", tools=["host_probe"], when_to_use="when disks FILL up!")
    api.client().post("/api/v1/agents/reload").raise_for_status()
    warnings = api.client("bob").get("/api/v1/agents/warnings").json()  # any caller may read
    by_persona: dict[str, list[tuple[str, str]]] = {}
    for w in warnings:
        by_persona.setdefault(w["persona"], []).append((w["kind"], w["subject"]))
    assert by_persona["typo"] == [("unknown_tool", "query_promq")]
    assert by_persona["disk_twin"] == [("when_to_use_collision", "disk_copy")]
    assert by_persona["disk_copy"] == [("when_to_use_collision", "disk_twin")]
    [typo] = [w for w in warnings if w["persona"] == "typo"]
    assert typo["path"] == str(typo_path) and typo["source"] == "disk"
    assert typo["hint"] == "did you mean 'query_promql'?" and "query_promq" in typo["reason"]
    # The site's settings name no Prometheus: the shipped disk_specialist cannot query it.
    assert ("missing_config", "prometheus_url") in by_persona["disk_specialist"]
    assert "" not in by_persona  # no load problem


def test_a_reload_broadcast_elsewhere_reaches_this_api(api: Api, site: Site):
    from workers.reload import broadcast_reload

    site.persona("seen_after_broadcast")
    assert api.client().get("/api/v1/agents/seen_after_broadcast").status_code == 404
    broadcast_reload(api.services.client.redis)  # e.g. `ongrid agents reload` on another host
    assert api.client().get("/api/v1/agents/seen_after_broadcast").status_code == 200


def test_skills_by_role_and_by_agent(api: Api, site: Site):
    site.persona(
        "fixer",
        tools=["host_*", "query_promql", "no_such_tool"],
        permission_mode="mutating-with-confirm",
    )
    api.client().post("/api/v1/agents/reload").raise_for_status()
    admin = api.client().get("/api/v1/skills").json()
    names = {t["name"]: t for t in admin["tools"]}
    assert admin["role"] == "admin" and "spawn_agent" not in names
    assert names["host_reboot"]["class"] == "destructive" and names["bash"]["class"] == "read"
    viewer = api.client("bob").get("/api/v1/skills").json()
    assert {t["name"] for t in viewer["tools"]} <= {
        n for n in names if n.startswith(("query_", "search_", "find_", "expand_", "get_"))
    } | {"host_probe", "read_repo", "load_skill", "read_file_skill"}
    assert "bash" not in {t["name"] for t in viewer["tools"]}

    bag = api.client().get("/api/v1/skills", params={"agent": "fixer"}).json()
    entries = {t["name"]: t["confirmation"] for t in bag["tools"]}
    assert bag["agent"] == "fixer"
    assert entries["host_probe"] == "none" and entries["host_restart_service"] == "once"
    assert "host_reboot" not in entries
    dropped = {d["name"]: d["reason"] for d in bag["dropped"]}
    assert "permission_mode" in dropped["host_reboot"] and "catalog" in dropped["no_such_tool"]
    unknown = api.client().get("/api/v1/skills", params={"agent": "nobody"})
    assert unknown.status_code == 404 and "fixer" in error_of(unknown)["details"]["choices"]


# == spawns through a real worker ==================================================================


def _reload(api: Api) -> httpx.Client:
    client = api.client()
    client.post("/api/v1/agents/reload").raise_for_status()
    return client


def test_direct_spawn_with_context_streams_the_turn_and_keeps_history(
    spawning: Api, cluster: Cluster
):
    cluster.site.persona(
        "incident_investigator",
        body="# Incident investigator",
        initial_prompt="Investigating incident {{.incident_id}} on device {{.device_id}}.",
    )
    cluster.fake.script(
        [{"match": "db1", "reply": {"content": "Root cause: the disk of db1 is full."}}]
    )
    client = _reload(spawning)
    request = {
        "prompt": "Why is db1 read-only?",
        "agent": "incident_investigator",
        "context": {"incident_id": 4217, "device_id": 102},
    }
    with client.stream("POST", "/api/v1/chat", json=request) as response:
        events = read_all(response)
        session_id, spawn_id = response.headers["x-session-id"], response.headers["x-spawn-id"]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "agent_tile" and kinds[-1] == "task_notification" and "text" in kinds
    assert all(e["data"]["session_id"] == session_id for e in events)
    assert [e["id"] for e in events] == [e["data"]["seq"] for e in events]
    assert [e["id"] for e in events] == list(range(1, len(events) + 1))
    assert events[0]["data"]["persona"] == "incident_investigator"
    note = events[-1]["data"]
    assert (note["spawn_id"], note["status"]) == (spawn_id, "ok")
    assert text_of(events) == note["message"] == "Root cause: the disk of db1 is full."
    sent = [r for r in cluster.fake.requests() if "db1" in first_user(r)]
    assert first_user(sent[0]).startswith("Investigating incident 4217 on device 102.")

    history = client.get(f"/api/v1/chat/sessions/{session_id}").json()
    assert [(m["role"], m["content"], m["agent"], m["spawn_id"]) for m in history["messages"]] == [
        ("user", "Why is db1 read-only?", "incident_investigator", spawn_id),
        ("assistant", note["message"], "incident_investigator", spawn_id),
    ]
    transcript = client.get(f"/api/v1/spawns/{spawn_id}").json()
    assert transcript["status"] == "ok" and transcript["model"] == MODEL
    assert (transcript["persona"], transcript["persona_source"]) == (
        "incident_investigator",
        "disk",
    )
    assert transcript["context"] == {"incident_id": 4217, "device_id": 102}
    assert [m["role"] for m in transcript["messages"]][:2] == ["system", "user"]
    assert transcript["messages"][-1]["role"] == "assistant"
    assert transcript["usage"]["total"]["model_calls"] == len(transcript["usage"]["turns"]) == 1
    assert spawning.client("carol").get(f"/api/v1/spawns/{spawn_id}").status_code == 404

    # A follow-up in the same session streams only its own turn.
    follow_up = {"content": "And db1 now?", "agent": "incident_investigator"}
    url = f"/api/v1/chat/sessions/{session_id}/messages"
    with client.stream("POST", url, json=follow_up) as response:
        second = read_all(response)
    assert second[0]["id"] == len(events) + 1 and second[-1]["event"] == "task_notification"
    assert len(client.get(f"/api/v1/chat/sessions/{session_id}").json()["messages"]) == 4


def test_background_spawn_notifies_later_and_history_fills_in_without_the_stream(
    spawning: Api, cluster: Cluster
):
    cluster.site.persona("slow_investigator", background=True)
    cluster.fake.script([{"match": "", "reply": {"content": "Background answer."}, "delay": 3}])
    client = _reload(spawning)
    body = {"prompt": "Dig deep.", "agent": "slow_investigator"}
    with client.stream("POST", "/api/v1/chat", json=body) as response:
        events = read_all(response)
        session_id, spawn_id = response.headers["x-session-id"], response.headers["x-spawn-id"]
    # The turn ends at the tile: the caller does not wait for the (slow) model call.
    assert [e["event"] for e in events] == ["agent_tile"]
    assert events[0]["data"]["background"] is True
    assert client.get(f"/api/v1/spawns/{spawn_id}").json()["status"] in ("queued", "running")

    # Nobody reads the stream: the history still gets the answer once the spawn is done.
    def answered() -> list[dict[str, Any]] | None:
        messages = client.get(f"/api/v1/chat/sessions/{session_id}").json()["messages"]
        return messages if len(messages) == 2 else None

    messages = wait_for(answered, 60, "the background answer in the history")
    assert (messages[1]["role"], messages[1]["content"]) == ("assistant", "Background answer.")

    # The notification is on the session stream, after the tile.
    with client.stream(
        "GET",
        f"/api/v1/chat/sessions/{session_id}/events",
        params={"until_idle": 1},
        headers={"Last-Event-ID": str(events[0]["id"])},
    ) as response:
        later = read_all(response)
    note = later[-1]
    assert note["event"] == "task_notification" and note["data"]["spawn_id"] == spawn_id
    assert note["data"]["message"] == "Background answer."
    assert later[0]["id"] == events[0]["id"] + 1
    assert len(client.get(f"/api/v1/chat/sessions/{session_id}").json()["messages"]) == 2


def test_respond_async_answers_202_and_the_turn_runs_without_a_stream(
    spawning: Api, cluster: Cluster
):
    """Automation starting investigations: `Prefer: respond-async` is answered once the turn
    started, with where to follow it; nothing subscribes and no stream slot is held."""
    cluster.site.persona("nightly_check", background=True)
    cluster.site.persona("quick_check")
    cluster.fake.script([{"match": "", "reply": {"content": "All quiet."}, "delay": 0.5}])
    client = _reload(spawning)
    prefer = {"Prefer": "wait=10, respond-async"}
    started = client.post(
        "/api/v1/chat", json={"prompt": "Check.", "agent": "nightly_check"}, headers=prefer
    )
    assert started.status_code == 202, started.text
    accepted = started.json()
    session_id, spawn_id = accepted["session_id"], accepted["spawn_id"]
    assert accepted["agent"] == "nightly_check" and accepted["background"] is True
    assert accepted["events"] == f"/api/v1/chat/sessions/{session_id}/events?after=0"
    assert started.headers["location"] == accepted["events"]
    assert started.headers["preference-applied"] == "respond-async"
    assert started.headers["x-spawn-id"] == spawn_id
    channel = spawning.services.client.bus.keys(session_id).channel
    assert dict(cluster.redis.pubsub_numsub(channel))[channel.encode()] == 0
    assert spawning.services.limits.streams.held("alice") == 0

    # The turn runs to its end all the same; its events are where the answer said.
    with client.stream("GET", accepted["events"], params={"until_idle": 1}) as response:
        wait_for(lambda: client.get(f"/api/v1/spawns/{spawn_id}").json()["status"] == "ok", 60, "")
        events = read_all(response)
    assert [e["event"] for e in events][0] == "agent_tile"
    assert events[-1]["event"] == "task_notification"
    assert events[-1]["data"]["message"] == "All quiet."
    history = client.get(f"/api/v1/chat/sessions/{session_id}").json()["messages"]
    assert [(m["role"], m["content"]) for m in history] == [
        ("user", "Check."),
        ("assistant", "All quiet."),
    ]

    # A further message of the session, to a persona that is awaited, is accepted the same way.
    url = f"/api/v1/chat/sessions/{session_id}/messages"
    again = client.post(url, json={"content": "Again.", "agent": "quick_check"}, headers=prefer)
    assert again.status_code == 202, again.text
    assert again.json()["background"] is False
    assert again.json()["events"].endswith(f"?after={events[-1]['id']}")
    # Without the preference, the turn streams as before.
    with client.stream("POST", "/api/v1/chat", json={"prompt": "Hi.", "agent": "quick_check"}) as r:
        assert r.status_code == 200 and read_all(r)[-1]["event"] == "task_notification"


def test_sse_reconnect_with_last_event_id_misses_and_repeats_nothing(
    spawning: Api, cluster: Cluster
):
    cluster.site.persona("prober", tools=["get_edge_summary"])
    words = " ".join(f"word{i}" for i in range(30))
    cluster.fake.script(
        [
            {"turn": 0, "reply": {"tool_calls": [{"name": "get_edge_summary"}]}, "delay": 0.5},
            {"turn": 1, "reply": {"content": words}, "delay": 1.5},
        ]
    )
    client = _reload(spawning)
    session_id = spawning.services.chats.create_session("alice", "reconnect")
    events_url = f"/api/v1/chat/sessions/{session_id}/events"

    def start_turn() -> None:  # through another connection, while the test's one listens
        body = {"content": "probe it", "agent": "prober"}
        url = f"/api/v1/chat/sessions/{session_id}/messages"
        with spawning.client().stream("POST", url, json=body) as response:
            read_all(response)

    turn = threading.Thread(target=start_turn, daemon=True)
    seen: list[dict[str, Any]] = []
    with client.stream("GET", events_url) as listening:
        assert listening.status_code == 200
        turn.start()
        for event in sse(listening):
            seen.append(event)
            if event["event"] == "tool_call":
                break  # the client drops the connection mid-turn
    with client.stream("GET", events_url, headers={"Last-Event-ID": str(seen[-1]["id"])}) as again:
        for event in sse(again):
            seen.append(event)
            if event["event"] == "task_notification":
                break
    turn.join(timeout=60)
    # Each dropped connection ended its subscription (and only that: the turn ran to the end).
    channel = spawning.services.client.bus.keys(session_id).channel
    wait_for(
        lambda: dict(cluster.redis.pubsub_numsub(channel))[channel.encode()] == 0,
        10,
        "the streams' subscriptions to end",
    )
    ids = [e["id"] for e in seen]
    assert ids == list(range(1, len(ids) + 1)), ids
    assert text_of(seen) == words
    assert [e.seq for e in spawning.services.client.bus.history(session_id)] == ids


def test_cancel_a_running_spawn(spawning: Api, cluster: Cluster):
    cluster.site.persona("sleepy")
    cluster.fake.script([{"match": "", "reply": {"content": "too late"}, "delay": 3}])
    client = _reload(spawning)
    body = {"prompt": "take your time", "agent": "sleepy"}
    with client.stream("POST", "/api/v1/chat", json=body) as response:
        session_id, spawn_id = response.headers["x-session-id"], response.headers["x-spawn-id"]
        events = sse(response)
        assert next(events)["event"] == "agent_tile"
        cancel_url = f"/api/v1/chat/sessions/{session_id}/spawns/{spawn_id}/cancel"
        cancelled = client.post(cancel_url)
        assert cancelled.status_code == 202
        assert cancelled.json() == {"spawn_id": spawn_id, "status": "cancel_requested"}
        rest = list(events)
    assert rest[-1]["event"] == "task_notification"
    assert rest[-1]["data"]["status"] == "cancelled"
    # The notification is published just before the final record is written: wait for it.
    status = lambda: client.get(f"/api/v1/spawns/{spawn_id}").json()["status"]  # noqa: E731
    wait_for(lambda: status() == "cancelled", 60, "the cancelled spawn's record")
    again = client.post(cancel_url)
    assert again.status_code == 409 and error_of(again)["code"] == "spawn_finished"
    messages = client.get(f"/api/v1/chat/sessions/{session_id}").json()["messages"]
    assert messages[-1]["role"] == "system" and "cancelled" in messages[-1]["content"]


def test_decisions_need_the_approve_permission_and_resume_the_spawn(
    spawning: Api, cluster: Cluster
):
    cluster.site.persona(
        "restarter", tools=["host_restart_service"], permission_mode="mutating-with-confirm"
    )
    restart = {"name": "host_restart_service", "arguments": {"unit": "nginx"}}
    cluster.fake.script(
        [
            {"turn": 0, "reply": {"tool_calls": [restart]}},
            {"turn": 1, "reply": {"content": "Left nginx alone."}},
        ]
    )
    client = _reload(spawning)
    body = {"prompt": "restart nginx", "agent": "restarter"}
    with client.stream("POST", "/api/v1/chat", json=body) as response:
        spawn_id = response.headers["x-spawn-id"]
        events = sse(response)
        asking = next(e for e in events if e["event"] == "confirmation_required")["data"]
        decision = {
            "call_id": asking["call_id"],
            "args_hash": asking["args_hash"],
            "approve": False,
        }
        url = f"/api/v1/spawns/{spawn_id}/decisions"
        wait_for(
            lambda: client.get(f"/api/v1/spawns/{spawn_id}").json()["status"] == "waiting",
            30,
            "the spawn to wait for a decision",
        )
        assert spawning.client("bob").post(url, json=decision).status_code == 403
        wrong = client.post(url, json={**decision, "call_id": "nope"})
        assert wrong.status_code == 409 and error_of(wrong)["details"]["status"] == "waiting"
        denied = client.post(url, json=decision)
        assert denied.status_code == 200, denied.text
        assert denied.json()["approvals"][asking["call_id"]]["denied_by"] == "alice"
        rest = list(events)
    result = next(e for e in rest if e["event"] == "tool_result")["data"]
    assert result["is_error"] and "denied by alice" in result["content"]
    assert rest[-1]["data"]["message"] == "Left nginx alone."
    # The transcript marks the denied call's result as an error, like the event did.
    (card,) = client.get(f"/api/v1/spawns/{spawn_id}").json()["tool_calls"]
    assert card["call_id"] == asking["call_id"] and card["is_error"] is True
    assert client.post(url, json=decision).status_code == 409


def test_custom_persona_create_spawn_patch_spawn_again(spawning: Api, cluster: Cluster):
    cluster.fake.script([{"match": "", "reply": {"content": "noted"}}])
    cluster.site.persona("shadowed_one", body="# from disk")
    client = _reload(spawning)

    def system_prompt_for(agent: str, prompt: str) -> str:
        with client.stream(
            "POST", "/api/v1/chat", json={"prompt": prompt, "agent": agent}
        ) as response:
            events = read_all(response)
        assert events[-1]["data"]["status"] == "ok", events[-1]
        return system_of(next(r for r in cluster.fake.requests() if first_user(r) == prompt))

    created = client.post("/v1/agents/custom", json=_persona("custom_one", body="# version one"))
    assert created.status_code == 201
    assert system_prompt_for("custom_one", "first ask").endswith("# version one")
    client.patch("/v1/agents/custom/custom_one", json={"body": "# version two"}).raise_for_status()
    assert system_prompt_for("custom_one", "second ask").endswith("# version two")

    client.post("/v1/agents/custom", json=_persona("shadowed_one", body="# from the API"))
    assert system_prompt_for("shadowed_one", "shadow ask").endswith("# from the API")
    client.delete("/v1/agents/custom/shadowed_one").raise_for_status()
    assert "# from disk" in system_prompt_for("shadowed_one", "restored ask")


def test_the_coordinator_routes_to_the_matching_specialist(spawning: Api, cluster: Cluster):
    cluster.site.persona(
        "disk_doctor",
        body="# Disk doctor",
        when_to_use="When a filesystem is full or a disk is failing.",
    )
    cluster.site.persona("net_doctor", body="# Net doctor", when_to_use="When packets drop.")
    dispatch = {
        "name": "spawn_agent",
        "arguments": {
            "agent": "disk_doctor",
            "prompt": "Why is /var full on db1?",
            "reason": "a filesystem is full",
        },
    }
    cluster.fake.script(
        [
            {"where": "system", "match": "# Disk doctor", "reply": {"content": "/var is full."}},
            {
                "where": "system",
                "match": "disk_doctor",
                "turn": 0,
                "reply": {"tool_calls": [dispatch]},
            },
            {
                "where": "system",
                "match": "disk_doctor",
                "reply": {"content": "Relayed: /var is full."},
            },
        ]
    )
    client = _reload(spawning)
    with client.stream("POST", "/api/v1/chat", json={"prompt": "db1 says disk full"}) as response:
        events = read_all(response)
        session_id, spawn_id = response.headers["x-session-id"], response.headers["x-spawn-id"]
    tiles = {e["data"]["persona"]: e["data"] for e in events if e["event"] == "agent_tile"}
    assert set(tiles) == {"coordinator", "disk_doctor"}
    assert tiles["disk_doctor"]["reason"] == "a filesystem is full"  # why it was chosen
    # The child's tile names the coordinator's spawn: a console draws it under its parent.
    assert tiles["disk_doctor"]["parent_spawn_id"] == spawn_id == tiles["coordinator"]["spawn_id"]
    assert tiles["coordinator"]["parent_spawn_id"] == ""
    child = client.get(f"/api/v1/spawns/{tiles['disk_doctor']['spawn_id']}").json()
    assert child["parent_spawn_id"] == spawn_id
    assert [t["name"] for t in tiles["coordinator"]["tools"]] == ["spawn_agent"]
    assert events[-1]["event"] == "task_notification"
    assert events[-1]["data"]["spawn_id"] == spawn_id
    assert events[-1]["data"]["message"] == "Relayed: /var is full."
    messages = client.get(f"/api/v1/chat/sessions/{session_id}").json()["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant"]
    assert messages[1]["content"] == "Relayed: /var is full."


def test_ongrid_ask_renders_the_stream_and_exits_by_status(spawning: Api, cluster: Cluster):
    cluster.site.persona("disk_doctor", body="# Disk doctor", when_to_use="When a disk is full.")
    cluster.fake.script([{"match": "", "reply": {"content": "The disk of db1 is 97% full."}}])
    _reload(spawning)
    token = TOKENS["alice"][0]
    env = {**os.environ, "ONGRID_URL": spawning.base_url, "ONGRID_TOKEN": token}

    def ask(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "coordinator", "ask", *args],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    human = ask("Is db1 full?", "--agent", "disk_doctor")
    assert human.returncode == 0, human.stderr
    assert "▶ disk_doctor" in human.stdout and "The disk of db1 is 97% full." in human.stdout
    assert "■ disk_doctor: ok" in human.stdout and "session " in human.stderr
    raw = ask("Is db1 full?", "--agent", "disk_doctor", "--json")
    lines = [json.loads(line) for line in raw.stdout.splitlines()]
    assert lines[0]["type"] == "agent_tile" and lines[-1]["type"] == "task_notification"
    unknown = ask("hi", "--agent", "nope")
    assert unknown.returncode == 1 and "404" in unknown.stderr and "nope" in unknown.stderr
    assert token not in unknown.stderr + unknown.stdout
    env["ONGRID_TOKEN"] = "not-a-valid-token-at-all"
    denied = ask("hi", "--agent", "disk_doctor")
    assert denied.returncode == 1 and "401" in denied.stderr


def test_agents_show_the_model_the_workers_resolve_and_its_problem(
    api: Api, site: Site, redis_db: redis.Redis
):
    from workers.fleet import FleetReport, FleetReporter

    problem = (
        "model zhipu/glm-4.7 (zai/glm-4.7) cannot be used: zai needs ZAI_API_KEY; set "
        "ZAI_API_KEY, or ONGRID_DEFAULT_PROVIDER to a provider that is configured"
    )
    site.persona("glm_fan", model="zhipu/glm-4.7")
    client = api.client()
    client.post("/api/v1/agents/reload").raise_for_status()
    unchecked = client.get("/api/v1/agents/glm_fan").json()
    assert unchecked["model"] == "zhipu/glm-4.7"
    assert (unchecked["resolved_model"], unchecked["model_checked_by"]) == ("", 0)

    def report(member: str, problems: dict[str, str]) -> FleetReport:
        return FleetReport(
            member=member, host="h", pid=1, queues=["ongrid.interactive"], registry_version=0,
            persona_digest="", personas={}, models={"glm_fan": "zhipu/glm-4.7"},
            model_problems=problems,
        )  # fmt: skip

    FleetReporter(redis_db, "w1", lambda: report("w1", {"glm_fan": problem})).report_now()
    listed = {a["name"]: a for a in client.get("/api/v1/agents").json()}
    assert listed["glm_fan"]["resolved_model"] == "zhipu/glm-4.7"
    assert listed["glm_fan"]["model_problem"] == problem
    assert listed["glm_fan"]["model_checked_by"] == 1
    [finding] = [w for w in client.get("/api/v1/agents/warnings").json() if w["kind"] == "model"]
    assert (finding["persona"], finding["subject"], finding["reason"]) == (
        "glm_fan",
        "zhipu/glm-4.7",
        problem.removeprefix("model "),
    )
    # A second worker that has the key: the problem is said to be the first one's.
    FleetReporter(redis_db, "w2", lambda: report("w2", {})).report_now()
    seen = client.get("/api/v1/agents/glm_fan").json()
    assert seen["model_problem"] == f"on w1: {problem}" and seen["model_checked_by"] == 2


def test_custom_personas_under_both_paths_and_json_sent_as_curl_sends_it(api: Api):
    client = api.client()
    # curl -d without -H 'Content-Type: application/json' sends a form's content type.
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    body = json.dumps(_persona("curl_made"))
    created = client.post("/api/v1/agents/custom", content=body, headers=form)
    assert created.status_code == 201, created.text
    assert created.headers["Location"] == "/api/v1/agents/curl_made"
    patched = client.patch(
        "/v1/agents/custom/curl_made", content=json.dumps({"max_turns": 7}), headers=form
    )
    assert patched.status_code == 200 and patched.json()["max_turns"] == 7
    again = client.patch("/api/v1/agents/custom/curl_made", json={"max_turns": 9})
    assert again.json()["max_turns"] == 9
    no_type = client.post(
        "/v1/agents/custom", content=json.dumps(_persona("bare_made")), headers={}
    )
    assert no_type.status_code == 201, no_type.text
    not_json = client.post("/api/v1/agents/custom", content=b"name=x", headers=form)
    assert not_json.status_code == 422 and "malformed JSON" in error_of(not_json)["message"]
    assert client.delete("/api/v1/agents/custom/curl_made").status_code == 204
    assert client.delete("/v1/agents/custom/bare_made").status_code == 204
    paths = api.client().get("/openapi.json").json()["paths"]
    assert "/api/v1/agents/custom" in paths and "/v1/agents/custom" not in paths


def test_a_saved_persona_comes_back_with_its_lint_findings(api: Api):
    client = api.client()
    typo = _persona("edge_reader", tools=["get_edge_sumary"])
    created = client.post("/api/v1/agents/custom", json=typo)
    assert created.status_code == 201
    (finding,) = [f for f in created.json()["findings"] if f["kind"] == "unknown_tool"]
    assert finding["persona"] == "edge_reader" and finding["subject"] == "get_edge_sumary"
    fixed = client.patch("/api/v1/agents/custom/edge_reader", json={"tools": ["host_probe"]})
    assert [f for f in fixed.json()["findings"] if f["kind"] == "unknown_tool"] == []
