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
from timing import Timing  # noqa: E402


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


# -- running in several processes ---------------------------------------------------------------

#: Where a test's work is mostly starting processes. ``./dev test`` runs the suite under
#: pytest-xdist with ``--dist loadscope --no-loadscope-reorder``: each module goes whole to one
#: process (its module-scoped servers start once) and modules are handed out in collection order,
#: so these come first; the longest pieces first keep every process busy to the end.
_SLOW_FIRST = ("tests/multihost/", "scenarios/", "tests/integration/", "tests/coordinator/")
#: Tests that start workers, the API, ``ongrid up``, a backend server or network namespaces of
#: their own: marked ``processes``, which ``./dev test --quick`` leaves out. The shared Redis and
#: PostgreSQL servers do not count.
_STARTS_PROCESSES = (
    "tests/multihost/",
    "scenarios/",
    "tests/integration/",
    "tests/coordinator/test_api.py",
    "tests/coordinator/test_up.py",
    "tests/marketplace/test_mcp.py",
    "tests/workers/test_clickhouse.py",
    "tests/workers/test_egress.py",
    "tests/workers/test_loki_tools.py",
    "tests/workers/test_prometheus_tools.py",
)


def _rank(item: pytest.Item) -> int:
    for rank, prefix in enumerate(_SLOW_FIRST):
        if item.nodeid.startswith(prefix):
            return rank
    return len(_SLOW_FIRST)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "processes: starts workers, the API or a backend server of its own (not in --quick)",
    )
    config.pluginmanager.register(Timing(), "ongrid-timing")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks the tests that start processes, and puts the slow directories first. Every
    process computes the same order, as xdist requires, and no test depends on it."""
    for item in items:
        if item.nodeid.startswith(_STARTS_PROCESSES):
            item.add_marker(pytest.mark.processes)
    items.sort(key=_rank)  # stable: a module's tests keep their order
