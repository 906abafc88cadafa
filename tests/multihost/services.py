"""What runs on the multi-host network: ctl's Redis, PostgreSQL, fake LLM and API, and workers.

Every service of ctl listens on ctl's address only, never on 0.0.0.0, so a worker host reaches
it over its link like a real machine would, and a cut link really cuts it off. Each host has its
own working directory, ``HOME``, ``TMPDIR``, data, agents and marketplace directories under
``/tmp/ongrid-mh-<prefix>/<host>/``; the code and the virtualenv are all they share.

Each process runs in its own process group and logs to ``<host dir>/logs/<name>-….log``;
nothing waits on the wall clock: helpers poll a condition until a generous deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import httpx
import psycopg
import redis
import yaml
from netns import HOSTS, LAB, Network
from processes import Proc, wait_for

__all__ = ["FakeLLM", "Hosts", "Proc", "ServiceMissing", "Worker", "wait_for"]

#: Longest any one wait of the harness lasts (a worker imports litellm and Celery on a loaded
#: 2-core machine).
START_TIMEOUT = 90.0
#: The workers' spawn lease (``ONGRID_LEASE_SECONDS``): short, so a partition's effects show.
LEASE_SECONDS = 3.0
REDIS_PORT, POSTGRES_PORT, API_PORT = 6379, 5432, 8000
DATABASE = "ongrid"
#: The user the admin token speaks for.
ADMIN_USER = "alice"
#: Queues of a general worker, and of the coordinator's.
WORKER_QUEUES = "ongrid.interactive,ongrid.background"
COORDINATOR_QUEUE = "ongrid.coordinator"
#: Inherited variables that would point a process at the test machine's services or keys.
_DROPPED = ("ONGRID_", "OPENAI_", "ANTHROPIC_", "REDIS_", "LITELLM_", "CELERY", "FAKE_")


class ServiceMissing(RuntimeError):
    """A program the ctl host needs (redis-server, PostgreSQL, runuser) is not installed."""


def _program(name: str, *candidates: str) -> str:
    found = shutil.which(name) or next((c for c in candidates if os.access(c, os.X_OK)), None)
    if found is None:
        raise ServiceMissing(f"no {name} on this machine (the ctl host runs it)")
    return found


def _postgres_bin() -> Path:
    """The directory of PostgreSQL's server programs (the newest version installed)."""
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent  # the version's directory, not a symlink's
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3])
    )
    if not versions:
        raise ServiceMissing("no PostgreSQL server programs (initdb) on this machine")
    return versions[-1].parent


# -- processes ---------------------------------------------------------------------------------


class HostProc(Proc):
    """A process on a host: stopped as a whole process group (``ip netns exec`` runs the program
    in the group it leads, and PostgreSQL's children must go with it)."""

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the process group, as an orchestrator stops a process; SIGKILL if it hangs."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=timeout)
        self.kill()  # whatever else the group still holds


class Worker(HostProc):
    """One ``python -m coordinator worker`` process on a host."""

    def __init__(
        self, host: str, name: str, queues: str, argv: list[str], cwd: Path, env: dict[str, str]
    ) -> None:
        self.host = host
        self.queues = queues
        super().__init__(name, argv, cwd, env)

    def wait_log(self, text: str, count: int = 1, timeout: float = 30.0) -> None:
        """Wait until the log holds ``text`` ``count`` times; fail early if the worker exits."""
        wait_for(
            lambda: self.log().count(text) >= count or not self.alive(),
            timeout,
            f"{count}x {text!r} in the log of worker {self.name} on {self.host}",
        )
        if self.log().count(text) < count:
            self.assert_alive()

    def wait_ready(self, timeout: float = START_TIMEOUT) -> Worker:
        """Wait until Celery says the worker is ready."""
        self.wait_log(" ready.", timeout=timeout)
        return self


# -- the fake LLM ------------------------------------------------------------------------------

