"""docker-compose.yml kept true without a container engine.

No Docker engine runs here, so the file is read as data and held against the code: each
``ongrid`` command line parses with the real CLI (nothing runs), every environment variable a
service sets is one the code reads, the services cover Redis, PostgreSQL, the API, every worker
queue and Flower, and they reach each other by service name (never loopback: each service is
its own host), once what they need is healthy. The checkers return problems naming the
service; the last tests feed them a broken file to show that they can fail.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
import pytest
import yaml
from click.core import ParameterSource
from flower.command import is_flower_envvar, is_flower_option

from coordinator.cli import _SPECIALIST_QUEUES, main
from registry.errors import OngridError
from registry.settings import _ENV, _ENV_CSV, _ENV_LISTS, LOCAL_TOKEN_ENV, Settings
from workers.celery_app import QUEUES
from workers.embedded_redis import DENIED_COMMANDS, RUNTIME_USER
from workers.hardening import ProviderCredentials, is_secret

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"
#: The image's data directory (ONGRID_DATA_DIR in the Dockerfile): generated logins live there.
DATA_DIR = "/var/lib/ongrid/data"

#: Every variable :meth:`Settings.load` reads.
SETTINGS_VARIABLES = frozenset({*_ENV, *_ENV_LISTS, *_ENV_CSV, LOCAL_TOKEN_ENV})
#: The images' own variables, allowed in their services only.
IMAGE_VARIABLES = {
    # redis-cli's password, for the healthcheck.
    "redis": frozenset({"REDISCLI_AUTH"}),
    "postgres": frozenset(
        {
            "POSTGRES_USER",
            "POSTGRES_PASSWORD",
            "POSTGRES_DB",
            "POSTGRES_INITDB_ARGS",
            "POSTGRES_HOST_AUTH_METHOD",
            "PGDATA",
        }
    ),
}
_INTERPOLATION = re.compile(
    r"\$\$|\$\{(?P<name>[A-Za-z_]\w*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}|\$(?P<bare>[A-Za-z_]\w*)"
)


def _source(module: str) -> str:
    """The source of ``module``, found without importing it (importing litellm is slow)."""
    top, *rest = module.split(".")
    spec = importlib.util.find_spec(top)
    assert spec is not None and spec.origin is not None, module
    path = Path(spec.origin).parent.joinpath(*rest) if rest else Path(spec.origin)
    return (path.with_suffix(".py") if rest else path).read_text(encoding="utf-8")


def _provider_key_read(variable: str, provider: str) -> bool:
    """Whether a worker takes ``variable`` as ``provider``'s key and hands it to litellm."""
    return ProviderCredentials.from_environ({variable: "k"}).for_provider(provider) == {
        "api_key": "k"
    }


@dataclass(frozen=True)
class Reader:
    """A variable the code reads outside the settings: ``still_read`` checks that it does."""

    still_read: Callable[[], bool]
    #: The ``ongrid`` subcommands whose services may set it (None: any).
    commands: frozenset[str] | None = None


#: Variables read on purpose outside :class:`Settings`, each checked against its reader so that
#: one no code reads any more fails here instead of lingering in the compose file.
OTHER_READERS: dict[str, Reader] = {
    # The settings file, which Settings.load reads before the variables of its tables.
    "ONGRID_CONFIG": Reader(lambda: 'env.get("ONGRID_CONFIG")' in _source("registry.settings")),
    "OPENAI_API_KEY": Reader(lambda: _provider_key_read("OPENAI_API_KEY", "openai")),
    "ANTHROPIC_API_KEY": Reader(lambda: _provider_key_read("ANTHROPIC_API_KEY", "anthropic")),
    # Not a secret, so hardening leaves it in os.environ, where litellm reads it itself.
    "OPENAI_API_BASE": Reader(
        lambda: not is_secret("OPENAI_API_BASE") and "OPENAI_API_BASE" in _source("litellm.main")
    ),
    # `ongrid api --local-admin` takes it as the local admin's token (generated when unset).
    "ONGRID_ADMIN_TOKEN": Reader(
        lambda: '"ONGRID_ADMIN_TOKEN"' in _source("coordinator.cli"), commands=frozenset({"api"})
    ),
    # `ongrid flower` generates a login unless it is set; Flower reads it as --basic_auth.
    "FLOWER_BASIC_AUTH": Reader(
        lambda: (
            is_flower_envvar("FLOWER_BASIC_AUTH")
            and '"FLOWER_BASIC_AUTH"' in _source("coordinator.cli")
        ),
        commands=frozenset({"flower"}),
    ),
}


