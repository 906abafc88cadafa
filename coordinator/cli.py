"""The ``ongrid`` command line. Each command builds the settings once and hands them down."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from coordinator.plugins_cli import plugins
from registry.agent_registry import LoadWarning, Snapshot
from registry.errors import OngridError, PersonaError
from registry.parser import load_persona_file
from registry.persona import Persona, Source
from registry.settings import DEFAULT_API_PORT, LOCAL_TOKEN_ENV, Settings

__all__ = ["main"]

_out = Console(highlight=False, soft_wrap=True)
_err = Console(stderr=True, highlight=False)


def _emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))


def _settings() -> Settings:
    """The settings of a command: with no ``REDIS_URL``, the Redis ``ongrid up`` runs from this
    directory, if it does (its URL holds a password, kept owner-only in the data directory)."""
    from coordinator.local_auth import with_local_redis

    try:
        return with_local_redis(Settings.load())
    except OngridError as exc:
        raise click.ClickException(str(exc)) from None


class _Commands(click.Group):
    """Every command: a Redis that does not answer, or a setting or input the runtime refuses,
    is one line naming it, not a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        import redis

        try:
            return super().invoke(ctx)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            from workers.celery_app import redis_unreachable

            raise click.ClickException(redis_unreachable(_settings(), exc)) from None
        except OngridError as exc:
            raise click.ClickException(str(exc)) from None


@click.group(cls=_Commands)
@click.version_option(package_name="ongrid-personas")
def main() -> None:
    """Ongrid persona runtime."""


main.add_command(plugins)


@main.group()
def agents() -> None:
    """Inspect, validate and import personas."""


# -- validate ----------------------------------------------------------------------------------


def _files(paths: tuple[Path, ...], recursive: bool) -> list[Path]:
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = path.rglob("*.md") if recursive else path.glob("*.md")
            files.extend(sorted(f for f in found if f.is_file()))
        else:
            files.append(path)
    return files


def _validate(files: list[Path]) -> tuple[list[Persona], list[LoadWarning]]:
    personas: list[Persona] = []
    warnings: list[LoadWarning] = []
    seen: dict[str, str] = {}
    for file in files:
        try:
            parsed = load_persona_file(file)
        except PersonaError as exc:
            warnings.append(LoadWarning(str(file), exc.reason))
            continue
        warnings.extend(LoadWarning(str(file), note) for note in parsed.notes)
        persona = parsed.persona.model_copy(update={"source": Source.DISK})
        if persona.name in seen:
            warnings.append(
                LoadWarning(
                    str(file),
                    f"duplicate persona name {persona.name!r}: already loaded from "
                    f"{seen[persona.name]}; the registry would ignore this file",
                )
            )
            continue
        seen[persona.name] = str(file)
        personas.append(persona)
    return personas, warnings


def _print_warnings(warnings: list[LoadWarning]) -> None:
    for w in warnings:
        _out.print(Text.assemble(("warning", "yellow"), f" {w.path}: {w.reason}"))


@agents.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--recursive", "-r", is_flag=True, help="Descend into sub-directories.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def validate(paths: tuple[Path, ...], recursive: bool, as_json: bool) -> None:
    """Check persona files; exit 1 when any file has a warning."""
    personas, warnings = _validate(_files(paths, recursive))
    if as_json:
        _emit_json(
            {
                "agents": [p.model_dump(mode="json") for p in personas],
                "warnings": [w.as_dict() for w in warnings],
            }
        )
    else:
        for p in personas:
            _out.print(f"[green]ok[/] {p.path}: {p.name}")
        _print_warnings(warnings)
        _out.print(f"{len(personas)} valid, {len(warnings)} warning(s)")
    sys.exit(1 if warnings else 0)


# -- list --------------------------------------------------------------------------------------


def _runtime_registry(settings: Settings) -> Any:
    """The registry as workers and the API see it: user personas from the database included.

    Read only: no directory, file or schema is created (no database yet means no user
    personas); a database that cannot be read, or whose schema is behind, is a warning.
    """
    from coordinator.storage.personas import ReadOnlyUserStore
    from registry.defaults import build_registry

    return build_registry(settings, ReadOnlyUserStore.open(settings))


def _current_snapshot(settings: Settings) -> Snapshot:
    return _runtime_registry(settings).snapshot()


