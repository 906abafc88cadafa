"""The real backend servers the tests start: they live in ``workers.testing.backends``, beside
the other test doubles the package ships, so scenarios start them the same way."""

from __future__ import annotations

from workers.testing.backends import (
    DIAG_PASSWORD,
    DIAG_USER,
    BackendMissing,
    ClickHouse,
    free_port,
    start_clickhouse,
)

__all__ = [
    "DIAG_PASSWORD",
    "DIAG_USER",
    "BackendMissing",
    "ClickHouse",
    "free_port",
    "start_clickhouse",
]