# -- reading the file --------------------------------------------------------------------------


def interpolate(value: str) -> str:
    """``value`` as compose would make it with no host variable set: ``${X:-d}`` gives ``d``, a
    required ``${X:?msg}`` a placeholder ``<X>``, anything else unset the empty string."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        op = match.group("op") or ""
        if op.endswith("-"):
            return match.group("arg")
        if op.endswith("?"):
            return f"<{match.group('name')}>"
        return ""

    return _INTERPOLATION.sub(one, value)


def required_variables(value: str) -> set[str]:
    """Host variables ``value`` refuses to start without (``${X:?msg}``)."""
    return {
        m.group("name") for m in _INTERPOLATION.finditer(value) if (m.group("op") or "")[-1:] == "?"
    }


def load_services(text: str) -> dict[str, dict[str, Any]]:
    """The services of a compose text, ``<<: *anchor`` merges resolved."""
    data = yaml.safe_load(text)
    assert isinstance(data, dict) and isinstance(data.get("services"), dict), "no services"
    return {name: dict(service or {}) for name, service in data["services"].items()}


def raw_environment(service: dict[str, Any]) -> dict[str, str]:
    """A service's ``environment`` (mapping or ``KEY=value`` list), values not interpolated."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.partition("=")[::2] for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def environment(service: dict[str, Any]) -> dict[str, str]:
    return {k: interpolate(v) for k, v in raw_environment(service).items()}


def command(service: dict[str, Any]) -> list[str] | None:
    cmd = service.get("command")
    if cmd is None:
        return None
    return [interpolate(str(a)) for a in (shlex.split(cmd) if isinstance(cmd, str) else cmd)]


def image_kind(service: dict[str, Any]) -> str:
    """``redis``, ``postgres`` (by image), ``ongrid`` (built from this repository) or ``other``."""
    if "build" in service:
        return "ongrid"
    image = str(service.get("image", "")).rsplit("/", 1)[-1]
    return next((kind for kind in IMAGE_VARIABLES if image.startswith(kind)), "other")


def depends_on(service: dict[str, Any]) -> list[str]:
    deps = service.get("depends_on") or []
    return list(deps)  # the long form is a mapping keyed by service name


def parse_ongrid(args: list[str]) -> click.Context:
    """``ongrid ARGS`` parsed by the real click commands, nothing invoked: the innermost
    context. Raises :class:`click.ClickException` (or ``Exit``, for ``--help``) as the CLI would."""
    ctx = main.make_context("ongrid", list(args), resilient_parsing=False)
    while isinstance(ctx.command, click.Group):
        # What a group leaves for its subcommand (click keeps it there until invoke).
        rest = [*ctx._protected_args, *ctx.args]
        name, sub, sub_args = ctx.command.resolve_command(ctx, rest)
        assert sub is not None and name is not None
        ctx = sub.make_context(name, sub_args, parent=ctx, resilient_parsing=False)
    return ctx


def ongrid_contexts(services: dict[str, dict[str, Any]]) -> dict[str, click.Context]:
    """The parsed command of every service that runs ``ongrid`` and parses."""
    parsed: dict[str, click.Context] = {}
    for name, service in services.items():
        argv = command(service)
        if image_kind(service) == "ongrid" and (argv is None or argv[:1] == ["ongrid"]):
            try:
                # No command: the image's CMD, a plain `ongrid worker`.
                parsed[name] = parse_ongrid(argv[1:] if argv else ["worker"])
            except (click.ClickException, click.exceptions.Exit):
                continue
    return parsed


def served_queues(ctx: click.Context) -> set[str]:
    """The queues an ``ongrid worker`` consumes (coordinator turns in its child, if any)."""
    queues = ctx.params["queues"]
    if queues is None:
        child = {QUEUES["coordinator"]} if ctx.params["coordinator_slots"] else set()
        return {*_SPECIALIST_QUEUES.split(","), *child}
    return {q.strip() for q in queues.split(",") if q.strip()}


# -- checkers ----------------------------------------------------------------------------------


