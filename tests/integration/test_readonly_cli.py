"""Read-only commands (``ongrid agents list / validate / bag``) as subprocesses: they write
nothing, neither in the directory they run in nor in the database they read.

Each command runs in a directory of its own with no ``ONGRID_*`` variable set (so the data
directory is the default ``./.ongrid``), or with ``ONGRID_DATABASE_URL`` naming a PostgreSQL
database made for the test when the server in ``ONGRID_TEST_POSTGRES_URL`` answers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from postgres import fresh_database
from sqlalchemy import Engine, inspect

from coordinator.storage.engine import make_engine, upgrade
from coordinator.storage.personas import SqlUserStore
from registry.persona import Persona

ONGRID = str(Path(sys.executable).with_name("ongrid"))
PERSONA = """---
name: file_checker
description: Check files.
when_to_use: When a file looks wrong.
---
# File checker
"""


def _env(**extra: str) -> dict[str, str]:
    dropped = ("ONGRID_", "REDIS_", "OPENAI_", "ANTHROPIC_")
    return {**{k: v for k, v in os.environ.items() if not k.startswith(dropped)}, **extra}


def _ongrid(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ONGRID, *args], cwd=cwd, env=_env(**env), capture_output=True, text=True, timeout=120
    )


def _tree(root: Path) -> list[str]:
    """Every path under ``root``, with size and modification time: a write changes it."""
    return sorted(
        f"{p.relative_to(root)} {p.stat().st_size} {p.stat().st_mtime_ns}" for p in root.rglob("*")
    )


def _user_persona(name: str) -> Persona:
    return Persona(
        name=name, description="From the database.", when_to_use="When a test lists it.", body="#\n"
    )


@pytest.fixture
def persona_file(tmp_path: Path) -> Path:
    """A valid persona file, outside the directory the commands run in."""
    path = tmp_path / "elsewhere" / "file_checker.md"
    path.parent.mkdir()
    path.write_text(PERSONA, encoding="utf-8")
    return path


@pytest.fixture
def empty_dir(tmp_path: Path) -> Path:
    path = tmp_path / "empty"
    path.mkdir()
    return path


def test_read_only_commands_write_nothing_in_an_empty_directory(
    empty_dir: Path, persona_file: Path
):
    listed = _ongrid(empty_dir, "agents", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    data = json.loads(listed.stdout)
    assert "generalist" in [a["name"] for a in data["agents"]]
    assert not [a for a in data["agents"] if a["source"] == "user"]
    assert not [w for w in data["warnings"] if w["path"].startswith("database:")], data
    assert _tree(empty_dir) == []

    validated = _ongrid(empty_dir, "agents", "validate", str(persona_file))
    assert validated.returncode == 0, validated.stdout + validated.stderr
    assert "1 valid, 0 warning(s)" in validated.stdout
    assert _tree(empty_dir) == []

    bag = _ongrid(empty_dir, "agents", "bag", "generalist", "--json")
    assert bag.returncode == 0, bag.stderr
    assert json.loads(bag.stdout)["agent"] == "generalist"
    assert _tree(empty_dir) == []


def test_list_shows_the_user_personas_of_an_existing_database_and_changes_nothing(
    empty_dir: Path,
):
    data_dir = empty_dir / ".ongrid"
    data_dir.mkdir()
    engine = make_engine(f"sqlite:///{data_dir / 'ongrid.db'}")
    try:
        upgrade(engine)
        SqlUserStore(engine).upsert(_user_persona("db_checker"), user="alice")
    finally:
        engine.dispose()
    database = data_dir / "ongrid.db"
    before = database.read_bytes()

    listed = _ongrid(empty_dir, "agents", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    agents = {a["name"]: a for a in json.loads(listed.stdout)["agents"]}
    assert agents["db_checker"]["source"] == "user"
    assert agents["db_checker"]["description"] == "From the database."
    bag = _ongrid(empty_dir, "agents", "bag", "db_checker", "--json")
    assert bag.returncode == 0, bag.stderr
    assert database.read_bytes() == before


def test_a_database_file_without_a_schema_is_neither_migrated_nor_an_error(empty_dir: Path):
    data_dir = empty_dir / ".ongrid"
    data_dir.mkdir()
    (data_dir / "ongrid.db").touch()

    listed = _ongrid(empty_dir, "agents", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    warnings = json.loads(listed.stdout)["warnings"]
    assert any("has no schema yet" in w["reason"] for w in warnings), warnings
    assert (data_dir / "ongrid.db").stat().st_size == 0  # no table was created


# -- PostgreSQL --------------------------------------------------------------------------------


@pytest.fixture
def pg_url(postgres_admin: tuple[Engine | None, str]) -> Iterator[str]:
    """A fresh, empty PostgreSQL database (skipped when the server does not answer)."""
    admin, reason = postgres_admin
    if admin is None:
        pytest.skip(reason)
    with fresh_database(admin, "ongrid_cli") as url:
        yield url


def test_list_on_postgresql_does_not_migrate_and_then_shows_user_personas(
    empty_dir: Path, pg_url: str
):
    engine = make_engine(pg_url)
    try:
        listed = _ongrid(empty_dir, "agents", "list", "--json", ONGRID_DATABASE_URL=pg_url)
        assert listed.returncode == 0, listed.stderr
        warnings = json.loads(listed.stdout)["warnings"]
        assert any("has no schema yet" in w["reason"] for w in warnings), warnings
        assert inspect(engine).get_table_names() == []  # nothing was migrated

        upgrade(engine)
        SqlUserStore(engine).upsert(_user_persona("pg_checker"))
        listed = _ongrid(empty_dir, "agents", "list", "--json", ONGRID_DATABASE_URL=pg_url)
        assert listed.returncode == 0, listed.stderr
        agents = {a["name"]: a for a in json.loads(listed.stdout)["agents"]}
        assert agents["pg_checker"]["source"] == "user"
    finally:
        engine.dispose()
    assert _tree(empty_dir) == []