#: Readers of ctl's services from here never go through a proxy the environment names.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class FakeLLM:
    """The fake OpenAI server on ctl, and its rules file (re-read by the server on change)."""

    def __init__(self, script_path: Path, base_url: str = "") -> None:
        self.script_path = script_path
        self.base_url = base_url
        self._stamp = 0

    def script(self, rules: list[dict[str, Any]]) -> None:
        """Replace the rules: atomically, with a fresh mtime, so the server never reads half a
        file and always notices the change."""
        partial = self.script_path.with_suffix(".tmp")
        partial.write_text(json.dumps(rules), encoding="utf-8")
        self._stamp = max(time.time_ns(), self._stamp + 1_000_000)
        os.utime(partial, ns=(self._stamp, self._stamp))
        partial.replace(self.script_path)

    def _get(self, path: str) -> Any:
        with _DIRECT.open(f"{self.base_url.removesuffix('/v1')}{path}", timeout=10) as response:
            return json.loads(response.read())

    def requests(self) -> list[dict[str, Any]]:
        """Every chat request the server received, in order."""
        return list(self._get("/_requests"))

    def key_digests(self) -> list[str]:
        """The SHA-256 of each chat request's bearer key, in order."""
        return list(self._get("/_keys"))

    def peers(self) -> list[str]:
        """The client address of each chat request (which host asked), in order."""
        return list(self._get("/_peers"))

    def arrivals(self) -> list[tuple[dict[str, Any], str, float]]:
        """Each chat request with the host that sent it and when it arrived (unix time)."""
        times = list(self._get("/_arrivals"))
        peers, requests = self.peers(), self.requests()  # read last: never fewer than times
        return list(zip(requests, peers, times, strict=False))


# -- the hosts ---------------------------------------------------------------------------------


