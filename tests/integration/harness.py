"""The integration harness: the fake LLM process, worker processes, a test's cluster, and polling.

Nothing here waits on the wall clock: helpers poll a condition until a generous deadline.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import redis
import yaml
from processes import Proc, wait_for

from registry.settings import Settings
from workers.client import SpawnClient
from workers.messages import Event
from workers.spawns import SpawnRecord
from workers.testing.fake_openai import start_subprocess

HERE = Path(__file__).resolve().parent
#: The model every test persona runs on unless it says otherwise.
MODEL = "openai/gpt-4o-mini"
#: How long a worker may take to start (it imports litellm and Celery) on a loaded 2-core box.
START_TIMEOUT = 90.0
#: The workers' spawn lease (``ONGRID_LEASE_SECONDS``): a dead worker's spawn resumes elsewhere
#: after about this long. Short, so the crash tests are quick; long enough for a loaded machine.
LEASE_SECONDS = 4.0
#: The line a worker's registry follower logs when it applies a reload.
RELOAD_LINE = "registry reloaded to cluster version"


# -- the fake LLM ------------------------------------------------------------------------------


class FakeLLM:
    """The fake OpenAI server process and its rules file (re-read by the server on change)."""

    def __init__(self, script_path: Path) -> None:
        self.script_path = script_path
        self._stamp = 0
        self.script([])
        self.proc, self.base_url = start_subprocess(script_path)

    def script(self, rules: list[dict[str, Any]]) -> None:
        """Replace the rules: atomically, with a fresh mtime, so the server never reads half a
        file and always notices the change."""
        partial = self.script_path.with_suffix(".tmp")
        partial.write_text(json.dumps(rules), encoding="utf-8")
        self._stamp = max(time.time_ns(), self._stamp + 1_000_000)
        os.utime(partial, ns=(self._stamp, self._stamp))
        partial.replace(self.script_path)

    def requests(self) -> list[dict[str, Any]]:
        """Every chat request the server received, in order."""
        root = self.base_url.removesuffix("/v1")
        with urllib.request.urlopen(f"{root}/_requests", timeout=10) as response:
            return json.loads(response.read())

    def key_digests(self) -> list[str]:
        """The SHA-256 of each chat request's bearer key, in order."""
        root = self.base_url.removesuffix("/v1")
        with urllib.request.urlopen(f"{root}/_keys", timeout=10) as response:
            return json.loads(response.read())

    def requests_for(self, prompt: str) -> list[dict[str, Any]]:
        """The requests of the spawn whose first user message contains ``prompt``."""
        return [r for r in self.requests() if prompt in first_user(r)]

    def wait_requests(self, prompt: str, count: int, timeout: float = 60.0) -> list[dict[str, Any]]:
        """Wait until the spawn prompted with ``prompt`` has sent ``count`` requests."""
        return wait_for(
            lambda: len(found := self.requests_for(prompt)) >= count and found,
            timeout,
            f"{count} model request(s) for {prompt!r}",
        )

    def stop(self) -> None:
        # Killed, not terminated: uvicorn's graceful shutdown would wait for the delayed
        # replies a test left in flight, and the fake has no state worth a clean exit.
        self.proc.kill()
        self.proc.wait()


def first_user(request: dict[str, Any]) -> str:
    users = [m for m in request.get("messages", []) if m.get("role") == "user"]
    return str(users[0].get("content") or "") if users else ""


def system_of(request: dict[str, Any]) -> str:
    first = request["messages"][0]
    return str(first["content"]) if first["role"] == "system" else ""


def turn_of(request: dict[str, Any]) -> int:
    """The fake's ``turn`` of a request: assistant messages already in the conversation."""
    return sum(1 for m in request["messages"] if m["role"] == "assistant")


def final(content: str, **rule: Any) -> dict[str, Any]:
    """A fake rule that answers ``content``."""
    return {**rule, "reply": {"content": content}}


def call(tool: str, arguments: dict[str, Any] | None = None, **rule: Any) -> dict[str, Any]:
    """A fake rule that asks for one call of ``tool``."""
    return {**rule, "reply": {"tool_calls": [{"name": tool, "arguments": arguments or {}}]}}


def text_of(events: list[Event]) -> str:
    """The text deltas of ``events``, joined."""
    return "".join(e.text for e in events if e.type == "text")


# -- worker processes --------------------------------------------------------------------------


class Worker(Proc):
    """One ``python -m coordinator worker`` process: forked from the test process's zygote
    unless ``fork`` is false (a test of the process image itself, such as its environ)."""

    def __init__(
        self, name: str, queues: str, cwd: Path, env: dict[str, str], *, fork: bool = True
    ) -> None:
        self.queues = queues
        argv = [sys.executable, "-m", "coordinator", "worker", "-c", "16", "--loglevel=INFO"]
        argv += [f"--queues={queues}", f"--name={name}"]
        super().__init__(name, argv, cwd, env, forked=fork)

    def wait_log(self, text: str, count: int = 1, timeout: float = 30.0) -> None:
        """Wait until the log holds ``text`` ``count`` times; fail early if the worker exits."""
        wait_for(
            lambda: self.log().count(text) >= count or not self.alive(),
            timeout,
            f"{count}x {text!r} in the log of worker {self.name}",
            every=0.1,
        )
        if self.log().count(text) < count:
            raise AssertionError(
                f"worker {self.name} exited ({self.proc.returncode}) before {text!r}"
            )

    def wait_ready(self, timeout: float = START_TIMEOUT) -> Worker:
        self.wait_log(" ready.", timeout=timeout)
        return self


