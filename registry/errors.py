"""The project's exception root and its families.

Every error the runtime raises on purpose derives from :class:`OngridError`, so callers can tell
"we refused this, here is why" apart from programming errors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "FieldProblem",
    "NotFoundError",
    "OngridError",
    "PersonaError",
    "ReadOnlyError",
    "TemplateError",
    "ToolArgumentError",
    "UserError",
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
