"""Every way of starting a worker runs the same worker, and importing the code reads nothing.

The raw ``celery -A workers.app worker`` and a plain ``ongrid worker`` are started as real
processes against a real Redis database and a SQLite database holding a user persona, with the
fake LLM: both run a coordinator turn that dispatches the user persona, and a direct spawn of it,
and both harden themselves. A plain ``ongrid worker`` serves coordinator turns in a child process
of its own, which the kernel stops with its parent.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from faults import release
from harness import MODEL, Cluster, Proc, first_user, wait_for
from procs import ALL_QUEUES, ongrid, pid_alive, raw_celery, wait_consumers

from coordinator.storage.engine import make_engine, upgrade
from coordinator.storage.personas import SqlUserStore
from coordinator.turns import start_turn
from registry.defaults import build_registry
from registry.parser import parse_persona
from registry.settings import Settings
from workers.client import SpawnClient

REPO = Path(__file__).resolve().parents[2]
USER_PERSONA = """---
name: db_keeper
description: Answers from the database.
when_to_use: When a test asks the persona stored in the database.
model: openai/gpt-4o-mini
---
# Keeper stored in the database
"""
SPECIALIST_ANSWER = "Kept by the database."
COORDINATOR_ANSWER = "Relayed: kept by the database."
DISPATCH = {
    "name": "spawn_agent",
    "arguments": {"agent": "db_keeper", "prompt": "Ask the keeper.", "reason": "a test asks"},
}


@dataclass
class Site:
    cluster: Cluster
    env: dict[str, str]
    client: SpawnClient


@pytest.fixture
def site(cluster: Cluster) -> Iterator[Site]:
    db_url = f"sqlite:///{cluster.root / 'ongrid.db'}"
    engine = make_engine(db_url)
    upgrade(engine)
    SqlUserStore(engine).upsert(parse_persona(USER_PERSONA).persona, user="alice")
    settings = Settings.load(
        environ={
            "REDIS_URL": cluster.redis_url,
            "ONGRID_AGENTS_DIR": str(cluster.agents),
            "ONGRID_MARKETPLACE_ROOT": str(cluster.root / "marketplace"),
            "ONGRID_DATABASE_URL": db_url,
        }
    )
    client = SpawnClient(settings, registry=build_registry(settings, SqlUserStore(engine)))
    cluster.fake.script(
        [
            {
                "where": "system",
                "match": "# Keeper stored in the database",
                "reply": {"content": SPECIALIST_ANSWER},
            },
            {
                "where": "system",
                "match": "db_keeper",
                "turn": 0,
                "reply": {"tool_calls": [DISPATCH]},
            },
            {"where": "system", "match": "db_keeper", "reply": {"content": COORDINATOR_ANSWER}},
        ]
    )
    env = {**cluster.env, "ONGRID_DATABASE_URL": db_url, "ONGRID_DEFAULT_MODEL": MODEL}
    yield Site(cluster, env, client)
    client.redis.close()
    engine.dispose()


def _start(site: Site, name: str, argv: list[str]) -> Proc:
    proc = Proc(name, argv, site.cluster.root, site.env)
    site.cluster.workers.append(proc)  # type: ignore[arg-type]  # killed and logged on close
    return proc


def _turn_and_user_spawn(site: Site) -> None:
    """A coordinator turn that dispatches the user persona, then a direct spawn of it."""
    client = site.client
    turn = start_turn(
        client, session_id=uuid.uuid4().hex, prompt="Who keeps it?", user="alice", role="admin"
    )
    done = client.wait(turn.spawn_id, timeout=90)
    assert done.status == "ok", done.error
    assert done.result == COORDINATOR_ANSWER
    tiles = {e.persona: e for e in client.bus.history(turn.session_id) if e.type == "agent_tile"}
    assert set(tiles) == {"coordinator", "db_keeper"}
    child = client.store.get(tiles["db_keeper"].spawn_id)
    assert child is not None and child.status == "ok" and child.result == SPECIALIST_ANSWER
    assert child.persona_source == "user"  # read from the database by the worker

    direct = client.spawn("db_keeper", "Direct question.")
    done = client.wait(direct.spawn_id, timeout=90)
    assert done.status == "ok", done.error
    assert (done.result, done.persona_source) == (SPECIALIST_ANSWER, "user")


def _hardened(proc: Proc) -> None:
    line = next(
        (ln for ln in proc.log().splitlines() if "secrets moved out of the environment" in ln), ""
    )
    assert "OPENAI_API_KEY" in line and "REDIS_URL" in line, proc.log()


def test_the_raw_celery_command_runs_the_same_worker(site: Site):
    proc = _start(site, "raw", raw_celery("ongrid.interactive,ongrid.coordinator", "raw"))
    found = wait_consumers(site.cluster.redis, ("ongrid.interactive", "ongrid.coordinator"), proc)

    (member,) = found["ongrid.interactive"]
    assert found["ongrid.coordinator"] == [member]  # the queues of -Q, advertised
    assert member.startswith("raw@") and member.endswith(f" pid {proc.pid}")
    _turn_and_user_spawn(site)
    _hardened(proc)
    # Both queues in one pool: the worker says what that risks.
    assert "consumes ongrid.coordinator and ongrid.interactive in one pool" in proc.log()


def test_plain_ongrid_worker_serves_coordinator_turns_in_a_pool_of_its_own(site: Site):
    proc = _start(
        site, "plain", ongrid("worker", "-c", "8", "--coordinator-slots=2", "--name=plain")
    )
    found = wait_consumers(site.cluster.redis, ALL_QUEUES, proc)

    (specialists,) = found["ongrid.interactive"]
    assert found["ongrid.background"] == [specialists]
    assert specialists.startswith("plain@") and specialists.endswith(f" pid {proc.pid}")
    (coordinator,) = found["ongrid.coordinator"]  # not the parent: its child
    assert coordinator.startswith("plain-coordinator@")
    child_pid = int(coordinator.rsplit(" ", 1)[1])
    assert child_pid != proc.pid
    _turn_and_user_spawn(site)
    _hardened(proc)

    proc.proc.send_signal(signal.SIGKILL)  # the parent alone, as the OOM killer would
    proc.proc.wait(timeout=30)
    wait_for(lambda: not pid_alive(child_pid), 60, "the coordinator pool to end with its parent")


def test_a_warm_shutdown_stops_the_coordinator_pool_and_withdraws_every_queue(site: Site):
    proc = _start(site, "plain", ongrid("worker", "-c", "4", "--coordinator-slots=1", "--name=w"))
    found = wait_consumers(site.cluster.redis, ALL_QUEUES, proc)
    child_pid = int(found["ongrid.coordinator"][0].rsplit(" ", 1)[1])

    proc.proc.send_signal(signal.SIGTERM)  # the parent only, as an orchestrator stops it

    assert proc.proc.wait(timeout=90) == 0, proc.log()
    assert not pid_alive(child_pid)  # the parent waited for its coordinator pool
    # Withdrawn at once, not left to expire: nobody is told a queue is served when it is not.
    assert site.client.consumers(*ALL_QUEUES) == dict.fromkeys(ALL_QUEUES, [])


# -- nothing at import ---------------------------------------------------------------------------

_PROBE = r"""
import importlib, json, os, pkgutil, sys

