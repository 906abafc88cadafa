"""Coordinator turns: a chat message without a named agent becomes a spawn of the coordinator.

The coordinator runs like any persona (same loop, same checkpoints and recovery), on its own
queue, with the AgentTool as its only tool. :func:`install` teaches a worker process to run it;
:func:`start_turn` is what the API calls.
"""

from __future__ import annotations

import threading
from typing import Any

from coordinator.agent_tool import SpawnAgentTool, dispatch_limits
from coordinator.catalog import COORDINATOR, coordinator_persona
from registry.budget import Budget
from registry.tools import ToolContext
from workers.celery_app import QUEUES
from workers.client import SpawnClient
from workers.runtime import WorkerRuntime
from workers.spawns import SpawnRecord

__all__ = ["install", "start_turn"]

_clients: dict[int, SpawnClient] = {}
_lock = threading.Lock()


def _client_for(runtime: WorkerRuntime):
    """The AgentTool's SpawnClient: one per runtime, sharing the worker's registry snapshot."""

    def factory(context: ToolContext) -> SpawnClient:
        with _lock:
            key = id(runtime)
            if key not in _clients:
                _clients[key] = SpawnClient(runtime.settings, registry=runtime.registry)
            return _clients[key]

    return factory


def install(runtime: WorkerRuntime) -> None:
    """Register the coordinator persona and the AgentTool in this worker process."""
    if SpawnAgentTool.name in runtime.catalog:
        return
    tool = SpawnAgentTool(_client_for(runtime), dispatch_limits(runtime.settings))
    runtime.catalog.register(tool)
    # Rendered once at start-up so the operator can read the catalog the coordinator will see
    # (``--loglevel=DEBUG``); each turn renders it again from its own snapshot.
    coordinator_persona(runtime.registry.snapshot(), model=runtime.settings.coordinator_model)
    runtime.register_persona(
        COORDINATOR,
        lambda snapshot: coordinator_persona(snapshot, model=runtime.settings.coordinator_model),
    )


def start_turn(
    client: SpawnClient,
    *,
    session_id: str,
    prompt: str,
    user: str,
    role: str,
    context: dict[str, Any] | None = None,
    budget: Budget | None = None,
) -> SpawnRecord:
    """Enqueue the coordinator for one chat message; its events land on the session stream.

    ``context`` is the turn's: every specialist the coordinator spawns in it starts from this
    context, whatever the model passes (see :mod:`coordinator.agent_tool`). ``budget`` is the
    turn's: it covers the specialists the coordinator dispatches too.
    """
    return client.spawn(
        COORDINATOR,
        prompt,
        context=context,
        role=role,
        user=user,
        session_id=session_id,
        queue=QUEUES["coordinator"],
        budget=budget,
    )
