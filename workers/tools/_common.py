"""Helpers every tool family shares: settings lookup, error results, output caps, HTTP GET/POST.

Settings arrive on ``context.settings`` (an object whose attributes may be missing), never from
``os.environ``: the entry point builds them once and a test can hand in its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from registry.tools import ToolContext, ToolResult

#: Every network call gives up after this many seconds: a hung backend must not hang the turn.
HTTP_TIMEOUT = 10.0

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d|w)$")
_DURATION_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class BackendError(Exception):
    """A backend call that failed; the message is written for the model to read."""

    def result(self) -> ToolResult:
        return ToolResult(content=str(self), is_error=True)


def setting(context: ToolContext, name: str, default: Any = None) -> Any:
    """One setting, or ``default`` when the settings object lacks it or holds ``None``/``""``."""
    value = getattr(context.settings, name, None)
    return default if value is None or value == "" else value


def truthy(value: Any) -> bool:
    """A boolean setting that may have arrived as a string from the environment."""
    if isinstance(value, str):
        return value.strip().lower() in {"1", "true", "yes", "on"}
    return value is True


def path_list(value: Any) -> list[str]:
    """A list-of-paths setting given as a list or as one ``os.pathsep``-separated string."""
    if not value:
        return []
    if isinstance(value, str):
        return [p for p in value.split(os.pathsep) if p.strip()]
    return [str(p) for p in value]


def not_configured(tool: str, env_var: str, what: str) -> ToolResult:
    """The honest answer of a tool whose backend is not set up: no data, and how to fix it."""
    return ToolResult(
        content=f"{tool} is not configured: set {env_var} ({what}) for this worker.",
        is_error=True,
    )


def error(message: str) -> ToolResult:
    return ToolResult(content=message, is_error=True)


def cap_text(text: str, limit: int, what: str = "output") -> str:
    """Cut ``text`` to ``limit`` characters, saying how much was dropped."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[{what} truncated: {len(text) - limit} more characters not shown]"


def to_seconds(duration: str) -> float | None:
    """``"90s"``, ``"15m"``, ``"1h"``, ``"7d"`` in seconds; ``None`` if it is not a duration."""
    match = _DURATION.match(duration.strip())
    if not match:
        return None
    return float(match.group(1)) * _DURATION_SECONDS[match.group(2)]


def resolve_time(value: str, now: float | None = None) -> str:
    """A relative duration (``"1h"``: one hour ago) as a unix timestamp; anything else unchanged,
    so RFC 3339 and unix timestamps pass straight to the backend."""
    seconds = to_seconds(value)
    if seconds is None:
        return value.strip()
    return f"{(time.time() if now is None else now) - seconds:.3f}"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # A redirect could lead anywhere; tools only talk to the URL an operator configured.
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]
        return None


# No ProxyHandler: requests go straight to the configured backend, not through an ambient proxy.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())


def build_url(base_url: str, path: str, params: Mapping[str, Any] | None = None) -> str:
    """``base_url`` + ``path`` + query string; refuses anything but http(s) base URLs."""
    parsed = urllib.parse.urlsplit(base_url)
    if parsed.scheme not in {"http", "https"} or not parsed.netloc:
        raise BackendError(f"configured URL {base_url!r} is not an http(s) URL")
    query = urllib.parse.urlencode({k: v for k, v in (params or {}).items() if v is not None})
    return base_url.rstrip("/") + path + (f"?{query}" if query else "")


def http_request(
    url: str,
    *,
    service: str,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    max_bytes: int = 8 * 1024 * 1024,
) -> bytes:
    """GET (or POST when ``body`` is given) ``url``; failures become :class:`BackendError`."""
    request = urllib.request.Request(url, data=body, headers=dict(headers or {}))
    try:
        with _OPENER.open(request, timeout=HTTP_TIMEOUT) as response:
            return response.read(max_bytes)
    except urllib.error.HTTPError as exc:
        with contextlib.closing(exc):
            detail = exc.read(2000).decode("utf-8", "replace").strip()
        raise BackendError(f"{service} answered HTTP {exc.code}: {detail or exc.reason}") from None
    except OSError as exc:  # URLError, timeouts, refused connections
        reason = getattr(exc, "reason", exc)
        raise BackendError(f"could not reach {service} at {url}: {reason}") from None


def http_json(url: str, *, service: str, **kwargs: Any) -> Any:
    """:func:`http_request` decoded as JSON."""
    raw = http_request(url, service=service, **kwargs)
    try:
        return json.loads(raw)
    except ValueError:
        snippet = raw[:200].decode("utf-8", "replace")
        raise BackendError(f"{service} returned something that is not JSON: {snippet!r}") from None


def to_json(value: Any) -> str:
    """Compact but readable JSON for tool output."""
    return json.dumps(value, indent=1, ensure_ascii=False, default=str)
