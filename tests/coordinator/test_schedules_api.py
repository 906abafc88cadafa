"""``/api/v1/schedules`` over real HTTP, on a real Redis (the beat's RedBeat entries) and SQLite;
the config file's ``schedules:``; ``ongrid beat`` refusing to start without Redis.

Runs are started by the beat and a worker: see ``tests/integration/test_schedules.py``.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from servers import AppServer

from coordinator.api import create_app
from registry.errors import UserError
from registry.notifications import ChannelConfig, NotificationSettings
from registry.schedules import ScheduleSpec
from registry.settings import Settings, TokenGrant, token_digest

#: alice is an admin (edits), bob a viewer (reads only).
TOKENS = {
    "alice": ("alice-admin-token-0000001", "admin"),
    "bob": ("bob-viewer-token-00000002", "viewer"),
}
KEY = "ongrid:redbeat:"
DAILY = {
    "name": "daily-disk",
    "persona": "incident_investigator",
    "prompt": "Is any filesystem close to full?",
    "cron": "0 7 * * *",
    "channels": ["oncall"],
    "budget": {"max_tool_calls": 20},
}
FROM_FILE = ScheduleSpec(
    name="from-file",
    persona="incident_investigator",
    prompt="Anything firing?",
    interval_seconds=3600,
    owner="ops",
    role="operator",
)


class Api:
    def __init__(self, settings: Settings) -> None:
        self.server = AppServer(create_app(settings))
        self.clients: list[httpx.Client] = []

    def client(self, user: str = "alice") -> httpx.Client:
        auth = {"Authorization": f"Bearer {TOKENS[user][0]}"}
        made = httpx.Client(base_url=self.server.base_url, headers=auth, timeout=30)
        self.clients.append(made)
        return made

    def close(self) -> None:
        for made in self.clients:
            made.close()
        self.server.stop()


@pytest.fixture
def beat_redis(claimed_redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(claimed_redis_url, decode_responses=True)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def api(tmp_path: Path, claimed_redis_url: str, beat_redis: redis.Redis) -> Iterator[Api]:
    grants = {token_digest(t): TokenGrant(user=u, role=r) for u, (t, r) in TOKENS.items()}
    settings = Settings(
        agents_dir=tmp_path / "agents",
        marketplace_root=tmp_path / "marketplace",
        redis_url=claimed_redis_url,
        database_url=f"sqlite:///{tmp_path / 'ongrid.db'}",
        data_dir=tmp_path / ".ongrid",
        token_grants=grants,
        schedules=[FROM_FILE],
        notifications=NotificationSettings(
            channels={"oncall": ChannelConfig(type="slack", url="http://127.0.0.1:9/hook")}
        ),
    )
    server = Api(settings)
    yield server
    server.close()


def _error(response: httpx.Response) -> dict[str, Any]:
    return response.json()["error"]  # type: ignore[no-any-return]


def test_editors_create_change_and_delete_schedules_that_the_beat_follows(
    api: Api, beat_redis: redis.Redis
):
    alice = api.client()
    unknown = alice.post("/api/v1/schedules", json={**DAILY, "channels": ["oncal"]})
    assert unknown.status_code == 404
    assert _error(unknown)["message"] == "unknown notification channel 'oncal'; known: oncall"
    created = alice.post("/api/v1/schedules", json=DAILY)
    assert created.status_code == 201, created.text
    assert created.headers["location"] == "/api/v1/schedules/daily-disk"
    body = created.json()
    assert (body["owner"], body["role"], body["source"]) == ("alice", "admin", "api")
    assert body["cadence"] == "cron 0 7 * * * (UTC)" and body["channels"] == ["oncall"]
    assert body["next_run_at"].endswith("07:00:00+00:00") and body["last_run"] is None
    assert beat_redis.exists(KEY + "daily-disk")
    assert alice.post("/api/v1/schedules", json=DAILY).status_code == 409

    off = alice.patch("/api/v1/schedules/daily-disk", json={"enabled": False})
    assert off.status_code == 200 and off.json()["next_run_at"] is None
    assert not beat_redis.exists(KEY + "daily-disk")
    every = alice.patch(
        "/api/v1/schedules/daily-disk", json={"enabled": True, "interval_seconds": 600}
    )
    assert (every.json()["cron"], every.json()["cadence"]) == (None, "every 600 s")
    assert beat_redis.exists(KEY + "daily-disk")

    one = alice.get("/api/v1/schedules/daily-disk")
    assert one.status_code == 200 and one.json()["runs"] == []
    listed = {s["name"]: s for s in api.client("bob").get("/api/v1/schedules").json()}
    assert set(listed) == {"daily-disk", "from-file"}

    assert alice.delete("/api/v1/schedules/daily-disk").status_code == 204
    assert not beat_redis.exists(KEY + "daily-disk")
    assert alice.delete("/api/v1/schedules/daily-disk").status_code == 404
    assert alice.get("/api/v1/schedules/daily-disk").status_code == 404


def test_bad_input_is_refused_naming_the_field(api: Api):
    alice = api.client()

    def refused(status: int, **changes: Any) -> str:
        response = alice.post("/api/v1/schedules", json={**DAILY, **changes})
        assert response.status_code == status, response.text
        return str(_error(response)["message"])

    assert "hour '25' is invalid" in refused(400, cron="0 25 * * *")
    assert "expected 5 fields" in refused(400, cron="0 7 * *")
    assert "exactly one of cron and interval_seconds" in refused(422, interval_seconds=60)
    assert "exactly one" in refused(422, cron=None)
    assert "name" in refused(422, name="Daily Disk")
    assert "colour" in refused(422, colour="red")
    assert "max_tool_calls" in refused(422, budget={"max_tool_calls": 0})
    deep: dict[str, Any] = {"end": 1}
    for _ in range(10):
        deep = {"in": deep}
    assert "context" in refused(422, context=deep)
    unknown = refused(404, persona="nobody")
    assert "'nobody'" in unknown and "incident_investigator" in unknown
    assert "'operator'" in refused(403, role="operator")
    assert "'mallory'" in refused(403, owner="mallory")
    assert alice.get("/api/v1/schedules").json()[0]["name"] == "from-file"


def test_only_editors_write_and_the_config_files_schedules_are_read_only(
    api: Api, beat_redis: redis.Redis
):
    bob, alice = api.client("bob"), api.client()
    assert bob.post("/api/v1/schedules", json=DAILY).status_code == 403
    assert bob.patch("/api/v1/schedules/from-file", json={"enabled": False}).status_code == 403
    assert bob.delete("/api/v1/schedules/from-file").status_code == 403
    assert httpx.get(f"{api.server.base_url}/api/v1/schedules").status_code == 401

    (listed,) = bob.get("/api/v1/schedules").json()
    assert (listed["source"], listed["owner"], listed["role"]) == ("config", "ops", "operator")
    assert listed["next_run_at"] is not None and beat_redis.exists(KEY + "from-file")
    for response in (
        alice.patch("/api/v1/schedules/from-file", json={"enabled": False}),
        alice.delete("/api/v1/schedules/from-file"),
    ):
        assert response.status_code == 409
        assert "config file" in _error(response)["message"]
    assert beat_redis.exists(KEY + "from-file")


def test_the_config_files_schedules_are_checked_like_every_setting(tmp_path: Path):
    config = tmp_path / "ongrid.yaml"
    config.write_text(
        "schedules:\n"
        "  - {name: a, persona: x, prompt: p, cron: '0 7 * 13 *'}\n"
        "  - {name: b, persona: x, prompt: p, interval_seconds: 60, colour: red}\n"
        "  - {name: b, persona: x, prompt: p, interval_seconds: 60}\n",
        encoding="utf-8",
    )
    with pytest.raises(UserError) as caught:
        Settings.load({"ONGRID_CONFIG": str(config)})
    message = str(caught.value)
    assert "schedules.0.cron" in message and "month_of_year '13' is invalid" in message
    assert "schedules.1.colour: Extra inputs are not permitted" in message
    config.write_text(
        "schedules: [{name: a, persona: x, prompt: p, cron: '0 7 * * *', role: chief}]\n",
        encoding="utf-8",
    )
    with pytest.raises(UserError, match=r"schedules.0.role: unknown role 'chief'; known: admin"):
        Settings.load({"ONGRID_CONFIG": str(config)})
    config.write_text(
        "schedules: [{name: a, persona: x, prompt: p, cron: '0 7 * * *', channels: [pagr]}]\n",
        encoding="utf-8",
    )
    with pytest.raises(UserError, match=r"schedules.0.channels: unknown notification channel"):
        Settings.load({"ONGRID_CONFIG": str(config)})


def test_the_beat_without_redis_says_so_in_one_line(tmp_path: Path):
    env = {"REDIS_URL": "redis://127.0.0.1:9/0", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "coordinator", "beat"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Redis at 127.0.0.1:9 is unreachable" in lines[0], done.stderr
