"""The project's exception root and its families.

Every error the runtime raises on purpose derives from :class:`OngridError`, so callers can tell
"we refused this, here is why" apart from programming errors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "FieldProblem",
    "LeaseLost",
    "NotFoundError",
    "OngridError",
    "OutOfTurns",
    "PersonaError",
    "PersonaUnavailable",
    "ReadOnlyError",
    "RunError",
    "SpawnCancelled",
    "TemplateError",
    "ToolArgumentError",
    "UserError",
    "WorkerDraining",
]


class OngridError(Exception):
    """Root of every error raised on purpose by the runtime."""


class UserError(OngridError):
    """Bad input from a person (a persona file, a setting, a request); the message says the fix."""


@dataclass(frozen=True)
class FieldProblem:
    """One thing wrong with one field: ``field`` is a dotted path (``metadata.os``)."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


class PersonaError(UserError):
    """A persona that cannot be loaded: names the file (when there is one) and each bad field."""

    def __init__(self, problems: Sequence[FieldProblem], path: str | None = None) -> None:
        self.problems = tuple(problems)
        self.path = path
        super().__init__(self.reason)

    @property
    def reason(self) -> str:
        """The problems without the path, as a warning's ``reason`` carries them."""
        return "; ".join(str(p) for p in self.problems)

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}" if self.path else self.reason


class TemplateError(UserError):
    """An ``initial_prompt`` that uses template syntax outside the supported subset."""


class NotFoundError(UserError):
    """A persona, tool or role that does not exist; ``choices`` lists the names that do."""

    def __init__(self, kind: str, name: str, choices: Sequence[str] = ()) -> None:
        self.kind, self.name, self.choices = kind, name, tuple(choices)
        hint = f"; known: {', '.join(self.choices)}" if self.choices else ""
        super().__init__(f"unknown {kind} {name!r}{hint}")


class ReadOnlyError(UserError):
    """An edit aimed at a persona whose source (builtin, disk) cannot be edited through the API."""


class ToolArgumentError(UserError):
    """Arguments of a tool call that do not fit the tool's schema."""


class RunError(OngridError):
    """A spawn's run cannot go on as it is: the runtime ends it (failed, cancelled) or hands it to
    another attempt. Tools do not catch these: the loop lets them through to the runtime."""


class PersonaUnavailable(RunError):
    """The persona of a spawn is not available on this worker (its gates fail here)."""


class ModelUnusable(RunError):
    """The model a persona would run on cannot be used here (unknown provider, keys unset)."""


class LeaseLost(RunError):
    """This worker no longer holds the spawn: another attempt owns it now."""


class SpawnCancelled(RunError):
    """Someone asked the spawn to stop; it stops at its next checkpoint."""


class WorkerDraining(RunError):
    """The worker is shutting down: the spawn stops at its next checkpoint (or stops waiting on a
    specialist) and is put back on its queue, to resume on another worker."""


class OutOfTurns(RunError):
    """The spawn used its ``max_turns`` model calls without a final answer.

    The loop reports this as a ``failed`` outcome rather than raising it; the class names the
    case for callers that turn outcomes into exceptions.
    """
