"""The coordinator persona: its system prompt carries the catalog of specialists.

Each available persona appears with its name, description and the first line of its
``when_to_use``; the coordinator picks one by calling ``spawn_agent``. The persona is rebuilt from
the registry snapshot a coordinator turn starts with, so a reload changes the catalog of the next
turn and never the one in flight.
"""

from __future__ import annotations

import logging

from registry.agent_registry import Snapshot
from registry.persona import Persona
from registry.tools import AGENT_TOOL_NAME

__all__ = ["COORDINATOR", "catalog_lines", "coordinator_persona"]

log = logging.getLogger(__name__)

#: The reserved name the coordinator's own spawns run under.
COORDINATOR = "coordinator"

_INSTRUCTIONS = f"""\
# Coordinator

You are Ongrid's coordinator. You do not investigate yourself: you pick the specialist whose
trigger matches the user's question and dispatch it with `{AGENT_TOOL_NAME}`, then answer the user
from what it reports.

1. Read the question. Compare it with each specialist's trigger ("when") below.
2. Call `{AGENT_TOOL_NAME}` with `agent` = the specialist's name, `prompt` = the question restated
   with every detail the specialist needs, `context` = identifiers from the question (incident id,
   device id, host), and `reason` = the trigger that matched, in a few words.
3. A specialist marked (background) reports later; tell the user it was dispatched.
4. When the answer comes back, relay it faithfully and briefly; do not add claims of your own.
5. If no trigger matches, dispatch `generalist` when it is listed; otherwise say which information
   you need.

## Specialists
"""


def catalog_lines(snapshot: Snapshot) -> list[str]:
    """One line per spawnable persona: name, description, first line of ``when_to_use``."""
    lines = []
    for name in snapshot.names():
        if name == COORDINATOR or name in snapshot.unavailable:
            continue
        persona = snapshot.personas[name]
        flag = " (background)" if persona.background else ""
        lines.append(
            f"- `{name}`{flag}: {persona.description.strip()} When: {persona.catalog_hint}"
        )
    return lines


def coordinator_persona(snapshot: Snapshot, *, model: str = "") -> Persona:
    """The coordinator as a persona whose only tool is the AgentTool."""
    body = _INSTRUCTIONS + "\n".join(catalog_lines(snapshot)) + "\n"
    persona = Persona(
        name=COORDINATOR,
        description="Routes each question to the specialist whose trigger matches.",
        when_to_use="Every chat message that does not name an agent.",
        tools=[AGENT_TOOL_NAME],
        max_turns=8,
        model=model,
        critical_reminder=(
            "Dispatch a specialist for anything that needs evidence; never answer from memory."
        ),
        body=body,
    )
    log.debug("coordinator prompt (registry %s):\n%s", snapshot.digest, body)
    return persona