def _user_personas_line(settings: Settings, snapshot: Snapshot) -> str:
    """Which database the user personas of ``snapshot`` came from (or that there was none)."""
    from coordinator.storage.personas import ReadOnlyUserStore
    from registry.persona import Source

    count = sum(p.source is Source.USER for p in snapshot.personas.values())
    return ReadOnlyUserStore.open(settings).summary(count)


@agents.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_agents(as_json: bool) -> None:
    """The merged registry as the runtime sees it from here (builtin → disk → user)."""
    settings = _settings()
    snap = _current_snapshot(settings)
    personas = [snap.personas[name] for name in snap.names()]
    users = _user_personas_line(settings, snap)
    if as_json:
        _emit_json(
            {
                "version": snap.digest,
                "agents": [snap.describe(p) for p in personas],
                "warnings": [w.as_dict() for w in snap.warnings],
                "user_personas": users,
            }
        )
        return
    table = Table("name", "source", "model", "mode", "when to use", "path")
    for p in personas:
        hint = p.catalog_hint
        if p.name in snap.unavailable:
            hint = f"[red]unavailable: {snap.unavailable[p.name]}[/]"
        table.add_row(
            p.name,
            p.source.value if p.source else "",
            p.model or "(default)",
            p.permission_mode.value,
            hint,
            p.path or "",
        )
    _out.print(table)
    _out.print(Text(users))
    _print_warnings(list(snap.warnings))


# -- bag ---------------------------------------------------------------------------------------


