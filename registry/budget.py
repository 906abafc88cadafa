"""A spawn budget as data: the limits on what one spawn may spend.

Three places set one, each a :class:`Budget`: the organisation's defaults (``budget`` in the
config file, :attr:`registry.settings.Settings.budget`), a persona's ``metadata.ongrid.budget``,
and a request (the chat API's ``budget``, ``SpawnClient.spawn(budget=...)``). The runtime
resolves them, with what a coordinator has left for the specialists it dispatches, into the
budget a spawn runs within, and enforces it (:mod:`workers.budget`). This module is only the
shape and its validation, so settings and personas can check a budget where they are read.

The organisation's budget (:class:`OrgBudget`) is never empty: every spawn runs within finite
defaults unless the config file lifts one by giving a larger number.

Beside what a spawn may spend, a tool may bound how often a spawn calls it
(:class:`CallLimits`, :attr:`registry.tools.BaseTool.call_limits`): the coordinator's
``spawn_agent`` is bounded per model reply and per turn, so one reply cannot start thirty
specialists at once. The loop enforces it (:mod:`workers.loop`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["Budget", "CallLimits", "OrgBudget"]


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


class OrgBudget(Budget):
    """The organisation's budget (``budget:`` in the config file): every spawn runs within it.

    Unlike a persona's or a request's budget, it has finite defaults, generous enough for a long
    investigation and never unbounded: a persona runs 15 model calls unless it says otherwise,
    each at most a model's context window, so a few hundred thousand tokens per specialist and a
    few million for a coordinator turn that dispatches a dozen of them; 400 tool calls is some
    25 per specialist of such a turn; four hours is longer than any investigation a person
    waits for, and shorter than ``spawn_time_limit_seconds`` (6 h), so a spawn that runs that
    long stops with its partial answer rather than being failed. Cost has no default: the token
    limit already bounds it at any model's price, and one USD figure would be too low for one
    model and meaningless for another (litellm prices a local model at zero).

    The config file's ``budget:`` replaces these key by key: a key left out keeps its default.
    ``null`` is refused rather than read as "no limit" (an empty YAML value is ``null`` too, and
    would silently lift a limit): an operator lifts one by giving a larger number.
    """

    max_tokens: int | None = Field(
        default=5_000_000,
        gt=0,
        description="Model tokens (prompt + completion) over all its calls.",
    )
    max_seconds: float | None = Field(
        default=4 * 3600.0,
        gt=0,
        allow_inf_nan=False,
        description="Seconds of running; time parked waiting for a person does not count.",
    )
    max_tool_calls: int | None = Field(default=400, gt=0, description="Tool calls it runs.")

    @model_validator(mode="before")
    @classmethod
    def _from_budget(cls, data: Any) -> Any:
        # A plain Budget given in code (``Settings(budget=Budget(...))``) sets only its limits;
        # the defaults stand for the rest, as for the config file.
        if isinstance(data, Budget) and not isinstance(data, OrgBudget):
            return data.model_dump(exclude_none=True)
        return data

    @field_validator("*", mode="before")
    @classmethod
    def _not_null(cls, value: Any) -> Any:
        if value is None:
            raise ValueError(
                "null is not a limit: leave the key out to keep the default, or give a larger "
                "number to lift it"
            )
        return value


@dataclass(frozen=True)
class CallLimits:
    """How many calls of one tool a spawn runs: in one model reply, and in all its replies.

    Calls beyond a bound are not run; each gets an error result saying the bound (and
    ``advice``, what to do instead). Calls a bound refused do not count.
    """

    #: Calls of the tool run per model reply (the first ones, in the model's order); ``None``:
    #: no bound.
    per_reply: int | None = None
    #: Calls of the tool run over the whole spawn (a coordinator turn), its resumed attempts
    #: included; ``None``: no bound.
    per_spawn: int | None = None
    #: A sentence for the model on what to do instead of the refused calls.
    advice: str = ""
