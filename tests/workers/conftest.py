"""Fixtures of the workers' tests: the real sandbox the command tools run in, real backends."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from servers import ClickHouse, start_clickhouse

from workers.sandbox import Sandbox


@pytest.fixture(scope="session")
def sandbox() -> Sandbox:
    """bubblewrap as the workers use it. Not skipped when missing: the command tools are part of
    what the suite proves, and ``./dev test`` installs bubblewrap."""
    box = Sandbox()
    why = box.unavailable()
    if why is not None:
        pytest.fail(f"the command sandbox is unavailable on this machine: {why}")
    return box


@pytest.fixture(scope="session")
def clickhouse(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClickHouse]:
    """A real ClickHouse server with the read-only diagnostics user (``servers.DIAG_USER``)."""
    try:
        server = start_clickhouse(tmp_path_factory.mktemp("clickhouse"))
    except RuntimeError as exc:
        pytest.fail(str(exc))
    yield server
    server.stop()