ROOTS = tuple(os.path.join(sys.argv[1], p) + os.sep for p in ("registry", "workers", "coordinator"))
SKIP = {"coordinator.__main__", "coordinator.storage.migrations.env"}
reads = []


class Recording(dict):
    # os.environ stand-in: records each read made by a module of the project.
    def _note(self, key):
        frame = sys._getframe(2)
        while frame is not None and (
            frame.f_code.co_filename in (os.__file__, "<string>")
            or frame.f_code.co_filename.endswith("_collections_abc.py")
        ):
            frame = frame.f_back
        if frame is not None and frame.f_code.co_filename.startswith(ROOTS):
            reads.append(f"{key} by {frame.f_code.co_filename}:{frame.f_lineno}")

    def __getitem__(self, key):
        self._note(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self._note(key)
        return super().get(key, default)

    def __contains__(self, key):
        self._note(key)
        return super().__contains__(key)

    def __iter__(self):
        self._note("(iteration)")
        return super().__iter__()


before = dict(os.environ)
os.environ = Recording(before)
import registry.settings

loads = []
original = registry.settings.Settings.load.__func__
registry.settings.Settings.load = classmethod(
    lambda cls, *a, **k: loads.append(1) or original(cls, *a, **k)
)
names = []
for package in ("registry", "workers", "coordinator"):
    module = importlib.import_module(package)
    for info in pkgutil.walk_packages(module.__path__, package + "."):
        if info.name not in SKIP:
            importlib.import_module(info.name)
            names.append(info.name)
imported = {"loads": len(loads), "reads": list(reads), "litellm": "litellm" in sys.modules}
after = dict(os.environ.items())
changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))

