"""Entry module of ``celery -A workers.app worker …`` (and of Flower, ``celery inspect``).

Importing it reads nothing and builds nothing. The first access of ``app`` (Celery's, when it
resolves ``-A workers.app``) loads the settings from the environment, once per process, and
builds the app with :func:`coordinator.worker.worker_app`: the same worker ``ongrid worker``
runs, with user personas from the database, the coordinator and the process hardening.

That import reaches from ``workers/`` into ``coordinator/``, against the direction dependencies
otherwise take: this module is an entry point, the top of the graph like a ``__main__``. Nothing
in the packages imports it, and it imports ``coordinator`` only when ``app`` is first asked for,
so there is no import cycle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from celery import Celery

    app: Celery

__all__ = ["app"]


def __getattr__(name: str) -> Any:
    if name == "app":
        from coordinator.worker import entry_app

        return entry_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
