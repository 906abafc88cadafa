"""A spawn budget as data: the limits on what one spawn may spend.

Three places set one, each a :class:`Budget`: the organisation's defaults (``budget`` in the
config file, :attr:`registry.settings.Settings.budget`), a persona's ``metadata.ongrid.budget``,
and a request (the chat API's ``budget``, ``SpawnClient.spawn(budget=...)``). The runtime
resolves them, with what a coordinator has left for the specialists it dispatches, into the
budget a spawn runs within, and enforces it (:mod:`workers.budget`). This module is only the
shape and its validation, so settings and personas can check a budget where they are read.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["Budget"]


class Budget(BaseModel):
    """Limits on one spawn, each optional (unset: no limit) and positive.

    Unknown keys are refused, unlike the rest of a persona's metadata: a misspelt limit that was
    silently ignored would let a spawn run unbounded.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_tokens: int | None = Field(
        default=None, gt=0, description="Model tokens (prompt + completion) over all its calls."
    )
    max_cost_usd: float | None = Field(
        default=None, gt=0, allow_inf_nan=False, description="Model cost in USD (litellm's)."
    )
    max_seconds: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="Seconds of running; time parked waiting for a person does not count.",
    )
    max_tool_calls: int | None = Field(default=None, gt=0, description="Tool calls it runs.")

    @field_validator("*", mode="before")
    @classmethod
    def _not_a_flag(cls, value: Any) -> Any:
        # pydantic reads true as 1; a YAML `max_tool_calls: yes` is a mistake, not one call.
        if isinstance(value, bool):
            raise ValueError(f"expected a positive number, got {value!r}")
        return value

    @property
    def unlimited(self) -> bool:
        """Whether no limit is set."""
        return all(getattr(self, name) is None for name in type(self).model_fields)
