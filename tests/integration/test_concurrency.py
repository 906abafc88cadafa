"""Concurrent writes through the HTTP API: persona edits and decisions on waiting tool calls.

The API runs under uvicorn on a free port, on the test's Redis database (see ``conftest.py``);
personas are stored in a SQLite file, and on PostgreSQL too when the server in
``ONGRID_TEST_POSTGRES_URL`` answers (a fresh database per test). Decisions are taken on spawns
that real worker processes run against the fake LLM. Every race is released by a
:class:`threading.Barrier`, each request on its own connection.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import uvicorn
from harness import Cluster, call, final, wait_for
from postgres import fresh_database

from coordinator.api import create_app
from registry.settings import Settings, TokenGrant, token_digest

#: alice and carol are admins (they edit personas and approve); carol approves alice's spawns.
TOKENS = {"alice": "alice-admin-token-0000001", "carol": "carol-admin-token-0000003"}
T = TypeVar("T")


class ApiServer:
    """The app of ``settings`` under uvicorn in a thread, on a free port."""

    def __init__(self, settings: Settings) -> None:
        grants = {token_digest(t): TokenGrant(user=u, role="admin") for u, t in TOKENS.items()}
        app = create_app(settings.model_copy(update={"token_grants": grants}))
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.base_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        config = uvicorn.Config(app, log_config=None, access_log=False, timeout_graceful_shutdown=2)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="api", daemon=True
        )
        self._thread.start()
        wait_for(lambda: self._server.started, 30, "the API server to start")
        self._clients: list[httpx.Client] = []

    def clients(self, count: int) -> list[httpx.Client]:
        """``count`` clients, each with its own connection, alternately alice and carol."""
        made = [
            httpx.Client(
                base_url=self.base_url,
                headers={"Authorization": f"Bearer {TOKENS['alice' if i % 2 == 0 else 'carol']}"},
                timeout=60,
            )
            for i in range(count)
        ]
        self._clients.extend(made)
        return made

    def close(self) -> None:
        for client in self._clients:
            client.close()
        self._server.should_exit = True
        self._thread.join(timeout=15)


def _race(count: int, work: Callable[[int], T]) -> list[T]:
    """``work(i)`` in ``count`` threads released at once; their results, in order."""
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count
    errors: list[BaseException] = []

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = work(i)
        except BaseException as exc:  # noqa: BLE001 - re-raised below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


def _error(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}, body
    return body["error"]


def _persona(name: str, **fields: Any) -> dict[str, Any]:
    return {
        "name": name,
        "description": f"{name} description",
        "when_to_use": f"When {name} fits.",
        "body": f"# {name}\n",
        **fields,
    }


# -- persona edits on each database ------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ongrid.db'}"
        return
    admin, reason = request.getfixturevalue("postgres_admin")
    if admin is None:
        pytest.skip(reason)
    with fresh_database(admin, "ongrid_race") as url:
        yield url


@pytest.fixture
def api(tmp_path: Path, db_url: str, redis_db: str) -> Iterator[ApiServer]:
    agents = tmp_path / "agents"
    agents.mkdir()
    settings = Settings(
        agents_dir=agents,
        marketplace_root=tmp_path / "marketplace",
        redis_url=redis_db,
        database_url=db_url,
        data_dir=tmp_path / ".ongrid",
    )
    server = ApiServer(settings)
    yield server
    server.close()


def test_of_eight_creates_of_one_name_at_once_exactly_one_wins(api: ApiServer):
    clients = api.clients(8)
    responses = _race(
        8,
        lambda i: clients[i].post(
            "/v1/agents/custom", json=_persona("racer", description=f"by writer {i}")
        ),
    )

    assert sorted(r.status_code for r in responses) == [201] + [409] * 7, [
        r.text for r in responses
    ]
    (winner,) = [i for i, r in enumerate(responses) if r.status_code == 201]
    for response in responses:
        if response.status_code == 409:
            error = _error(response)
            assert error["code"] == "conflict" and error["details"] == {"name": "racer"}
            assert "'racer' already exists as a user persona" in error["message"]
            assert "PATCH /v1/agents/custom/racer" in error["message"]
    stored = clients[0].get("/api/v1/agents/racer").json()
    assert (stored["source"], stored["description"]) == ("user", f"by writer {winner}")


def test_concurrent_patches_of_different_fields_lose_none(api: ApiServer):
    first, second = api.clients(2)
    assert first.post("/v1/agents/custom", json=_persona("shared")).status_code == 201
    rounds = 10

    def patch(i: int) -> list[int]:
        client, field = (first, "description") if i == 0 else (second, "when_to_use")
        return [
            client.patch("/v1/agents/custom/shared", json={field: f"{field} #{n}"}).status_code
            for n in range(rounds)
        ]

    assert _race(2, patch) == [[200] * rounds] * 2
    stored = first.get("/api/v1/agents/shared").json()
    # Each writer's last value is there: neither wrote back a field the other had changed.
    assert stored["description"] == f"description #{rounds - 1}"
    assert stored["when_to_use"] == f"when_to_use #{rounds - 1}"


def test_of_concurrent_deletes_one_wins_and_a_racing_patch_never_brings_it_back(
    api: ApiServer,
):
    clients = api.clients(4)
    assert clients[0].post("/v1/agents/custom", json=_persona("doomed")).status_code == 201
    deletes = _race(4, lambda i: clients[i].delete("/v1/agents/custom/doomed"))
    assert sorted(r.status_code for r in deletes) == [204, 404, 404, 404]

    def delete_or_patch(i: int) -> httpx.Response:
        if i == 0:
            return clients[0].delete("/v1/agents/custom/doomed")
        return clients[1].patch("/v1/agents/custom/doomed", json={"description": "patched"})

    for _ in range(5):
        created = clients[0].post("/v1/agents/custom", json=_persona("doomed"))
        assert created.status_code == 201, created.text
        delete, patch = _race(2, delete_or_patch)
        assert delete.status_code == 204, delete.text
        assert patch.status_code in (200, 404), patch.text
        assert clients[2].get("/api/v1/agents/doomed").status_code == 404


# -- decisions on a waiting call ---------------------------------------------------------------


@pytest.fixture
def decisions_api(cluster: Cluster, tmp_path: Path) -> Iterator[ApiServer]:
    """An API on the cluster's Redis and agents directory; carol approves alice's spawns."""
    settings = cluster.settings.model_copy(
        update={
            "database_url": f"sqlite:///{tmp_path / 'api.db'}",
            "data_dir": tmp_path / ".ongrid-api",
            "approvers": {"alice": ["carol"]},
        }
    )
    server = ApiServer(settings)
    yield server
    server.close()


def _parked(cluster: Cluster, persona: str, prompt: str) -> tuple[str, str, str]:
    """Spawn ``persona`` for alice; once it waits, its id, and the id and hash of the call it
    waits on."""
    record = cluster.client.spawn(persona, prompt, user="alice")
    waiting = cluster.client.wait(record.spawn_id, timeout=60)
    assert waiting.status == "waiting", waiting.error
    (asked,) = [e for e in cluster.history(record.session_id) if e.type == "confirmation_required"]
    return record.spawn_id, asked.call_id, asked.args_hash


def test_two_approvals_of_a_dual_call_at_once_are_both_recorded_and_resume_it_once(
    cluster: Cluster, decisions_api: ApiServer
):
    cluster.persona("wiper", tools=["wipe_thing"], permission_mode="dual-sign-required")
    cluster.fake.script([call("wipe_thing", {"thing": "tmp"}, turn=0), final("Wiped.", turn=1)])
    cluster.start_worker()
    spawn_id, call_id, args_hash = _parked(cluster, "wiper", "Wipe /tmp on db1.")
    alice, carol = decisions_api.clients(2)
    decision = {"call_id": call_id, "args_hash": args_hash, "approve": True}

    responses = _race(
        2, lambda i: (alice, carol)[i].post(f"/api/v1/spawns/{spawn_id}/decisions", json=decision)
    )

    assert [r.status_code for r in responses] == [200, 200], [r.text for r in responses]
    # The first one recorded leaves the call waiting for a second person; the other settles it.
    assert sorted(r.json()["status"] for r in responses) == ["queued", "waiting"]
    done = cluster.client.wait(spawn_id, timeout=60)
    assert done.status == "ok", done.error
    assert done.state is not None
    assert sorted(done.state.approvals[call_id].approved_by) == ["alice", "carol"]
    assert cluster.tool_runs() == ["wipe_thing"]
    assert done.attempts == 2  # parked once, resumed once: not woken by the first signature


def test_an_approval_and_a_denial_at_once_the_first_stands_and_the_other_is_409(
    cluster: Cluster, decisions_api: ApiServer
):
    cluster.persona("fixer", tools=["restart_thing"], permission_mode="mutating-with-confirm")
    cluster.fake.script([call("restart_thing", turn=0), final("Done.", turn=1)])
    cluster.start_worker()
    spawn_id, call_id, args_hash = _parked(cluster, "fixer", "Restart the stuck exporter on db1.")
    alice, carol = decisions_api.clients(2)

    responses = _race(
        2,
        lambda i: (alice, carol)[i].post(
            f"/api/v1/spawns/{spawn_id}/decisions",
            json={"call_id": call_id, "args_hash": args_hash, "approve": i == 0},
        ),
    )

    assert sorted(r.status_code for r in responses) == [200, 409], [r.text for r in responses]
    winner = "alice" if responses[0].status_code == 200 else "carol"
    word = "approved" if winner == "alice" else "denied"
    error = _error(next(r for r in responses if r.status_code == 409))
    assert error["code"] == "already_decided"
    assert error["details"] == {"decision": word, "decided_by": [winner]}
    assert f"already {word} by {winner}; the first decision stands" in error["message"]
    done = cluster.client.wait(spawn_id, timeout=60)
    assert done.status == "ok", done.error
    assert cluster.tool_runs() == (["restart_thing"] if winner == "alice" else [])
    assert done.attempts == 2
