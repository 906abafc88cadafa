"""One delivery attempt over HTTP, and what follows from its answer.

Every attempt POSTs the stored body with ``Content-Type: application/json``, the delivery's id as
``Idempotency-Key`` (the same on every attempt: a receiver that saw it already can drop it) and,
to a generic webhook, ``X-Ongrid-Timestamp`` (Unix seconds) and ``X-Ongrid-Signature:
sha256=<hex>``, the HMAC-SHA256 of ``<timestamp>.<body>`` under the channel's secret. Redirects
are not followed (a webhook that moved is a configuration to fix, not a hop to take blindly).

The answer decides: 2xx is done; 408, 429, 5xx, a timeout or a failed connection is tried again
later (after the receiver's ``Retry-After`` when it gives one, else after a jittered backoff);
anything else is given up at once, its status and the start of its body recorded.
"""

from __future__ import annotations

import email.utils
import hashlib
import hmac
import random
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx

from registry.notifications import ChannelConfig

__all__ = ["Answer", "attempt", "backoff", "sign"]

#: Longest wait a receiver's ``Retry-After`` is honoured for (seconds).
RETRY_AFTER_CAP = 3600.0
#: Characters of a refusing receiver's body kept with the delivery.
_ERROR_CHARS = 300


@dataclass(frozen=True)
class Answer:
    """What one attempt came to: ``done``, or ``retry`` (with the receiver's ``retry_after``
    seconds when it said), or neither (given up); ``status`` is the HTTP status, ``None`` when
    no answer came; ``error`` says why in one line."""

    done: bool
    retry: bool
    status: int | None = None
    error: str = ""
    retry_after: float | None = None


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """``X-Ongrid-Signature``'s value for ``body`` sent at ``timestamp``."""
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + digest.hexdigest()


def _retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return min(float(value), RETRY_AFTER_CAP)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return min(max(0.0, (when - datetime.now(UTC)).total_seconds()), RETRY_AFTER_CAP)


def attempt(
    client: httpx.Client, channel: ChannelConfig, delivery_id: str, kind: str, body: str
) -> Answer:
    """POST ``body`` to ``channel`` once (see the module docstring)."""
    data = body.encode()
    headers = {
        "Content-Type": "application/json",
        "Idempotency-Key": delivery_id,
        "X-Ongrid-Delivery": delivery_id,
        "X-Ongrid-Event": kind,
    }
    if channel.type == "webhook":
        timestamp = str(int(time.time()))
        headers["X-Ongrid-Timestamp"] = timestamp
        headers["X-Ongrid-Signature"] = sign(channel.secret, timestamp, data)
    try:
        response = client.post(
            channel.url, content=data, headers=headers, timeout=channel.timeout_seconds
        )
    except httpx.TimeoutException:
        return Answer(False, True, error=f"no answer within {channel.timeout_seconds:g} s")
    except httpx.HTTPError as exc:
        return Answer(False, True, error=f"{type(exc).__name__}: {exc}"[:_ERROR_CHARS])
    status = response.status_code
    if 200 <= status < 300:
        return Answer(True, False, status)
    said = " ".join(response.text.split())[:_ERROR_CHARS]
    error = f"HTTP {status}" + (f": {said}" if said else "")
    if status in (408, 429) or status >= 500:
        return Answer(False, True, status, error, _retry_after(response.headers.get("retry-after")))
    if 300 <= status < 400:
        error += " (redirects are not followed: fix the channel's url)"
    return Answer(False, False, status, error)


def backoff(attempts: int, base: float, cap: float, retry_after: float | None) -> float:
    """Seconds before the next attempt after ``attempts`` failed ones: the receiver's
    ``Retry-After`` when it gave one, else full jitter up to ``base × 2^(attempts-1)``, at
    most ``cap``."""
    if retry_after is not None:
        return retry_after
    return random.uniform(0, min(cap, base * 2 ** max(0, attempts - 1)))  # noqa: S311 - jitter