def command_problems(services: dict[str, dict[str, Any]]) -> list[str]:
    """Commands that the CLI refuses, non-ongrid commands outside Redis/PostgreSQL, Flower
    options that Flower does not have."""
    problems: list[str] = []
    for name, service in services.items():
        kind, argv = image_kind(service), command(service)
        if kind in ("redis", "postgres"):
            continue
        if kind == "other":
            problems.append(f"{name}: neither built from this repository nor Redis/PostgreSQL")
            continue
        if argv is not None and argv[:1] != ["ongrid"]:
            problems.append(f"{name}: command {argv!r} is not an ongrid command")
            continue
        try:
            ctx = parse_ongrid(argv[1:] if argv else ["worker"])
        except click.ClickException as exc:
            problems.append(f"{name}: `{shlex.join(argv or [])}`: {exc.format_message()}")
            continue
        except click.exceptions.Exit:
            problems.append(f"{name}: `{shlex.join(argv or [])}` exits while parsing (--help?)")
            continue
        if ctx.command.name == "flower":
            problems.extend(f"{name}: {p}" for p in _flower_option_problems(ctx))
    return problems


def _flower_option_problems(ctx: click.Context) -> list[str]:
    """``ongrid flower`` hands its options to Flower as ``--name=value``: each must be Flower's."""
    problems = []
    for param in ctx.command.params:
        if (
            not param.name
            or ctx.get_parameter_source(param.name) is not ParameterSource.COMMANDLINE
        ):
            continue
        if param.type is click.UNPROCESSED:  # passed through as given
            given = ctx.params[param.name] or ()
            problems += [f"Flower has no option {a!r}" for a in given if not is_flower_option(a)]
        elif not is_flower_option(f"--{param.name}="):
            problems.append(f"Flower has no option --{param.name} (ongrid flower passes it on)")
    return problems


def environment_problems(services: dict[str, dict[str, Any]]) -> list[str]:
    """Variables no code reads, image variables outside their image, values the settings refuse."""
    problems: list[str] = []
    contexts = ongrid_contexts(services)
    for name, service in services.items():
        kind, env = image_kind(service), environment(service)
        if kind in IMAGE_VARIABLES:
            problems += [
                f"{name}: {var} is not a variable of the {kind} image"
                for var in env
                if var not in IMAGE_VARIABLES[kind]
            ]
            continue
        subcommand = contexts[name].command.name if name in contexts else None
        for var in env:
            reader = OTHER_READERS.get(var)
            if var in SETTINGS_VARIABLES:
                continue
            if reader is None:
                problems.append(f"{name}: no code reads {var}")
            elif reader.commands is not None and subcommand not in reader.commands:
                problems.append(
                    f"{name}: {var} is read only by `ongrid {'/'.join(reader.commands)}`"
                )
        try:
            Settings.load({k: v for k, v in env.items() if k in SETTINGS_VARIABLES})
        except OngridError as exc:
            problems.append(f"{name}: the settings refuse its environment: {exc}")
    return problems


def stale_readers() -> list[str]:
    """Entries of :data:`OTHER_READERS` whose reader no longer reads them."""
    return [var for var, reader in OTHER_READERS.items() if not reader.still_read()]


def coverage_problems(services: dict[str, dict[str, Any]]) -> list[str]:
    """Redis, PostgreSQL, the API, Flower and a worker for every queue, each present."""
    kinds = {image_kind(s) for s in services.values()}
    contexts = ongrid_contexts(services)
    commands = {ctx.command.name for ctx in contexts.values()}
    problems = [f"no {kind} service" for kind in ("redis", "postgres") if kind not in kinds]
    problems += [f"no service runs `ongrid {c}`" for c in ("api", "flower") if c not in commands]
    served: set[str] = set()
    for name, ctx in contexts.items():
        if ctx.command.name == "worker":
            queues = served_queues(ctx)
            served |= queues
            unknown = sorted(queues - set(QUEUES.values()))
            if unknown:
                problems.append(f"{name}: consumes unknown queue(s) {', '.join(unknown)}")
    problems += [f"no worker consumes {q}" for q in QUEUES.values() if q not in served]
    return problems


