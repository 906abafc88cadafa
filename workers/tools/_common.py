"""Helpers every tool family shares: settings lookup, error results, output caps, HTTP GET/POST.

Settings arrive on ``context.settings`` (an object whose attributes may be missing), never from
``os.environ``: the entry point builds them once and a test can hand in its own.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from registry.tools import ToolContext, ToolResult

#: Every network call gives up after this many seconds, unless the ``backend_timeout_seconds``
#: setting says otherwise: a hung backend must not hang the turn.
HTTP_TIMEOUT = 10.0
#: A larger answer is refused rather than parsed: the model could not read it anyway.
MAX_RESPONSE_BYTES = 8 * 1024 * 1024
#: Request headers that carry credentials: a 401 with none of them means none were set.
_CREDENTIAL_HEADERS = frozenset({"authorization", "x-clickhouse-user", "x-clickhouse-key"})
#: Go's ``http.NotFound`` body: the path is not the backend's API, so its base URL is wrong.
_GO_NOT_FOUND = "404 page not found"

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d|w)$")
_DURATION_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class BackendError(Exception):
    """A backend call that failed; the message is written for the model to read."""

    def result(self) -> ToolResult:
        return ToolResult(content=str(self), is_error=True)


@dataclass(frozen=True)
class Service:
    """A backend as its errors name it, with the settings that point at it and log in to it."""

    name: str
    url_setting: str
    """The environment variable of its base URL, e.g. ``PROMETHEUS_URL``."""
    auth_settings: str = ""
    """The variables holding its credentials, as a person would set them."""


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


def backend_timeout(context: ToolContext) -> float:
    """Seconds a backend call may take: ``backend_timeout_seconds``, else :data:`HTTP_TIMEOUT`."""
    value = setting(context, "backend_timeout_seconds", HTTP_TIMEOUT)
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return HTTP_TIMEOUT
    return seconds if seconds > 0 else HTTP_TIMEOUT


def auth_headers(context: ToolContext, prefix: str) -> dict[str, str]:
    """``Authorization`` for a backend whose settings start with ``prefix``: a bearer token
    (``<prefix>_bearer_token``) if set, else basic auth (``<prefix>_user`` / ``_password``)."""
    token = setting(context, f"{prefix}_bearer_token")
    if token:
        return {"Authorization": f"Bearer {token}"}
    user = setting(context, f"{prefix}_user")
    if not user:
        return {}
    pair = f"{user}:{setting(context, f'{prefix}_password', '')}".encode()
    return {"Authorization": "Basic " + base64.b64encode(pair).decode()}


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


def _origin(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _backend_message(raw: str) -> str:
    """The backend's own error text: a JSON answer's ``error`` (Prometheus: ``errorType``
    first) or ``message``, else the body as it came."""
    try:
        parsed = json.loads(raw)
    except ValueError:
        return raw
    if not isinstance(parsed, dict):
        return raw
    message = parsed.get("error") or parsed.get("message")
    if not message:
        return raw
    kind = parsed.get("errorType")
    return f"{kind}: {message}" if kind else str(message)


def _http_error(service: Service, code: int, detail: str, url: str, sent_auth: bool) -> str:
    if code in (401, 403):
        what = "were refused" if sent_auth else "are missing (none were sent)"
        fix = f"set {service.auth_settings}" if service.auth_settings else "check its access rules"
        return (
            f"{service.name} at {_origin(url)} refused the request (HTTP {code}: {detail}): "
            f"the credentials {what}; {fix} for this worker."
        )
    if code == 404 and detail == _GO_NOT_FOUND:
        return (
            f"{service.name} answered HTTP 404 ({detail}) for {urllib.parse.urlsplit(url).path}: "
            f"{service.url_setting} should be its base URL (no path), e.g. {_origin(url)}."
        )
    if 400 <= code < 500:
        return f"{service.name} rejected the query (HTTP {code}): {detail}"
    return f"{service.name} answered HTTP {code}: {detail}"


def _as_service(service: Service | str) -> Service:
    if isinstance(service, Service):
        return service
    return Service(service, f"the {service} URL setting")


def http_request(
    url: str,
    *,
    service: Service | str,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    max_bytes: int = MAX_RESPONSE_BYTES,
    timeout: float = HTTP_TIMEOUT,
) -> bytes:
    """GET (or POST when ``body`` is given) ``url``; failures become :class:`BackendError`
    messages that say what to fix: the URL setting (unreachable), the credentials (401/403),
    the query (the backend's own message, verbatim), or the query's size (timeout, size cap)."""
    backend = _as_service(service)
    sent = dict(headers or {})
    request = urllib.request.Request(url, data=body, headers=sent)
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            raw = bytes(response.read(max_bytes + 1))
    except urllib.error.HTTPError as exc:
        with contextlib.closing(exc):
            detail = exc.read(4000).decode("utf-8", "replace").strip()
        message = _backend_message(detail) or str(exc.reason)
        sent_auth = any(k.lower() in _CREDENTIAL_HEADERS for k in sent)
        raise BackendError(_http_error(backend, exc.code, message, url, sent_auth)) from None
    except (OSError, http.client.HTTPException) as exc:  # refused, reset, timed out, cut short
        reason = getattr(exc, "reason", exc)
        if isinstance(exc, TimeoutError) or isinstance(reason, TimeoutError):
            raise BackendError(
                f"{backend.name} at {_origin(url)} did not answer within {timeout:g} s: ask "
                "for less (a shorter range, fewer series, a narrower filter), or raise "
                "ONGRID_BACKEND_TIMEOUT_SECONDS"
            ) from None
        raise BackendError(
            f"could not reach {backend.name} at {_origin(url)} ({reason}): is it running, "
            f"and is {backend.url_setting} right?"
        ) from None
    if len(raw) > max_bytes:
        raise BackendError(
            f"{backend.name}'s answer is larger than {max_bytes / 1048576:g} MiB and was not "
            "read: ask for less (aggregate, a shorter range, a lower limit)"
        )
    return raw


def http_json(url: str, *, service: Service | str, **kwargs: Any) -> Any:
    """:func:`http_request` decoded as JSON."""
    backend = _as_service(service)
    raw = http_request(url, service=backend, **kwargs)
    try:
        return json.loads(raw)
    except ValueError:
        snippet = raw[:200].decode("utf-8", "replace")
        raise BackendError(
            f"{backend.name} returned something that is not JSON: {snippet!r}; is "
            f"{backend.url_setting} the {backend.name} base URL?"
        ) from None


def to_json(value: Any) -> str:
    """Compact but readable JSON for tool output."""
    return json.dumps(value, indent=1, ensure_ascii=False, default=str)
