"""The registry as the runtime builds it: builtin personas, the shipped ones, the disk roots."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from registry.agent_registry import AgentRegistry, LoadWarning, UserStore
from registry.gates import check_availability
from registry.persona import Persona
from registry.settings import DEFAULT_MARKETPLACE_ROOT, Settings

__all__ = [
    "BUILTIN_PERSONAS",
    "SHIPPED_AGENTS_PACKAGE",
    "SHIPPED_PERSONA_FILES",
    "build_registry",
    "shipped_agents_dir",
]

#: The package the repository's top-level ``agents/`` folder is installed as (pyproject.toml
#: maps it), so the shipped personas are found wherever the runtime starts.
SHIPPED_AGENTS_PACKAGE = "ongrid_agents"
#: The personas shipped with the package: the files of the repository's ``agents/``. Named, so
#: that a file a person drops beside them in a checkout is never taken for one of them.
SHIPPED_PERSONA_FILES = frozenset(
    {
        "change_reviewer.md",
        "incident_investigator.md",
        "reviewer.md",
        "specialist-clickhouse.md",
        "specialist-disk.md",
        "specialist-ops.md",
    }
)

#: Personas registered in code. They cannot be deleted; a user persona of the same name overrides.
BUILTIN_PERSONAS: tuple[Persona, ...] = (
    Persona(
        name="generalist",
        description="Answer an operational question with read-only tools when no specialist fits.",
        when_to_use=(
            "When no specialist's trigger matches the question, or it spans several areas.\n"
            "Prefer a specialist whenever one matches: this persona has no playbook of its own."
        ),
        max_turns=12,
        critical_reminder="Cite the tool output behind every claim; say so when you cannot verify.",
        body=(
            "# Generalist\n\n"
            "You answer operational questions about the user's infrastructure. Use the tools "
            "in your bag to gather evidence before you answer; never guess what you can measure."
            "\n\n"
            "## Output\n\n"
            "- Answer: one or two sentences.\n"
            "- Evidence: the tool calls and the lines of their output that support the answer.\n"
            "- Next step: what a specialist or a person should look at next, if anything.\n"
        ),
    ),
)


def shipped_agents_dir() -> Path | None:
    """The directory of the installed shipped personas, or None when they are not installed.

    Found through the import system, never the working directory: ``ongrid_agents/`` in
    site-packages for a wheel, the checkout's ``agents/`` for an editable install.
    """
    spec = importlib.util.find_spec(SHIPPED_AGENTS_PACKAGE)
    if spec is None or spec.submodule_search_locations is None:
        return None
    # The folder has no __init__.py, so this is a namespace package; an editable install adds a
    # placeholder entry to its path that is no directory (importlib.resources.files() fails on
    # it before Python 3.12), so the first real directory is taken.
    for location in spec.submodule_search_locations:
        if Path(location).is_dir():
            return Path(location)
    return None


def _read_bundles(settings: Settings, plugins: Any = None) -> Any:
    """The installed plugins of ``settings.marketplace_root``; with ``plugins`` (a
    :class:`marketplace.replica.PluginSource`, the database), first made those it lists."""
    # Imported here: marketplace builds on the registry's modules, not the other way round.
    from dataclasses import replace

    from marketplace.layer import read_bundles
    from marketplace.replica import sync_installed

    root = settings.marketplace_root
    notes: list[LoadWarning] = []
    if plugins is not None:
        try:
            synced = sync_installed(root, plugins)
        except Exception as exc:  # noqa: BLE001 - the database's errors are its package's own
            notes.append(
                LoadWarning(
                    "database:installed_plugins",
                    f"the installed plugins could not be read from the database ({exc}); "
                    f"this host keeps the copies {root} holds",
                )
            )
        else:
            notes.extend(
                LoadWarning(f"database:installed_plugins/{name}", f"plugin {name!r}: {why}")
                for name, why in synced.problems
            )
    bundles = read_bundles(root, config_mcp=settings.mcp_servers)
    return replace(bundles, warnings=(*notes, *bundles.warnings)) if notes else bundles


def build_registry(
    settings: Settings, user_store: UserStore | None = None, plugins: Any = None
) -> AgentRegistry:
    """Builtins, the shipped personas, ``settings.agent_dirs``, then ``user_store``, with the
    availability gate. ``settings.shipped_agents`` false leaves the shipped personas out.
    ``plugins``: where installed plugins are listed for every host (see :func:`_read_bundles`)."""
    optional = {settings.agents_dir}
    if settings.marketplace_root == DEFAULT_MARKETPLACE_ROOT:
        optional.add(DEFAULT_MARKETPLACE_ROOT)
    shipped = shipped_agents_dir() if settings.shipped_agents else None
    notes = []
    if settings.shipped_agents and shipped is None:
        notes.append(
            LoadWarning(
                f"package:{SHIPPED_AGENTS_PACKAGE}",
                "the shipped personas are not installed: reinstall the package (pip install .), "
                "or set shipped_agents: false",
            )
        )
    return AgentRegistry(
        settings.agent_dirs,
        user_store,
        builtins=BUILTIN_PERSONAS,
        gate=lambda p: check_availability(p, has_config=settings.has_config),
        optional_dirs=optional,
        shipped_dir=shipped,
        shipped_files=SHIPPED_PERSONA_FILES,
        notes=notes,
        bundles=lambda: _read_bundles(settings, plugins),
    )