def wiring_problems(services: dict[str, dict[str, Any]]) -> list[str]:
    """Broker and database reached by service name, waited for until healthy, credentials that
    match PostgreSQL's, ``depends_on`` naming services."""
    problems: list[str] = []
    by_kind = {image_kind(s): n for n, s in services.items() if image_kind(s) != "ongrid"}
    contexts = ongrid_contexts(services)
    for name, service in services.items():
        deps = depends_on(service)
        problems += [f"{name}: depends on unknown service {d!r}" for d in deps if d not in services]
        if image_kind(service) != "ongrid":
            continue
        needs = {"REDIS_URL": "redis"}
        sub = contexts.get(name)
        if sub is not None and sub.command.name in ("api", "worker"):
            needs["ONGRID_DATABASE_URL"] = "postgres"
        for var, kind in needs.items():
            host = urlsplit(environment(service).get(var, "")).hostname
            if host is None or host != by_kind.get(kind):
                problems.append(f"{name}: {var} must name the {kind} service, not {host!r}")
            else:
                problems += [f"{name}: {p}" for p in _readiness_problems(service, services, host)]
        problems += [f"{name}: {p}" for p in _credential_problems(service, services, by_kind)]
    return problems


def _readiness_problems(
    service: dict[str, Any], services: dict[str, dict[str, Any]], needed: str
) -> list[str]:
    """A process that cannot reach Redis or PostgreSQL at start exits (no restart policy): it
    must wait until ``needed`` is healthy, which needs a healthcheck there, run without a shell."""
    deps = service.get("depends_on") or []
    if needed not in deps:
        return [f"does not depend on {needed}"]
    condition = deps[needed].get("condition") if isinstance(deps, dict) else None
    if condition != "service_healthy":
        return [f"does not wait for {needed} to be healthy (condition: service_healthy)"]
    test = (services[needed].get("healthcheck") or {}).get("test") or []
    if not isinstance(test, list) or test[:1] != ["CMD"]:
        return [f"{needed} has no healthcheck test in CMD form"]
    return []


def _credential_problems(
    service: dict[str, Any], services: dict[str, dict[str, Any]], by_kind: dict[str, str]
) -> list[str]:
    """``ONGRID_DATABASE_URL``'s user, password and database are the postgres service's."""
    database = urlsplit(environment(service).get("ONGRID_DATABASE_URL", ""))
    postgres = environment(services.get(by_kind.get("postgres", ""), {}))
    expected = (
        postgres.get("POSTGRES_USER"),
        postgres.get("POSTGRES_PASSWORD"),
        "/" + postgres.get("POSTGRES_DB", postgres.get("POSTGRES_USER", "")),
    )
    if database.hostname and (database.username, database.password, database.path) != expected:
        return ["ONGRID_DATABASE_URL does not match the postgres service"]
    return []


def exposure_problems(services: dict[str, dict[str, Any]]) -> list[str]:
    """What the comments promise: workers that run commands get the seccomp and /proc bubblewrap
    needs and coordinator-only workers do not; Flower requires its login or keeps a generated one
    in a volume, and is published on loopback."""
    problems: list[str] = []
    commands_queues = {QUEUES["interactive"], QUEUES["background"]}
    for name, ctx in ongrid_contexts(services).items():
        service = services[name]
        if ctx.command.name == "worker":
            options = set(service.get("security_opt") or [])
            unconfined = {"seccomp=unconfined", "systempaths=unconfined"} <= options
            if bool(served_queues(ctx) & commands_queues) != unconfined:
                state = "has" if unconfined else "lacks"
                problems.append(
                    f"{name}: {state} seccomp=unconfined and systempaths=unconfined for the "
                    "queues it serves"
                )
        elif ctx.command.name == "flower":
            auth = raw_environment(service).get("FLOWER_BASIC_AUTH", "")
            kept = any(str(v).split(":")[1:2] == [DATA_DIR] for v in service.get("volumes") or [])
            if "FLOWER_BASIC_AUTH" not in required_variables(auth) and not kept:
                problems.append(
                    f"{name}: FLOWER_BASIC_AUTH must be required (${{...:?}}) or generated into "
                    f"a volume at {DATA_DIR}"
                )
            problems += [
                f"{name}: port {p!r} is published beyond loopback"
                for p in service.get("ports") or []
                if not str(p).startswith("127.0.0.1:")
            ]
    return problems


