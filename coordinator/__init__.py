"""What people use: the coordinator, the HTTP API, the CLI, notifications and schedules."""

from __future__ import annotations

from importlib import metadata

__all__ = ["version"]


def version() -> str:
    """The installed package's version; ``0+unknown`` in a checkout that was not installed."""
    try:
        return metadata.version("ongrid-personas")
    except metadata.PackageNotFoundError:
        return "0+unknown"
