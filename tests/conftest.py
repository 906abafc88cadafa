"""Fixtures every test directory shares; ``servers.py`` next to this file starts real backends."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

sys.path.insert(0, str(Path(__file__).resolve().parent))  # servers.py, postgres.py, races.py

from postgres import connect_admin  # noqa: E402 - importable once the line above ran


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A fresh directory the command sandbox's unprivileged user may traverse (pytest's own
    ``tmp_path`` lies under a directory only its owner may enter), removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="ongrid-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_admin() -> Iterator[tuple[Engine | None, str]]:
    """An autocommit engine on the test PostgreSQL server, or None and why it is not reachable."""
    admin, reason = connect_admin()
    yield admin, reason
    if admin is not None:
        admin.dispose()