def redis_problems(services: dict[str, dict[str, Any]]) -> list[str]:
    """Redis is never open: its default user off, the runtime's user with a required password
    and none of the commands that act on the server, every ``REDIS_URL`` signing in as it, a
    healthcheck that fails when it cannot sign in, and no published port."""
    name = next((n for n, s in services.items() if image_kind(s) == "redis"), None)
    if name is None:
        return ["no redis service"]
    service = services[name]
    words = [str(w) for w in service.get("command") or []]
    # Each `--user` takes the words up to the next `--option`, as redis-server reads them.
    starts = [i for i, w in enumerate(words) if w.startswith("--")] + [len(words)]
    users = [
        " ".join(words[i + 1 : end])
        for i, end in zip(starts, starts[1:], strict=False)
        if words[i] == "--user"
    ]
    problems = []
    if "default off" not in users:
        problems.append(f"{name}: the default user is not switched off (--user 'default off')")
    rule = next((u for u in users if u.split()[:2] == [RUNTIME_USER, "on"]), "")
    found = re.search(r">(\$\{[^}]*\}|\S+)", rule)
    password = found.group(1) if found else ""
    if "REDIS_PASSWORD" not in required_variables(password):
        problems.append(f"{name}: user {RUNTIME_USER} needs the required ${{REDIS_PASSWORD:?}}")
    allowed = [c for c in DENIED_COMMANDS if f"-{c}" not in rule.split()]
    if allowed:
        problems.append(f"{name}: user {RUNTIME_USER} may run {', '.join(allowed)}")
    if service.get("ports"):
        problems.append(f"{name}: Redis is published ({service['ports']})")
    test = (service.get("healthcheck") or {}).get("test") or []
    signs_in = "REDISCLI_AUTH" in raw_environment(service) and "--user" in test
    if not (signs_in and "-e" in test):
        problems.append(f"{name}: the healthcheck must sign in and fail on a refusal (-e)")
    for other, svc in services.items():
        url = raw_environment(svc).get("REDIS_URL")
        if url is None:
            continue
        parts = urlsplit(interpolate(url))
        if parts.username != RUNTIME_USER or parts.password != "<REDIS_PASSWORD>":
            problems.append(f"{other}: REDIS_URL does not sign in as {RUNTIME_USER}")
    return problems


def volume_problems(text: str) -> list[str]:
    """Named volumes that services mount but the file does not declare."""
    data = yaml.safe_load(text)
    declared = set(data.get("volumes") or {})
    problems = []
    for name, service in load_services(text).items():
        for spec in service.get("volumes") or []:
            source, sep, _ = str(spec).partition(":")
            named = sep and not source.startswith((".", "/", "~", "$"))
            if named and source not in declared:
                problems.append(f"{name}: volume {source!r} is not declared")
    return problems


# -- the file itself ---------------------------------------------------------------------------


def _services() -> dict[str, dict[str, Any]]:
    return load_services(COMPOSE.read_text(encoding="utf-8"))


def test_every_ongrid_command_parses() -> None:
    assert command_problems(_services()) == []


def test_every_variable_is_read() -> None:
    assert stale_readers() == []
    assert environment_problems(_services()) == []


def test_the_services_cover_the_runtime() -> None:
    assert coverage_problems(_services()) == []


def test_the_services_reach_each_other_by_name() -> None:
    assert wiring_problems(_services()) == []


def test_the_comments_on_exposure_hold() -> None:
    assert exposure_problems(_services()) == []


def test_redis_is_never_open() -> None:
    assert redis_problems(_services()) == []


def test_named_volumes_are_declared() -> None:
    assert volume_problems(COMPOSE.read_text(encoding="utf-8")) == []


# -- the checkers can fail ---------------------------------------------------------------------

BROKEN = """
x-app: &app
  build: .
  environment:
    REDIS_URL: redis://127.0.0.1:6379/0
    ONGRID_DATABASE_URL: postgresql+psycopg://ongrid:wrong@db:5432/ongrid
    ONGRID_DEFALT_MODEL: gpt-4o
    ONGRID_LEASE_SECONDS: soon
    POSTGRES_USER: ongrid
  depends_on: [db, cache]
services:
  db:
    image: postgres:16-alpine
    environment: {POSTGRES_USER: ongrid, POSTGRES_PASSWORD: ongrid, REDIS_URL: x}
  worker:
    <<: *app
    command: ["ongrid", "worker", "--queue", "ongrid.interactive"]
  worker-bg:
    <<: *app
    command: "ongrid worker --queues ongrid.backgrund --concurrency ${CONCURRENCY:-8}"
  api:
    <<: *app
    command: ["ongrid", "api", "--port", "${API_PORT:-http}"]
  beat:
    <<: *app
    command: ["celery", "-A", "workers.app", "beat"]
  flower:
    build: .
    command: ["ongrid", "flower", "--port=5555"]
    environment: {FLOWER_BASIC_AUTH: "${FLOWER_BASIC_AUTH:-admin:admin}"}
    ports: ["5555:5555"]
    volumes: ["plugins:/var/lib/ongrid/agents"]
  flower-auth:
    build: .
    command: ["ongrid", "flower", "--basic-auth=a:b"]
"""


