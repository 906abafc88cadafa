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


def _current_snapshot(settings: Settings) -> Snapshot:
    from registry.defaults import build_registry

    return build_registry(settings).snapshot()


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
    resolved = resolve_bag(persona, default_catalog(), settings.roles[role].tools, role=role)
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

    report = import_claude_files(sources, out_dir, default_catalog().names())
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
