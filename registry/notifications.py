"""``notifications:`` in the config file: where news of background work and approvals goes.

Channels are named (``channels: {oncall: {type: slack, url: …}}``); routing rules say which
events reach which channels, optionally only for some personas or some users' spawns::

    notifications:
      console_url: https://ongrid.example.com
      channels:
        oncall: {type: slack, url: https://hooks.slack.com/services/T000/B000/XXXX}
        pager:  {type: webhook, url: https://hooks.example.com/ongrid, secret: <32+ chars>}
      rules:
        - events: [approval.requested, approval.expired]
          channels: [oncall, pager]
        - events: [spawn.finished, spawn.failed, budget.reached]
          channels: [oncall]
          personas: ["disk_*"]

What is delivered, and how, is :mod:`coordinator.notify`'s.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = [
    "EVENT_KINDS",
    "ChannelConfig",
    "EventKind",
    "NotificationSettings",
    "RoutingRule",
]

EventKind = Literal[
    "approval.requested",
    "approval.decided",
    "approval.expired",
    "spawn.finished",
    "spawn.failed",
    "budget.reached",
]
#: Every event a rule may name.
EVENT_KINDS: tuple[str, ...] = EventKind.__args__  # type: ignore[attr-defined]

#: Shortest secret a signed webhook accepts: a guessable key signs nothing.
MIN_SECRET_LENGTH = 32


def _http_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http:// or https:// URL with a host")
    return url


class ChannelConfig(BaseModel):
    """One destination: a Slack incoming webhook or a generic JSON webhook (signed)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["slack", "webhook"]
    #: Where deliveries are POSTed (``http`` or ``https``). For Slack, the webhook's URL is its
    #: credential: keep the config file private.
    url: str = Field(repr=False)
    #: The HMAC-SHA256 key of ``X-Ongrid-Signature`` (webhooks; at least 32 characters).
    secret: str = Field(default="", repr=False)
    #: Seconds one delivery attempt may take, connecting included.
    timeout_seconds: float = Field(default=10.0, gt=0, le=120)

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        return _http_url(url)

    @model_validator(mode="after")
    def _signed_webhook(self) -> ChannelConfig:
        if self.type == "webhook" and len(self.secret) < MIN_SECRET_LENGTH:
            raise ValueError(
                f"a webhook channel needs a secret of at least {MIN_SECRET_LENGTH} characters "
                "(its deliveries are signed with it)"
            )
        return self


class RoutingRule(BaseModel):
    """Which events go to which channels. An empty filter matches everything; ``personas``
    holds name patterns with ``*`` wildcards; ``users`` are the spawns' owners."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    events: list[EventKind] = Field(min_length=1)
    channels: list[str] = Field(min_length=1)
    personas: list[str] = Field(default_factory=list)
    users: list[str] = Field(default_factory=list)
    #: ``spawn.*`` and ``budget.reached``: only spawns that ran in the background (nobody was
    #: watching them), or also those a person followed live.
    background_only: bool = True

    def matches(self, kind: str, persona: str, owner: str) -> bool:
        if kind not in self.events:
            return False
        if self.personas and not any(fnmatch.fnmatchcase(persona, p) for p in self.personas):
            return False
        return not self.users or owner in self.users


class NotificationSettings(BaseModel):
    """Channels, routing rules and delivery bounds (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Base URL people open the console at: every notification links to the spawn's page or
    #: the approval's card there (sign-in required).
    console_url: str = "http://127.0.0.1:8080"
    channels: dict[str, ChannelConfig] = Field(default_factory=dict)
    rules: list[RoutingRule] = Field(default_factory=list)
    #: Attempts of one delivery before it is given up and recorded as failed.
    max_attempts: int = Field(default=8, ge=1, le=100)
    #: The first retry waits up to this long, each next one up to twice as long (full jitter),
    #: never more than ``retry_max_seconds``, unless the receiver's ``Retry-After`` says more
    #: (honoured up to an hour).
    retry_base_seconds: float = Field(default=2.0, gt=0)
    retry_max_seconds: float = Field(default=300.0, gt=0)
    #: Deliveries in flight at once, in all and per channel: a channel that does not answer
    #: holds at most its share, never the others'.
    concurrency: int = Field(default=16, ge=1, le=256)
    per_channel: int = Field(default=4, ge=1, le=256)

    @field_validator("console_url")
    @classmethod
    def _console(cls, url: str) -> str:
        return _http_url(url).rstrip("/")

    @field_validator("channels")
    @classmethod
    def _channel_names(cls, channels: dict[str, ChannelConfig]) -> dict[str, ChannelConfig]:
        for name in channels:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", name):
                raise ValueError(
                    f"{name!r} is not a channel name: up to 64 letters, digits, '_', '.', '-'"
                )
        return channels

    @model_validator(mode="after")
    def _known_channels(self) -> NotificationSettings:
        for number, rule in enumerate(self.rules, start=1):
            unknown = sorted(set(rule.channels) - set(self.channels))
            if unknown:
                known = ", ".join(sorted(self.channels)) or "none"
                raise ValueError(
                    f"rule {number} names unknown channel(s) {', '.join(unknown)} "
                    f"(channels: {known})"
                )
        return self

    def channels_for(self, kind: str, persona: str, owner: str, background: bool) -> list[str]:
        """The channels the rules send event ``kind`` of ``persona``'s spawn of ``owner`` to."""
        spawn_event = not kind.startswith("approval.")
        found: list[str] = []
        for rule in self.rules:
            if spawn_event and rule.background_only and not background:
                continue
            if rule.matches(kind, persona, owner):
                found.extend(c for c in rule.channels if c not in found)
        return found