def _mentions(problems: list[str], *fragments: str) -> bool:
    return any(all(f in p for f in fragments) for p in problems)


def test_interpolation_recognises_each_form() -> None:
    assert interpolate("${A:-x}/${B-y}/${C:?say}/${D}/$E/$$") == "x/y/<C>///$"
    assert required_variables("${C:?say} ${D:-z} ${F?also}") == {"C", "F"}


def test_broken_commands_are_found() -> None:
    problems = command_problems(load_services(BROKEN))
    assert _mentions(problems, "worker:", "--queue")
    assert _mentions(problems, "api:", "'http' is not a valid integer")
    assert _mentions(problems, "beat:", "not an ongrid command")
    assert _mentions(problems, "flower-auth:", "--basic-auth")


def test_broken_environment_is_found() -> None:
    problems = environment_problems(load_services(BROKEN))
    assert _mentions(problems, "no code reads ONGRID_DEFALT_MODEL")
    assert _mentions(problems, "no code reads POSTGRES_USER")
    assert _mentions(problems, "db:", "REDIS_URL is not a variable of the postgres image")
    assert _mentions(problems, "lease_seconds")


def test_a_stale_reader_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(OTHER_READERS, "GONE_API_BASE", Reader(lambda: False))
    assert stale_readers() == ["GONE_API_BASE"]


def test_missing_services_and_queues_are_found() -> None:
    problems = coverage_problems(load_services(BROKEN))
    assert "no redis service" in problems
    assert "no service runs `ongrid api`" in problems
    assert "worker-bg: consumes unknown queue(s) ongrid.backgrund" in problems
    assert "no worker consumes ongrid.coordinator" in problems


def test_a_plain_worker_serves_every_queue() -> None:
    """The image's CMD, a plain `ongrid worker`, serves all queues; without its coordinator
    child, not the coordinator's."""
    plain = load_services("services:\n  w:\n    build: .\n")
    assert served_queues(parse_ongrid(["worker"])) == set(QUEUES.values())
    assert not _mentions(coverage_problems(plain), "no worker consumes")
    alone = load_services(
        "services:\n  w:\n    build: .\n    command: ongrid worker -c 4 --coordinator-slots 0\n"
    )
    assert _mentions(coverage_problems(alone), "no worker consumes ongrid.coordinator")


def test_broken_wiring_and_exposure_are_found() -> None:
    services = load_services(BROKEN)
    wiring = wiring_problems(services)
    assert _mentions(wiring, "depends on unknown service 'cache'")
    assert _mentions(wiring, "REDIS_URL must name the redis service, not '127.0.0.1'")
    assert _mentions(wiring, "ONGRID_DATABASE_URL does not match")
    assert "flower: REDIS_URL must name the redis service, not None" in wiring
    exposure = exposure_problems(services)
    assert _mentions(exposure, "flower:", "must be required")
    assert _mentions(exposure, "flower:", "beyond loopback")
    assert volume_problems(BROKEN) == ["flower: volume 'plugins' is not declared"]


def test_waiting_for_health_is_checked() -> None:
    head = "services:\n  redis: {image: redis:7}\n  w:\n    build: .\n    command: ongrid flower\n"
    head += "    environment: {REDIS_URL: redis://redis:6379/0}\n"
    assert wiring_problems(load_services(head)) == ["w: does not depend on redis"]
    listed = load_services(head + "    depends_on: [redis]\n")
    assert _mentions(wiring_problems(listed), "w: does not wait for redis to be healthy")
    healthy = head + "    depends_on: {redis: {condition: service_healthy}}\n"
    assert wiring_problems(load_services(healthy)) == [
        "w: redis has no healthcheck test in CMD form"
    ]


def test_an_open_redis_is_found() -> None:
    services = load_services(BROKEN + "  redis: {image: redis:7, ports: ['6379:6379']}\n")
    problems = redis_problems(services)
    assert "redis: the default user is not switched off (--user 'default off')" in problems
    assert _mentions(problems, "redis: user ongrid needs the required")
    assert _mentions(problems, "redis: user ongrid may run config, module, debug, save")
    assert _mentions(problems, "redis: Redis is published")
    assert _mentions(problems, "the healthcheck must sign in")
    assert "worker: REDIS_URL does not sign in as ongrid" in problems