class Hosts:
    """ctl's services and the workers of w1 and w2 on a :class:`~netns.Network`.

    :meth:`start` brings up Redis, PostgreSQL (a fresh cluster, database ``ongrid``), the fake
    LLM and the API on ctl, then with ``workers`` a general worker on each of w1 and w2 (named
    after its host) and with ``coordinator`` a worker of ``ongrid.coordinator`` on w2 (the
    API's ``/readyz`` wants every queue served).
    """

    def __init__(self, network: Network, *, workers: bool = True, coordinator: bool = False):
        self.network = network
        self.ctl_addr = network.addr("ctl")
        self.redis_url = f"redis://{self.ctl_addr}:{REDIS_PORT}/0"
        self.database_url = (
            f"postgresql+psycopg://postgres@{self.ctl_addr}:{POSTGRES_PORT}/{DATABASE}"
        )
        self.api_url = f"http://{self.ctl_addr}:{API_PORT}"
        self._token = secrets.token_urlsafe(24)
        self._with_workers, self._with_coordinator = workers, coordinator
        self.procs: list[Proc] = []
        self.workers: dict[str, Worker] = {}
        self.fake = FakeLLM(self.dir("ctl") / "fake-rules.json")
        self._fake_port_file = self.dir("ctl") / "fake-port"
        self._api: httpx.Client | None = None
        self._redis: redis.Redis | None = None
        self._postgres: Proc | None = None

    # -- where things are ----------------------------------------------------------------------

    def dir(self, host: str) -> Path:
        """``host``'s own directory: its working directory, ``HOME`` and data live here."""
        self.network.namespace(host)  # names the hosts if ``host`` is not one
        return self.network.root / host

    def addr(self, host: str) -> str:
        return self.network.addr(host)

    @property
    def api(self) -> httpx.Client:
        """A client of the API, as the admin (the token never appears in a log)."""
        if self._api is None:
            self._api = httpx.Client(
                base_url=self.api_url,
                headers={"Authorization": f"Bearer {self._token}"},
                timeout=30,
                trust_env=False,
            )
        return self._api

    @property
    def redis(self) -> redis.Redis:
        """A client of ctl's Redis, from the test process."""
        if self._redis is None:
            self._redis = redis.Redis.from_url(self.redis_url, socket_timeout=10)
        return self._redis

    def env(self, host: str, **extra: str) -> dict[str, str]:
        """The environment of an ongrid process on ``host``: this one's, less what would point
        it elsewhere, plus ctl's services and ``host``'s own directories."""
        home = self.dir(host)
        env = {k: v for k, v in os.environ.items() if not k.startswith(_DROPPED)}
        env.update(
            HOME=str(home / "home"),
            TMPDIR=str(home / "tmp"),
            REDIS_URL=self.redis_url,
            ONGRID_DATABASE_URL=self.database_url,
            ONGRID_CONFIG=str(home / "config.yaml"),
            ONGRID_MARKETPLACE_ROOT=str(home / "marketplace"),
            ONGRID_AGENTS_DIR=str(home / "agents"),
            ONGRID_DATA_DIR=str(home / "data"),
            # The tests' own personas, not the shipped ones too.
            ONGRID_SHIPPED_AGENTS="0",
            ONGRID_LEASE_SECONDS=str(LEASE_SECONDS),
            PYTHONUNBUFFERED="1",
        )
        env.update(extra)
        return env

    def _worker_env(self, host: str) -> dict[str, str]:
        return self.env(
            host,
            OPENAI_API_BASE=self.fake.base_url,
            OPENAI_API_KEY="sk-test",
            ONGRID_DEFAULT_PROVIDER="openai",
        )

    def _make_dirs(self) -> None:
        for host in HOSTS:
            home = self.dir(host)
            for sub in ("home", "tmp", "marketplace", "agents", "data", "logs"):
                (home / sub).mkdir(parents=True, exist_ok=True)
            home.chmod(0o755)
            (home / "config.yaml").write_text("{}\n", encoding="utf-8")
        grants = {self._token: {"user": ADMIN_USER, "role": "admin"}}
        config = self.dir("ctl") / "config.yaml"
        config.write_text(yaml.safe_dump({"auth": {"tokens": grants}}), encoding="utf-8")
        config.chmod(0o600)

    def _spawn(self, host: str, name: str, argv: list[str], env: dict[str, str]) -> Proc:
        proc = HostProc(name, self.network.argv(host, argv), self.dir(host), env)
        self.procs.append(proc)
        return proc

    # -- starting ------------------------------------------------------------------------------

    def start(self) -> Hosts:
        """Bring everything up, each wait bounded; on failure the caller :meth:`close`\\ s."""
        self._make_dirs()
        redis_server = self._start_redis()
        fake = self._start_fake()
        postgres = self._start_postgres()
        self._wait_redis(redis_server)
        self._wait_postgres(postgres)
        self._wait_fake(fake)
        api_argv = self._ongrid("api", "--host", self.ctl_addr, "--port", str(API_PORT))
        api = self._spawn("ctl", "api", api_argv, self.env("ctl"))
        if self._with_workers:
            for host in ("w1", "w2"):
                self.start_worker(host, host, ready=False)
        if self._with_coordinator:
            self.start_worker("w2", "coord", COORDINATOR_QUEUE, ready=False)
        self._wait_api(api)
        for worker in self.workers.values():
            worker.wait_ready()
        return self

    def _ongrid(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "coordinator", *args]

    def _start_redis(self) -> Proc:
        argv = [_program("redis-server", "/usr/bin/redis-server", "/usr/sbin/redis-server")]
        argv += ["--bind", self.ctl_addr, "--port", str(REDIS_PORT), "--save", ""]
        argv += ["--appendonly", "no", "--protected-mode", "no", "--dir", str(self.dir("ctl"))]
        return self._spawn("ctl", "redis", argv, self.env("ctl"))

    def _wait_redis(self, proc: Proc) -> None:
        def answers() -> bool:
            proc.assert_alive()
            try:
                return bool(self.redis.ping())
            except redis.RedisError:
                return False

        wait_for(answers, START_TIMEOUT, f"Redis on {self.ctl_addr}")

    def _as_postgres(self, program: str, *args: str) -> list[str]:
        """``program`` of PostgreSQL as its user (its tools refuse to run as root)."""
        runuser = _program("runuser", "/usr/sbin/runuser", "/sbin/runuser")
        return [runuser, "-u", "postgres", "--", str(_postgres_bin() / program), *args]

    def _start_postgres(self) -> Proc:
        """initdb a fresh cluster in ``<ctl>/pg`` and start its server in ctl's namespace."""
        data = self.dir("ctl") / "pg"
        data.mkdir(mode=0o700)
        shutil.chown(data, "postgres", "postgres")
        argv = self._as_postgres("initdb", "-D", str(data), "--auth=trust", "-U", "postgres")
        argv += ["-E", "UTF8", "--locale=C", "--no-sync"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=START_TIMEOUT)
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed ({done.returncode}): {done.stderr.strip()}")
        assert self.network.subnet is not None
        with open(data / "pg_hba.conf", "a", encoding="utf-8") as hba:
            hba.write(f"host all all {self.network.subnet} trust\n")
        argv = self._as_postgres(
            "postgres", "-D", str(data), "-c", f"listen_addresses={self.ctl_addr}",
            "-c", f"port={POSTGRES_PORT}", "-c", f"unix_socket_directories={data}",
            "-c", "fsync=off",
        )  # fmt: skip
        self._postgres = self._spawn("ctl", "postgres", argv, self.env("ctl"))
        return self._postgres

    def _wait_postgres(self, proc: Proc) -> None:
        def connection() -> psycopg.Connection[Any] | None:
            proc.assert_alive()
            try:
                return psycopg.connect(
                    host=self.ctl_addr,
                    port=POSTGRES_PORT,
                    user="postgres",
                    dbname="postgres",
                    connect_timeout=3,
                    autocommit=True,
                )
            except psycopg.OperationalError:
                return None

        conn = wait_for(connection, START_TIMEOUT, f"PostgreSQL on {self.ctl_addr}")
        assert conn is not None  # wait_for returns only what is truthy
        with conn:
            conn.execute(f'CREATE DATABASE "{DATABASE}"')

    def _start_fake(self) -> Proc:
        self.fake.script([])
        argv = [sys.executable, "-m", "workers.testing.fake_openai", "--host", self.ctl_addr]
        argv += ["--port", "0", "--port-file", str(self._fake_port_file)]
        argv += ["--script", str(self.fake.script_path)]
        return self._spawn("ctl", "fake-llm", argv, self.env("ctl"))

    def _wait_fake(self, proc: Proc) -> None:
        def port() -> str:
            proc.assert_alive()
            return self._fake_port_file.read_text().strip() if self._fake_port_file.exists() else ""

        self.fake.base_url = f"http://{self.ctl_addr}:{wait_for(port, 30, 'the fake LLM')}/v1"

    def _wait_api(self, proc: Proc) -> None:
        def answers() -> bool:
            proc.assert_alive()
            try:
                return self.api.get("/healthz", timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(answers, START_TIMEOUT, f"the API on {self.api_url} to answer /healthz")

    # -- workers -------------------------------------------------------------------------------

    def start_worker(
        self,
        host: str,
        name: str,
        queues: str = WORKER_QUEUES,
        *,
        env: dict[str, str] | None = None,
        concurrency: int = 4,
        ready: bool = True,
    ) -> Worker:
        """Start ``python -m coordinator worker`` on ``host`` (a worker of that ``name`` already
        running is killed first); ``env`` adds to or overrides the host's environment. By
        default waits until Celery says it is ready (a worker expected to fail: ``ready=False``).
        """
        if host == LAB or host not in HOSTS:
            raise ValueError(f"workers run on a host of their own: {', '.join(HOSTS)}")
        if name in self.workers:
            self.workers.pop(name).kill()
        argv = self._ongrid("worker", f"--queues={queues}", f"--name={name}")
        argv += [f"--concurrency={concurrency}", "--loglevel=INFO"]
        worker = Worker(
            host,
            name,
            queues,
            self.network.argv(host, argv),
            self.dir(host),
            {**self._worker_env(host), **(env or {})},
        )
        self.procs.append(worker)
        self.workers[name] = worker
        return worker.wait_ready() if ready else worker

    # -- the network ---------------------------------------------------------------------------

    def cut(self, host: str) -> None:
        """Partition ``host`` (packets dropped, connections stall, nothing is reset)."""
        self.network.cut(host)

    def restore(self, host: str) -> None:
        self.network.restore(host)

    def connect(self, host: str, addr: str, port: int, timeout: float = 3.0) -> str:
        """One TCP connect from ``host``: ``connected``, ``timeout`` or the errno's name."""
        return self.network.connect(host, addr, port, timeout)

    def reachable(self, host: str, addr: str, port: int, timeout: float = 3.0) -> bool:
        return self.network.reachable(host, addr, port, timeout)

    def python(self, host: str, code: str, timeout: float = 60.0) -> str:
        """Run ``code`` with this interpreter on ``host`` (its environment); its stdout, or an
        AssertionError with its stderr."""
        argv = self.network.argv(host, [sys.executable, "-c", code])
        done = subprocess.run(
            argv,
            cwd=self.dir(host),
            env=self._worker_env(host),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if done.returncode != 0:
            raise AssertionError(f"python on {host} exited {done.returncode}: {done.stderr}")
        return done.stdout

    # -- teardown ------------------------------------------------------------------------------

    def report(self) -> str:
        """The tail of every process's log, for a failed test's output."""
        parts = []
        for proc in self.procs:
            state = "running" if proc.alive() else f"exit {proc.proc.returncode}"
            tail = "\n".join(proc.log().splitlines()[-150:])
            parts.append(f"===== {proc.name} ({state}, {proc.log_path}) =====\n{tail}")
        return "\n".join(parts)

    def close(self) -> None:
        """Stop every process started: the ongrid ones at once, PostgreSQL with a fast shutdown
        (a killed server would leave its shared memory behind)."""
        for client in (self._api, self._redis):
            if client is not None:
                client.close()
        for proc in self.procs:
            if proc is not self._postgres:
                proc.kill()
        if self._postgres is not None and self._postgres.alive():
            data = str(self.dir("ctl") / "pg")
            argv = self._as_postgres("pg_ctl", "stop", "-D", data, "-m", "fast", "-t", "30")
            with contextlib.suppress(subprocess.TimeoutExpired):
                subprocess.run(argv, capture_output=True, timeout=45)
            self._postgres.stop(timeout=15)