@agents.command()
@click.argument("name")
@click.option("--role", default=None, help="Caller's role (default: settings.default_role).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def bag(name: str, role: str | None, as_json: bool) -> None:
    """The tool bag NAME gets for a caller with ROLE, each tool with class and confirmation."""
    from marketplace.catalog import spawn_catalog
    from registry.policy import resolve_bag
    from workers.tools import default_catalog

    settings = _settings()
    role = role or settings.default_role
    if role not in settings.roles:
        raise click.ClickException(f"unknown role {role!r}; known: {', '.join(settings.roles)}")
    try:
        snapshot = _current_snapshot(settings)
        persona = snapshot.get(name)
    except OngridError as exc:
        raise click.ClickException(str(exc)) from None
    catalog = spawn_catalog(default_catalog(settings.tool_modules), snapshot.bundle)
    resolved = resolve_bag(persona, catalog, settings.roles[role].tools, role=role)
    if as_json:
        _emit_json(
            {
                "agent": name,
                "role": role,
                "permission_mode": persona.permission_mode.value,
                "tools": [
                    {
                        "name": e.tool.name,
                        "class": e.tool.tool_class.value,
                        "confirmation": e.confirmation.value,
                    }
                    for e in resolved
                ],
                "dropped": [{"name": d.name, "reason": d.reason} for d in resolved.dropped],
            }
        )
        return
    table = Table("tool", "class", "confirmation", title=f"{name} as {role}")
    for e in resolved:
        table.add_row(e.tool.name, e.tool.tool_class.value, e.confirmation.value)
    _out.print(table)
    for d in resolved.dropped:
        _out.print(f"[yellow]dropped[/] {d.name}: {d.reason}")


# -- lint --------------------------------------------------------------------------------------


class _CannotLint(click.ClickException):
    """Lint did not run (settings that do not load, a tool module that does not import): exit
    2, so that 1 always means findings."""

    exit_code = 2


def _print_findings(findings: list[Any]) -> None:
    """One line per finding, under a heading per persona (or per file that did not load); the
    settings unset on this host come last, one line per setting with the personas it leaves
    short, so that a fresh install's list of them does not bury the problems of the files."""
    from rich.markup import escape

    from registry.lint import FindingKind

    groups: dict[tuple[str, str, str], list[Any]] = {}
    unset: dict[str, list[Any]] = {}
    for f in findings:
        if f.kind is FindingKind.MISSING_CONFIG:
            unset.setdefault(f.subject, []).append(f)
        else:
            groups.setdefault((f.persona, f.source, f.path), []).append(f)
    for (persona, source, path), items in groups.items():
        title = (
            f"[bold]{escape(persona)}[/] ({escape(source)}, {escape(path)})"
            if persona
            else (f"[bold]{escape(path)}[/]")
        )
        _out.print(title, markup=True)
        for f in items:
            hint = f" [dim]→ {escape(f.hint)}[/]" if f.hint else ""
            _out.print(f"  [yellow]{f.kind.value}[/] {escape(f.reason)}{hint}", markup=True)
    if unset:
        _out.print(f"[bold]settings unset here[/] ({len(unset)})", markup=True)
    for key, items in sorted(unset.items()):
        tools = sorted({t for f in items for t in _tools_of(f.reason)})
        personas = ", ".join(sorted({f.persona for f in items}))
        _out.print(
            f"  [yellow]missing_config[/] {escape(key)}: {escape(', '.join(tools))} for "
            f"{escape(personas)} [dim]→ {escape(items[0].hint)}[/]",
            markup=True,
        )


def _tools_of(reason: str) -> list[str]:
    """The tools a ``missing_config`` reason names (``a, b need setting …``)."""
    return [t.strip() for t in reason.split(" need")[0].split(",") if t.strip()]


def _lint_summary(findings: list[Any], skipped_config: bool) -> str:
    from registry.lint import FindingKind
    from registry.settings import env_var_of

    if not findings:
        return "no findings" + (" (missing_config and model left out)" if skipped_config else "")
    personas = {f.persona for f in findings if f.persona}
    text = f"{len(findings)} finding(s) in {len(personas)} persona(s)"
    loads = sum(f.kind is FindingKind.LOAD for f in findings)
    if loads:
        text += f", {loads} load problem(s)"
    unset = sorted({f.subject for f in findings if f.kind is FindingKind.MISSING_CONFIG})
    if unset:
        config = sum(f.kind is FindingKind.MISSING_CONFIG for f in findings)
        share = "all" if config == len(findings) else str(config)
        names = ", ".join(env_var_of(key) or key for key in unset)
        text += (
            f"; {share} of them come from settings unset here ({names}), not from the persona "
            "files: --skip-config leaves them out"
        )
    return text


def _model_problems(snapshot: Any, settings: Settings) -> dict[str, str]:
    """Why each persona's model cannot be used on this host (its keys, its provider)."""
    from workers._litellm import readiness
    from workers.model import resolve_model

    problems = {}
    for name in snapshot.names():
        choice = resolve_model(
            snapshot.personas[name].model,
            default_model=settings.default_model,
            default_provider=settings.default_provider,
            readiness=readiness,
        )
        if choice.problem:
            problems[name] = choice.problem
    return problems


@agents.command()
@click.option("--role", default=None, help="Lint the bags of this role only (default: every role).")
@click.option(
    "--agents-dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="Read disk personas from this directory instead of agents_dir (ONGRID_AGENTS_DIR).",
)
@click.option(
    "--skip-config",
    is_flag=True,
    help="Leave out missing_config and model, the findings that come from settings and keys "
    "unset on this host (e.g. when checking persona files in CI).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def lint(role: str | None, agents_dir: Path | None, skip_config: bool, as_json: bool) -> None:
    """Lint the personas as the runtime loads them: whitelisted tools that do not exist,
    patterns that match nothing, tools a persona's own mode or blacklist keeps out, bags left
    empty, catalog lines (first line of when_to_use) that collide, and settings the tools of a
    bag need but that are unset here, and models that cannot be used here (unknown provider,
    key unset). Files that did not load are findings too.

    Exit 1 when there is any finding, 0 when there is none, 2 on a usage error or when the
    lint could not run.
    """
    from marketplace.catalog import spawn_catalog
    from registry.lint import FindingKind
    from registry.lint import lint as lint_personas
    from workers.tools import default_catalog

    try:
        settings = Settings.load()
        catalog = default_catalog(settings.tool_modules)
    except OngridError as exc:
        raise _CannotLint(str(exc)) from None
    if role is not None and role not in settings.roles:
        raise click.BadParameter(
            f"unknown role {role!r}; known: {', '.join(settings.roles)}", param_hint="--role"
        )
    if agents_dir is not None:
        settings = settings.model_copy(update={"agents_dir": agents_dir})
    snapshot = _current_snapshot(settings)
    catalog = spawn_catalog(catalog, snapshot.bundle)
    problems = {} if skip_config else _model_problems(snapshot, settings)
    findings = lint_personas(snapshot, catalog, settings, role, model_problems=problems)
    if skip_config:
        findings = [f for f in findings if f.kind is not FindingKind.MISSING_CONFIG]
    if as_json:
        _emit_json({"role": role, "findings": [f.as_dict() for f in findings]})
    else:
        _print_findings(findings)
        _out.print(Text(_user_personas_line(settings, snapshot)))
        _out.print(_lint_summary(findings, skip_config))
    sys.exit(1 if findings else 0)


# -- import ------------------------------------------------------------------------------------


@agents.command(name="import")
@click.option(
    "--from", "fmt", type=click.Choice(["claude-code"]), required=True, help="Source format."
)
@click.argument("sources", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--out", "out_dir", required=True, type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report.")
def import_(fmt: str, sources: tuple[Path, ...], out_dir: Path, as_json: bool) -> None:
    """Convert foreign agent files (files or directories, recursively) into Ongrid personas."""
    from registry.claude_import import import_claude_files
    from workers.tools import default_catalog

    report = import_claude_files(
        sources, out_dir, default_catalog(_settings().tool_modules).names()
    )
    if as_json:
        _emit_json(report.as_dict())
    else:
        for item in report.imported:
            _out.print(f"[green]imported[/] {item.source} → {item.out}")
            for change in item.changes:
                _out.print(f"    {change}")
        for skipped in report.skipped:
            _out.print(f"[yellow]skipped[/] {skipped['path']}: {skipped['reason']}")
        unknown = report.unknown_tools()
        if unknown:
            _out.print(f"tools not in the current catalog ({len(unknown)}): {', '.join(unknown)}")
        _out.print(f"{len(report.imported)} imported, {len(report.skipped)} skipped")
    sys.exit(1 if report.skipped else 0)


# -- runtime -----------------------------------------------------------------------------------


@agents.command()
def reload() -> None:
    """Broadcast a registry reload to every worker and API process."""
    from workers.client import SpawnClient

    settings = _settings()
    version = SpawnClient(settings).reload()
    click.echo(f"registry reload broadcast (cluster registry version {version})")
    # What every process now loads, as this host reads it: files that did not load say why.
    snapshot = _current_snapshot(settings)
    warnings = list(snapshot.warnings)
    _out.print(Text(f"{len(snapshot.personas)} persona(s) loaded here, {len(warnings)} warning(s)"))
    _print_warnings(warnings)


def _worker_argv(queues: str, concurrency: int, name: str, loglevel: str) -> list[str]:
    return [
        "worker",
        "--pool=threads",
        f"--concurrency={concurrency}",
        f"--queues={queues}",
        f"--hostname={name}@%h",
        f"--loglevel={loglevel}",
        "--without-gossip",
        "--without-mingle",
    ]


#: What a plain ``ongrid worker`` consumes in its own pool (coordinator turns get a second one).
_SPECIALIST_QUEUES = "ongrid.interactive,ongrid.background"


@main.command()
@click.option(
    "--queues",
    default=None,
    help="Comma-separated queues to consume, in this process only. Without it: "
    f"{_SPECIALIST_QUEUES}, plus ongrid.coordinator in a child process (see --coordinator-slots).",
)
@click.option("--concurrency", "-c", default=1024, show_default=True, help="Spawns held at once.")
@click.option(
    "--coordinator-slots",
    default=16,
    show_default=True,
    type=click.IntRange(min=0),
    help="Without --queues: coordinator turns held at once by the child process that serves "
    "ongrid.coordinator, apart from the specialists' slots (0: no such child).",
)
@click.option(
    "--processes",
    "-p",
    default=1,
    show_default=True,
    type=click.IntRange(min=1, max=256),
    help="Processes consuming the same queues, each with its own event loop and -c slots: one "
    "process uses one core at most (the GIL), so give one per core the worker may use. The "
    "others are children named <name>-2… <name>-N, restarted if they die, stopped with this one.",
)
@click.option("--name", default="worker", show_default=True)
@click.option("--loglevel", default="INFO", show_default=True)
@click.option("--exit-with-parent", type=int, default=None, hidden=True)
def worker(
    queues: str | None,
    concurrency: int,
    coordinator_slots: int,
    processes: int,
    name: str,
    loglevel: str,
    exit_with_parent: int | None,
) -> None:
    """Run a Celery worker (threads pool) that executes spawns and coordinator turns."""
    from coordinator.worker import ChildWorker, die_with_parent, worker_app

    if exit_with_parent is not None:  # a child of a plain `ongrid worker`
        die_with_parent(exit_with_parent)
    settings = _settings()
    children = []
    if queues is None:
        queues = _SPECIALIST_QUEUES
        if coordinator_slots:
            children.append(
                ChildWorker.coordinator_pool(name=name, slots=coordinator_slots, loglevel=loglevel)
            )
    # Metrics ports: this process's, +1 for the coordinator pool, +2… for the other processes.
    children += [
        ChildWorker(
            name=f"{name}-{number}",
            queues=queues,
            concurrency=concurrency,
            loglevel=loglevel,
            port_offset=number,
            what=f"worker process {number}",
        )
        for number in range(2, processes + 1)
    ]
    app = worker_app(settings)
    for child in children:
        child.start()  # before this process hardens itself: children inherit the environment
    try:
        app.worker_main(_worker_argv(queues, concurrency, name, loglevel))
    finally:
        for child in children:
            child.stop()


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=DEFAULT_API_PORT, show_default=True)
@click.option(
    "--local-admin",
    is_flag=True,
    help="Also accept one token for the local admin: $ONGRID_ADMIN_TOKEN when set, otherwise "
    "one generated once and kept owner-only in <data_dir>/local-admin-token (read it there).",
)
def api(host: str, port: int, local_admin: bool) -> None:
    """Serve the HTTP API (uvicorn)."""
    import os

    from coordinator.api.app import serve
    from coordinator.local_auth import local_admin_token

    if local_admin:
        try:
            path, _token, created = local_admin_token(
                _settings().data_dir, os.environ.get("ONGRID_ADMIN_TOKEN") or None
            )
        except OngridError as exc:
            raise click.ClickException(str(exc)) from None
        os.environ[LOCAL_TOKEN_ENV] = str(path)
        # Where the token is, never the token: logs are read by more people than the admin.
        click.echo(f"API: the local admin token is {'created' if created else 'kept'} in {path}")
    serve(_settings(), host, port)


@main.command()
@click.option("--port", default=5555, show_default=True, help="Port Flower listens on.")
@click.option(
    "--address",
    default="127.0.0.1",
    show_default=True,
    help="Interface Flower listens on (0.0.0.0: every interface; basic auth still applies).",
)
def flower(port: int, address: str) -> None:
    """Run Flower on the runtime's broker, behind basic auth; spawns show as ongrid.spawn with
    their persona.

    The login is $FLOWER_BASIC_AUTH (user:password, comma-separated for several) when set;
    otherwise one generated once and kept owner-only in <data_dir>/flower-basic-auth, printed
    here.
    """
    import os

    from coordinator.local_auth import flower_login

    env = dict(os.environ)
    if not env.get("FLOWER_BASIC_AUTH"):
        try:
            path, login, created = flower_login(_settings().data_dir)
        except OngridError as exc:
            raise click.ClickException(str(exc)) from None
        env["FLOWER_BASIC_AUTH"] = login
        user, _, password = login.partition(":")
        click.echo(
            f"Flower: http://{address}:{port} (user {user}, password {password}; "
            f"{'created' if created else 'kept'} in {path})",
            err=True,
        )
    argv = ["-m", "celery", "-A", "workers.app", "flower", f"--port={port}", f"--address={address}"]
    os.execvpe(sys.executable, [sys.executable, *argv], env)


@main.command()
@click.option("--loglevel", default="INFO", show_default=True)
def beat(loglevel: str) -> None:
    """Run the beat: sends each enabled schedule's runs to the workers at their due times.

    One beat per cluster runs at a time (a second one waits for the first's lock in Redis); the
    schedules and their last due times live in Redis (RedBeat), so a restarted beat neither
    skips nor repeats a run.
    """
    import redis

    from workers.celery_app import DEFAULT_REDIS_URL, make_celery
    from workers.hardening import harden_process

    settings = _settings()
    probe = redis.Redis.from_url(
        settings.redis_url or DEFAULT_REDIS_URL, socket_connect_timeout=5, socket_timeout=5
    )
    try:
        probe.ping()  # unreachable: one line naming it (see _Commands)
    finally:
        probe.close()
    app = make_celery(settings)
    harden_process()  # the settings are built: secrets leave os.environ
    app.Beat(loglevel=loglevel, scheduler=app.conf.beat_scheduler).run()


def _parse_context(items: tuple[str, ...]) -> dict[str, Any]:
    context: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected key=value, got {item!r}", param_hint="--context")
        try:
            context[key] = json.loads(value)
        except json.JSONDecodeError:
            context[key] = value
    return context


def _render_event(event: Any) -> None:
    from coordinator.render import show_event

    show_event(_out, event, more_hint="; --json shows them")


@main.command()
@click.argument("name")
@click.option("--prompt", "-p", required=True)
@click.option("--context", "context_items", multiple=True, help="key=value (JSON values allowed).")
@click.option("--role", default=None)
@click.option("--wait", is_flag=True, help="Wait for background personas too.")
@click.option("--timeout", default=600.0, show_default=True, help="Seconds to wait.")
@click.option("--json", "as_json", is_flag=True, help="Events as JSON lines.")
def spawn(
    name: str,
    prompt: str,
    context_items: tuple[str, ...],
    role: str | None,
    wait: bool,
    timeout: float,
    as_json: bool,
) -> None:
    """Spawn persona NAME and print its events as they come."""
    import threading

    from workers.client import SpawnClient, StrandedWatch

    settings = _settings()
    client = SpawnClient(settings, registry=_runtime_registry(settings))
    try:
        record = client.spawn(name, prompt, context=_parse_context(context_items), role=role)
    except OngridError as exc:
        raise click.ClickException(str(exc)) from None
    if record.background and not wait:
        if as_json:
            _emit_json({"spawn_id": record.spawn_id, "session_id": record.session_id})
        else:
            click.echo(f"background spawn {record.spawn_id} (session {record.session_id})")
        return
    # A worker that vanishes after the spawn was accepted: end it, naming the queue, not hang.
    stop = threading.Event()
    watch = StrandedWatch(client, [record.spawn_id])
    threading.Thread(target=_watch_stranded, args=(watch, stop), daemon=True).start()
    status = ""
    try:
        for event in client.events(
            record.session_id,
            timeout=timeout,
            until=lambda e: (
                e.spawn_id == record.spawn_id
                and (e.type == "task_notification" or e.type == "confirmation_required")
            ),
        ):
            if as_json:
                click.echo(event.model_dump_json())
            else:
                _render_event(event)
            if event.type == "task_notification":
                status = event.status
            elif event.type == "confirmation_required":
                status = "waiting"
    finally:
        stop.set()
    if not status:
        current = client.store.get(record.spawn_id)
        state = current.status if current else "gone"
        _err.print(f"no event for {timeout:g} s; spawn {record.spawn_id} is {state}")
    sys.exit(0 if status in ("ok", "waiting") else 1)


def _watch_stranded(watch: Any, stop: Any) -> None:
    import redis

    while not stop.wait(watch.client.settings.stranded_check_seconds):
        try:
            watch.check()
        except redis.RedisError as exc:  # the event stream reports a lost Redis its own way
            _err.print(f"could not check the spawn's queue: {exc}")


@main.command()
@click.option(
    "--workers",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Interactive worker processes (one background and one coordinator worker also start).",
)
@click.option(
    "--api-host",
    default="127.0.0.1",
    show_default=True,
    help="Interface the API listens on. Any other than loopback needs auth.tokens in "
    "ONGRID_CONFIG: the local admin token is for this machine only.",
)
@click.option(
    "--api-port",
    default=DEFAULT_API_PORT,
    show_default=True,
    type=click.IntRange(1, 65535),
    help="API port.",
)
@click.option(
    "--flower-port",
    default=5555,
    show_default=True,
    type=click.IntRange(1, 65535),
    help="Flower's port, on 127.0.0.1, behind basic auth ($FLOWER_BASIC_AUTH, else a login "
    "generated once under the data directory).",
)
@click.option(
    "--redis-port",
    default=None,
    type=click.IntRange(1, 65535),
    help="When REDIS_URL is not set: the port on 127.0.0.1 of the password-protected Redis up "
    "starts (default: the first free port from 6380).",
)
@click.option(
    "--demo/--no-demo",
    default=True,
    show_default=True,
    help="Run one spawn of disk_specialist once everything is up.",
)
def up(
    workers: int,
    api_host: str,
    api_port: int,
    flower_port: int,
    redis_port: int | None,
    demo: bool,
) -> None:
    """Start everything on this machine: Redis (its own, password-protected, unless REDIS_URL
    names one), worker processes, Flower and the HTTP API; Ctrl-C stops it all.

    Ports and Redis are checked before anything starts. With no auth.tokens configured, a local
    admin token is made once (<data_dir>/local-admin-token, owner-only) and printed as the
    export lines `ongrid ask` needs. Children log to <data_dir>/logs/. Any failure is one line
    naming its cause, and a non-zero exit.
    """
    from coordinator.launcher import UpError, UpOptions, run

    options = UpOptions(workers, api_host, api_port, flower_port, redis_port, demo)
    try:
        code = run(options, _out)
    except UpError as exc:
        click.echo(f"ongrid up: {exc}", err=True)
        sys.exit(1)
    sys.exit(code)


def _sse_events(lines: Any) -> Any:
    """Parse a Server-Sent Events stream into (event type, data dict) pairs."""
    data: list[str] = []
    for line in lines:
        if line == "":
            if data:
                payload = json.loads("\n".join(data))
                yield payload.get("type", ""), payload
            data = []
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())


