"""A scheduled investigation as data: which persona runs, with what, when, for whom.

A schedule comes from the config file (``schedules:`` in ``ONGRID_CONFIG``) or from the HTTP API
(stored in the database); both are read into :class:`ScheduleSpec`. When it runs is either a
five-field cron expression (minute hour day-of-month month day-of-week, in UTC, read by Celery's
``crontab`` parser) or an interval in seconds. This module only checks the shape; running it is
the beat's and the workers' business (:mod:`workers.scheduling`, :mod:`coordinator.schedules`).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from registry.budget import Budget
from registry.template import check_context

__all__ = ["CRON_FIELDS", "ScheduleSpec", "cron_problem"]

#: The five fields of a cron expression, in order.
CRON_FIELDS = ("minute", "hour", "day_of_month", "month_of_year", "day_of_week")
#: Each field's range, as Celery's parser takes it (max exclusive, min).
_RANGES = {
    "minute": (60, 0),
    "hour": (24, 0),
    "day_of_month": (31, 1),
    "month_of_year": (12, 1),
    "day_of_week": (7, 0),
}
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")


def cron_problem(expression: str) -> str | None:
    """What is wrong with ``expression`` (naming the field), or None when Celery reads it."""
    from celery.schedules import ParseException, crontab_parser, weekday

    parts = expression.split()
    if len(parts) != len(CRON_FIELDS):
        return f"expected 5 fields (minute hour day-of-month month day-of-week), got {len(parts)}"
    for field, part in zip(CRON_FIELDS, parts, strict=True):
        top, bottom = _RANGES[field]
        try:
            if field == "day_of_week" and part.isalpha() and part != "*":
                weekday(part)
            else:
                values = crontab_parser(top, bottom).parse(part)
                if not values:
                    raise ValueError("no value")
        except (ParseException, ValueError, KeyError) as exc:
            return f"{field} {part!r} is invalid: {exc}"
    return None


class ScheduleSpec(BaseModel):
    """One schedule: a background spawn of ``persona`` started by the beat at each due time.

    Exactly one of ``cron`` and ``interval_seconds`` is set.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Its id: lowercase letters, digits, ``-`` and ``_``.
    name: str
    #: The persona each run spawns.
    persona: str = Field(min_length=1)
    #: The question each run asks.
    prompt: str = Field(min_length=1, max_length=20_000)
    #: The spawn context (templated into the persona's ``initial_prompt``).
    context: dict[str, Any] = Field(default_factory=dict)
    #: Five-field cron expression, UTC (``0 7 * * *``: every day at 07:00).
    cron: str | None = None
    #: Or: a run every this many seconds.
    interval_seconds: float | None = Field(default=None, ge=1, le=366 * 86400)
    #: Whose runs they are (their budgets, their rate limit, who may see them).
    owner: str = Field(default="", max_length=255)
    #: The role the runs spawn with (its tool bag); empty: ``default_role``.
    role: str = ""
    #: Each run's budget, shaped like the chat API's ``budget``.
    budget: Budget | None = None
    #: Notification channels told of each run's end.
    channels: list[str] = Field(default_factory=list)
    enabled: bool = True

    @field_validator("name")
    @classmethod
    def _slug(cls, name: str) -> str:
        if not _NAME.fullmatch(name):
            raise ValueError(
                f"{name!r} is not a schedule name: up to 63 lowercase letters, digits, '-' and "
                "'_', starting with a letter or digit"
            )
        return name

    @field_validator("context")
    @classmethod
    def _context(cls, context: dict[str, Any]) -> dict[str, Any]:
        check_context(context)  # what a spawn would refuse, refused when the schedule is made
        return context

    @field_validator("cron")
    @classmethod
    def _cron(cls, cron: str | None) -> str | None:
        if cron is None:
            return None
        cron = " ".join(cron.split())
        problem = cron_problem(cron)
        if problem:
            raise ValueError(problem)
        return cron

    @model_validator(mode="after")
    def _one_cadence(self) -> ScheduleSpec:
        if (self.cron is None) == (self.interval_seconds is None):
            raise ValueError("give exactly one of cron and interval_seconds")
        return self

    @property
    def cadence(self) -> str:
        """How often it runs, for people: the cron expression or ``every N s``."""
        if self.cron is not None:
            return f"cron {self.cron} (UTC)"
        return f"every {self.interval_seconds:g} s"