import workers.app

broker = workers.app.app.conf.broker_url
print(json.dumps({
    "modules": names, "changed": changed, **imported, "loads_after_app": len(loads),
    "broker": broker,
}))
"""


def test_importing_the_packages_reads_and_changes_no_environment(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ONGRID_", "OPENAI_"))}
    env.update(
        REDIS_URL="redis://sentinel.invalid:6390/3",
        OPENAI_API_KEY="sk-sentinel",
        ONGRID_DEFAULT_MODEL="sentinel/model",
        ONGRID_DATA_DIR=str(tmp_path / "data"),
    )
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, str(REPO)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.splitlines()[-1])

    assert {"workers.app", "coordinator.worker", "coordinator.cli"} <= set(found["modules"])
    assert found["reads"] == []  # no module of the project looked at the environment
    assert found["changed"] == []  # nor wrote to it (litellm's variables included)
    assert found["loads"] == 0 and not found["litellm"]
    # The entry builds its app on first access, from settings loaded then, once.
    assert found["loads_after_app"] == 1
    assert found["broker"] == "redis://sentinel.invalid:6390/3"


def test_processes_share_the_queues_and_one_that_dies_is_started_again(site: Site):
    """``--processes 2``: two processes, each with its own slots, consume the same queue; one
    killed is started again; a warm shutdown of the parent stops both."""
    fake = site.cluster.fake
    fake.script(
        [
            {
                "where": "system",
                "match": "# Keeper stored in the database",
                "hold": "keepers",
                "reply": {"content": SPECIALIST_ANSWER},
            }
        ]
    )
    argv = ongrid("worker", "-c", "3", "--processes=2", "--queues=ongrid.interactive")
    proc = _start(site, "multi", [*argv, "--name=multi"])

    def both() -> list[str] | None:
        assert proc.alive(), proc.log()
        found = site.client.consumers("ongrid.interactive")["ongrid.interactive"]
        return found if len(found) == 2 else None

    names = sorted(wait_for(both, 90, "two consumers"), key=lambda n: n.split("@")[0])
    assert [n.split("@")[0] for n in names] == ["multi", "multi-2"]
    child_pid = int(names[1].rsplit(" ", 1)[1])
    assert child_pid != proc.pid

    # Six spawns held by the model at once: only both processes' three slots hold them all.
    spawns = [site.client.spawn("db_keeper", f"Held question {i}.") for i in range(6)]
    wait_for(
        lambda: (
            len({first_user(r) for r in fake.requests() if "Held question" in first_user(r)}) == 6
        ),
        90,
        "six model requests in flight at once",
    )
    release(fake, "keepers")
    for spawn in spawns:
        done = site.client.wait(spawn.spawn_id, timeout=90)
        assert (done.status, done.result) == ("ok", SPECIALIST_ANSWER), done.error

    os.kill(child_pid, signal.SIGKILL)

    def restarted() -> int | None:
        found = both()
        pids = [int(n.rsplit(" ", 1)[1]) for n in found or () if n.startswith("multi-2@")]
        return pids[0] if pids and pids[0] != child_pid else None

    again = wait_for(restarted, 90, "the killed process started again")
    assert "worker process 2 (pid" in proc.log() and "starting it again" in proc.log()

    proc.proc.send_signal(signal.SIGTERM)
    assert proc.proc.wait(timeout=90) == 0, proc.log()
    assert not pid_alive(again)
    assert site.client.consumers("ongrid.interactive") == {"ongrid.interactive": []}