def _token(token: str | None) -> str:
    """The token given, else the local admin token ``ongrid up`` keeps in the data directory."""
    from coordinator.local_auth import read_local_token

    if token:
        return token
    try:
        found = read_local_token(_settings().data_dir)
    except OngridError as exc:
        raise click.ClickException(str(exc)) from None
    if found is None:
        raise click.ClickException(
            "no token: set ONGRID_TOKEN (ongrid up prints the export line) or pass --token"
        )
    return found


@main.command()
@click.argument("question")
@click.option("--agent", default=None, help="Skip the coordinator: ask this persona directly.")
@click.option("--context", "context_items", multiple=True, help="key=value (JSON values allowed).")
@click.option("--session", "session_id", default=None, help="Continue this chat session.")
@click.option(
    "--url",
    envvar="ONGRID_URL",
    default=f"http://127.0.0.1:{DEFAULT_API_PORT}",
    show_default=True,
    help="The API ($ONGRID_URL).",
)
@click.option(
    "--token",
    envvar="ONGRID_TOKEN",
    default=None,
    help="Bearer token ($ONGRID_TOKEN); without one, the local admin token of `ongrid up` "
    "in the data directory.",
)
@click.option("--full", is_flag=True, help="Show tool results whole, not folded to a few lines.")
@click.option("--json", "as_json", is_flag=True, help="Raw events as JSON lines.")
def ask(
    question: str,
    agent: str | None,
    context_items: tuple[str, ...],
    session_id: str | None,
    url: str,
    token: str | None,
    full: bool,
    as_json: bool,
) -> None:
    """Ask a running API server; the answer streams as it comes.

    Tool results are folded to their first lines (--full shows them whole), and an answer a
    specialist already gave is not printed again when the coordinator relays it.
    """
    import httpx

    from coordinator.render import EventPrinter
    from workers.messages import EVENT_ADAPTER

    body: dict[str, Any] = {"context": _parse_context(context_items)}
    if agent:
        body["agent"] = agent
    if session_id:
        path, body["content"] = f"/api/v1/chat/sessions/{session_id}/messages", question
    else:
        path, body["prompt"] = "/api/v1/chat", question
    headers = {"Authorization": f"Bearer {_token(token)}", "Accept": "text/event-stream"}
    printer = EventPrinter(_out, full=full, more_hint="; --full shows them")
    status = "failed"
    try:
        with httpx.stream("POST", url + path, json=body, headers=headers, timeout=None) as resp:
            if resp.status_code >= 400:
                resp.read()
                error = resp.json().get("error", {}) if resp.content else {}
                raise click.ClickException(f"{resp.status_code}: {error.get('message', resp.text)}")
            session = resp.headers.get("x-session-id", session_id or "")
            turn = resp.headers.get("x-spawn-id", "")
            for kind, payload in _sse_events(resp.iter_lines()):
                if as_json:
                    click.echo(json.dumps(payload, ensure_ascii=False))
                else:
                    printer.show(EVENT_ADAPTER.validate_python(payload))
                if payload.get("spawn_id") == turn or not turn:
                    if kind == "task_notification":
                        status = payload.get("status", status)
                    elif kind == "agent_tile" and payload.get("background"):
                        status = "ok"  # the stream of a background turn ends at its tile
    except httpx.HTTPError as exc:
        raise click.ClickException(f"cannot reach {url}: {exc}") from None
    finally:
        printer.close()
    if not as_json:
        _err.print(f"session {session}")
    sys.exit(0 if status == "ok" else 1)