# -- one test's cluster ------------------------------------------------------------------------


class Cluster:
    """The test's registry directory, its workers and a client, all on one Redis database."""

    def __init__(self, root: Path, fake: FakeLLM, redis_url: str, name: str = "") -> None:
        """``name``: the stack's ``ONGRID_CLUSTER`` (none by default)."""
        self.root = root
        self.redis_url = redis_url
        self.fake = fake
        self.redis = redis.Redis.from_url(redis_url)
        self.agents = root / "agents"
        self.agents.mkdir()
        marketplace = root / "marketplace"
        marketplace.mkdir()
        self.count_file = root / "tool-calls.txt"
        self.workers: list[Worker] = []
        dropped = ("ONGRID_", "OPENAI_", "ANTHROPIC_", "REDIS_", "LITELLM_", "CELERY", "FAKE_")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
        self.env.update(
            REDIS_URL=redis_url,
            ONGRID_MARKETPLACE_ROOT=str(marketplace),
            ONGRID_DEFAULT_PROVIDER="openai",
            OPENAI_API_BASE=fake.base_url,
            OPENAI_API_KEY="sk-test",
            PYTHONPATH=str(HERE),
            ONGRID_TOOL_MODULES="site_tools",
            ONGRID_TEST_COUNT_FILE=str(self.count_file),
            ONGRID_LEASE_SECONDS=str(LEASE_SECONDS),
            # Each test's registry holds the personas it writes, not the shipped ones too.
            ONGRID_SHIPPED_AGENTS="0",
            PYTHONUNBUFFERED="1",
        )
        if name:
            self.env["ONGRID_CLUSTER"] = name
        self.settings = Settings.load(
            environ={
                "ONGRID_CLUSTER": name,
                "REDIS_URL": redis_url,
                "ONGRID_AGENTS_DIR": str(self.agents),
                "ONGRID_MARKETPLACE_ROOT": str(marketplace),
                "ONGRID_SHIPPED_AGENTS": "0",
            }
        )
        self._client: SpawnClient | None = None

    # -- registry ------------------------------------------------------------------------------

    def persona(self, name: str, body: str = "", **fields: Any) -> Path:
        """Write ``agents/<name>.md``; ``fields`` go to the frontmatter (``model`` defaults to
        :data:`MODEL`). The client's own registry is reloaded (no broadcast)."""
        front = {
            "name": name,
            "description": f"Test persona {name}.",
            "when_to_use": f"When a test needs {name}.",
            "model": MODEL,
            **fields,
        }
        path = self.agents / f"{name}.md"
        text = f"---\n{yaml.safe_dump(front, sort_keys=False)}---\n\n{body or f'# {name}'}\n"
        path.write_text(text, encoding="utf-8")
        if self._client is not None:
            self._client.registry.reload()
        return path

    @property
    def client(self) -> SpawnClient:
        if self._client is None:
            self._client = SpawnClient(self.settings)
        return self._client

    # -- workers -------------------------------------------------------------------------------

    def start_worker(
        self,
        name: str = "w1",
        queues: str = "ongrid.interactive,ongrid.background",
        *,
        ready: bool = True,
        env: dict[str, str] | None = None,
        fork: bool = True,
    ) -> Worker:
        """Start a worker process; by default wait until Celery says it is ready. ``fork``: see
        :class:`Worker`."""
        worker = Worker(name, queues, self.root, {**self.env, **(env or {})}, fork=fork)
        self.workers.append(worker)
        return worker.wait_ready() if ready else worker

    # -- observations --------------------------------------------------------------------------

    def tool_runs(self) -> list[str]:
        """The names of the tools ``site_tools`` ran, in order, across every worker process."""
        return [name for name, _pid in self._runs()]

    def tool_pids(self) -> list[int]:
        """The worker process of each tool run, in order."""
        return [pid for _name, pid in self._runs()]

    def _runs(self) -> list[tuple[str, int]]:
        if not self.count_file.exists():
            return []
        lines = self.count_file.read_text(encoding="utf-8").splitlines()
        return [(name, int(pid)) for name, pid in (ln.split() for ln in lines)]

    def history(self, session_id: str) -> list[Event]:
        return self.client.bus.history(session_id)

    def wait_status(self, spawn_id: str, *statuses: str, timeout: float = 60.0) -> SpawnRecord:
        def reached() -> SpawnRecord | None:
            record = self.client.store.get(spawn_id)
            return record if record is not None and record.status in statuses else None

        return wait_for(reached, timeout, f"spawn {spawn_id} to be {' or '.join(statuses)}")

    def close(self, failed: bool) -> None:
        for worker in self.workers:
            worker.kill()
        if failed:
            for worker in self.workers:
                print(f"\n===== worker {worker.name} (pid {worker.pid}) =====\n{worker.log()}")
            print(f"\n===== fake LLM rules =====\n{self.fake.script_path.read_text()}")
        if self._client is not None:
            self._client.redis.close()
        self.redis.close()
