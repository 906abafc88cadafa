"""What every staged incident is made of, and the recipe steps every follower shares.

A :class:`Scenario` names the shipped persona that investigates it, a ``stage`` context manager
that makes the fault real (and always undoes it), and the follower that plays the persona's
model. Staging yields a :class:`Staged`: the alert the persona is handed, the worker settings the
run needs, and the decisive evidence, read from the live system by the stage itself, that the
run must reach and cite.

The shared steps are those of every shipped persona's recipe: Step 0 is ``query_knowledge``
with a one-sentence description of the alert; a hit scoring at least 0.6 is the playbook,
followed and cited as ``(KB: <title>)``.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workers.testing.fake_openai import Reply
from workers.testing.recipe_model import Conversation, Follower, call

#: The playbooks of the staged incidents, as a team's knowledge base (``knowledge_dirs``).
KNOWLEDGE = Path(__file__).resolve().parent / "knowledge"
#: The persona files the scenarios run, as shipped.
SHIPPED_AGENTS = Path(__file__).resolve().parents[1] / "agents"
#: Tool calls a scenario may take to reach its evidence (the knowledge base included).
MAX_TOOL_CALLS = 6
#: The score from which a knowledge-base hit is a playbook to follow (the personas' rule).
PLAYBOOK_SCORE = 0.6

__all__ = [
    "KNOWLEDGE",
    "MAX_TOOL_CALLS",
    "SHIPPED_AGENTS",
    "Scenario",
    "Staged",
    "alert",
    "host",
    "kb_cite",
    "kb_line",
    "knowledge_first",
    "labels",
    "left_behind",
    "owned_name",
    "playbook",
    "stdout",
]


@dataclass(frozen=True)
class Staged:
    """A fault made real: what the persona is told, and what it must find."""

    alert: str
    """The alert notification the persona is spawned with."""
    evidence: dict[str, str]
    """Decisive values the live system produced (a pid, a use %, a part name), read by the stage
    itself: each must appear in a tool result of the run and in its final answer."""
    context: dict[str, Any] = field(default_factory=dict)
    """The spawn's context (``incident_id``, ``device_id``)."""
    env: dict[str, str] = field(default_factory=dict)
    """Settings the workers need for this incident (``PROMETHEUS_URL``, …)."""


@dataclass(frozen=True)
class Scenario:
    """One staged incident."""

    name: str
    persona: str
    """The name of the shipped persona (a file of ``agents/``) that investigates it."""
    stage: Callable[[Path], AbstractContextManager[Staged]]
    """Stage the fault with scratch space under the given directory; undone on exit."""
    follow: Follower

    @property
    def persona_file(self) -> Path:
        """The shipped file of :attr:`persona` (file names follow the source documents, so
        ``disk_specialist`` is ``specialist-disk.md``)."""
        named = re.compile(rf"^name: {re.escape(self.persona)}\s*$", re.MULTILINE)
        for path in sorted(SHIPPED_AGENTS.glob("*.md")):
            if named.search(path.read_text(encoding="utf-8")):
                return path
        raise LookupError(f"no shipped persona named {self.persona!r} in {SHIPPED_AGENTS}")


def owned_name(kind: str) -> str:
    """A name for what a stage leaves on the machine (a mount, a cgroup), carrying this
    process's pid so that a later stage can tell it from a live run's and clear it up."""
    return f"ongrid-scenario-{kind}-p{os.getpid()}-"


def left_behind(name: str) -> bool:
    """Whether ``name`` (from :func:`owned_name`) belongs to a process that no longer exists:
    a run killed before its teardown could run."""
    found = re.search(r"^ongrid-scenario-[a-z]+-p(\d+)-", name)
    if found is None:
        return False
    try:
        os.kill(int(found.group(1)), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def alert(alertname: str, summary: str, **fields: str) -> str:
    """An alert notification as Alertmanager's default template words it."""
    lines = [f"[FIRING:1] {alertname}: {summary}", "Labels:"]
    lines += [f"  {key} = {value}" for key, value in fields.items()]
    return "\n".join(lines)


def host() -> str:
    return socket.gethostname()


def labels(task: str) -> dict[str, str]:
    """The ``key = value`` label lines of an alert in the task."""
    return dict(re.findall(r"(?m)^\s+([A-Za-z_]+) = (.+?)\s*$", task))


def _summary(task: str) -> str:
    """The alert's one-line description: what Step 0 asks the knowledge base."""
    found = re.search(r"(?m)^\[FIRING[^\]]*\]\s*(.+)$", task)
    return found.group(1).strip() if found else task.strip().splitlines()[0]


def knowledge_first(conv: Conversation) -> Reply | None:
    """Step 0 of every recipe: the knowledge base before any other tool."""
    if conv.of("query_knowledge"):
        return None
    return call("query_knowledge", query=_summary(conv.task))


def playbook(conv: Conversation) -> str | None:
    """The title of the knowledge base's best hit when it is a playbook (score >= 0.6)."""
    searched = conv.of("query_knowledge")
    if not searched:
        return None
    best = re.search(r"(?m)^1\. (.+) \(score (\d\.\d+)\)$", searched[0].result)
    if best is None or float(best.group(2)) < PLAYBOOK_SCORE:
        return None
    return best.group(1)


def stdout(result: str) -> str:
    """The standard output of a ``bash`` result (between its ``--- stdout ---`` and
    ``--- stderr ---`` lines)."""
    _, _, rest = result.partition("--- stdout ---\n")
    return rest.partition("\n--- stderr ---")[0]


def kb_line(conv: Conversation) -> str:
    """The output's ``KB:`` field."""
    return f"KB: {playbook(conv) or 'none'}"


def kb_cite(conv: Conversation) -> str:
    """`` (KB: <title>)`` after a claim the playbook backs; nothing without a playbook."""
    found = playbook(conv)
    return f" (KB: {found})" if found else ""
