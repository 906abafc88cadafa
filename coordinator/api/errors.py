"""Every HTTP error of the API, mapped in one place.

Endpoints raise the runtime's own exceptions (:class:`~registry.errors.NotFoundError`,
:class:`~registry.errors.PersonaError`, :class:`~coordinator.auth.Unauthorized`, …) or an
:class:`ApiError`; the handlers installed by :func:`install_error_handlers` turn each into one JSON
shape::

    {"error": {"code": "not_found", "message": "unknown agent 'x'; known: …", "details": {…}}}

Nothing a client sends should produce a 500: bad input is a 4xx naming the problem, an unreachable
dependency is a 503 naming it. :class:`BodyLimitMiddleware` answers 413 for oversized bodies before
they reach FastAPI. A request past one of the ``limits`` settings is a 429 ``limit_exceeded`` whose
details name the limit, its value and the setting (``limits.streams_per_user``), with
``Retry-After`` for the rate limits.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from coordinator.auth import Forbidden, Unauthorized
from coordinator.storage.engine import DatabaseUnavailable
from registry.errors import FieldProblem, NotFoundError, PersonaError, ReadOnlyError, UserError
from workers.consumers import NoConsumer
from workers.limits import LimitExceeded

__all__ = [
    "JsonBodyMiddleware",
    "ApiError",
    "BodyLimitMiddleware",
    "Conflict",
    "error_response",
    "install_error_handlers",
]

log = logging.getLogger(__name__)

#: Error codes for plain HTTP statuses (unknown route, wrong method, …).
_STATUS_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "too_many_requests",
    503: "unavailable",
}


class ApiError(Exception):
    """A refusal that belongs to the HTTP layer (no runtime exception says it)."""

    status = 400
    code = "bad_request"

    def __init__(
        self, message: str, details: Any = None, *, status: int | None = None, code: str = ""
    ) -> None:
        super().__init__(message)
        self.message, self.details = message, details
        self.status = status or self.status
        self.code = code or self.code


class Conflict(ApiError):
    """The request is valid but the state of the resource forbids it (HTTP 409)."""

    status = 409
    code = "conflict"


def error_response(
    status: int, code: str, message: str, details: Any = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    """The one error shape every handler returns."""
    body = {"error": {"code": code, "message": message, "details": details}}
    return JSONResponse(body, status_code=status, headers=headers)


def _problems(problems: Sequence[FieldProblem]) -> list[dict[str, str]]:
    return [{"field": p.field, "message": p.message} for p in problems]


def _validation_problems(errors: Sequence[Any]) -> list[dict[str, str]]:
    """FastAPI's validation errors as ``{"in", "field", "message"}`` (the input is not echoed)."""
    out = []
    for err in errors:
        loc = [str(part) for part in err.get("loc", ())]
        where, path = (loc[0], loc[1:]) if loc else ("body", [])
        message = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
        if err.get("type") == "json_invalid":
            detail = (err.get("ctx") or {}).get("error")
            message = f"malformed JSON: {detail}" if detail else "malformed JSON"
        out.append({"in": where, "field": ".".join(path), "message": message})
    return out


# -- handlers ----------------------------------------------------------------------------------


async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
    return error_response(exc.status, exc.code, exc.message, exc.details)


async def _unauthorized(request: Request, exc: Unauthorized) -> JSONResponse:
    # RFC 6750 §3: no credentials → a bare challenge; credentials that failed → invalid_token.
    sent = request.headers.get("authorization")
    challenge = 'Bearer error="invalid_token"' if sent else "Bearer"
    return error_response(401, "unauthorized", str(exc), headers={"WWW-Authenticate": challenge})


async def _forbidden(request: Request, exc: Forbidden) -> JSONResponse:
    return error_response(403, "forbidden", str(exc))


async def _not_found(request: Request, exc: NotFoundError) -> JSONResponse:
    details = {"kind": exc.kind, "name": exc.name, "choices": list(exc.choices)}
    return error_response(404, "not_found", str(exc), details)


async def _read_only(request: Request, exc: ReadOnlyError) -> JSONResponse:
    return error_response(409, "read_only", str(exc))


async def _invalid_persona(request: Request, exc: PersonaError) -> JSONResponse:
    message = f"invalid persona: {exc.reason}"
    return error_response(422, "invalid_persona", message, {"problems": _problems(exc.problems)})


async def _user_error(request: Request, exc: UserError) -> JSONResponse:
    return error_response(400, "bad_request", str(exc))


async def _limit_exceeded(request: Request, exc: LimitExceeded) -> JSONResponse:
    details = {"limit": exc.limit, "value": exc.value, "setting": exc.setting}
    headers = None
    if exc.retry_after is not None:
        retry_after = max(1, math.ceil(exc.retry_after))
        details["retry_after"] = retry_after
        headers = {"Retry-After": str(retry_after)}
    return error_response(429, "limit_exceeded", str(exc), details, headers=headers)


async def _request_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    problems = _validation_problems(exc.errors())
    summary = (
        "; ".join(f"{p['field'] or p['in']}: {p['message']}" for p in problems[:5])
        or "invalid request"
    )
    return error_response(422, "invalid_request", summary, {"problems": problems})


async def _database_down(request: Request, exc: Exception) -> JSONResponse:
    if not isinstance(exc, DatabaseUnavailable):
        log.warning("database error on %s %s: %s", request.method, request.url.path, exc)
    message = str(exc) if isinstance(exc, DatabaseUnavailable) else "the database is unreachable"
    return error_response(503, "database_unavailable", message)


async def _database_refused(request: Request, exc: DataError) -> JSONResponse:
    reason = (str(exc.orig or exc).strip().splitlines() or ["?"])[0]
    return error_response(422, "invalid_request", f"the database refused a value: {reason}")


async def _no_consumer(request: Request, exc: NoConsumer) -> JSONResponse:
    return error_response(503, "no_consumer", str(exc), {"queue": exc.queue})


async def _redis_down(request: Request, exc: redis.RedisError) -> JSONResponse:
    log.warning("redis error on %s %s: %s", request.method, request.url.path, exc)
    if str(exc).startswith(_POOL_EXHAUSTED):  # Redis answers; this process waits its turn
        message = "every Redis connection of this API process stayed busy; retry shortly"
        return error_response(503, "redis_busy", message, headers={"Retry-After": "1"})
    return error_response(503, "redis_unavailable", f"Redis is unreachable: {exc}")


#: What redis-py's bounded pool raises when no connection came free in time.
_POOL_EXHAUSTED = "No connection available"


#: What FastAPI says when a JSON body cannot be decoded at all (e.g. it is not UTF-8).
_UNPARSABLE_BODY = "There was an error parsing the body"


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    if exc.status_code == 400 and exc.detail == _UNPARSABLE_BODY:
        message = "malformed JSON: the body is not UTF-8 encoded JSON"
        return error_response(422, "invalid_request", message, {"problems": []})
    code = _STATUS_CODES.get(exc.status_code, "error")
    message = exc.detail if isinstance(exc.detail, str) else code.replace("_", " ")
    return error_response(exc.status_code, code, message, headers=getattr(exc, "headers", None))


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, "internal", "internal error; the server log has the details")


def install_error_handlers(app: FastAPI) -> None:
    """Register every handler. Order does not matter: Starlette picks the closest class."""
    handlers: dict[type[Exception], Any] = {
        ApiError: _api_error,
        Unauthorized: _unauthorized,
        Forbidden: _forbidden,
        NotFoundError: _not_found,
        ReadOnlyError: _read_only,
        PersonaError: _invalid_persona,
        UserError: _user_error,
        LimitExceeded: _limit_exceeded,
        RequestValidationError: _request_invalid,
        DatabaseUnavailable: _database_down,
        OperationalError: _database_down,
        DataError: _database_refused,
        NoConsumer: _no_consumer,
        redis.ConnectionError: _redis_down,
        redis.TimeoutError: _redis_down,
        StarletteHTTPException: _http_error,
        Exception: _unexpected,
    }
    for exc_class, handler in handlers.items():
        app.add_exception_handler(exc_class, handler)


# -- request size ------------------------------------------------------------------------------


#: Content types a body is sent with when its sender did not say it is JSON: curl's ``-d``
#: default, and none at all.
_UNDECLARED = frozenset({b"", b"application/x-www-form-urlencoded", b"text/plain"})


class JsonBodyMiddleware:
    """Read the body of an API request as JSON when its sender did not declare it so.

    ``curl -d '{…}'`` sends ``application/x-www-form-urlencoded`` unless ``-H 'Content-Type:
    application/json'`` is given, and the source documents' calls leave the header out. No route
    of the API takes a form, so such a body is parsed as the JSON it is (and one that is not
    JSON is refused as such, naming where it stops parsing).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] in ("POST", "PATCH", "PUT")
            and scope["path"].startswith(("/api/", "/v1/"))
        ):
            headers = list(scope.get("headers") or [])
            declared = dict(headers).get(b"content-type", b"").split(b";")[0].strip().lower()
            if declared in _UNDECLARED:
                headers = [(k, v) for k, v in headers if k != b"content-type"]
                headers.append((b"content-type", b"application/json"))
                scope = {**scope, "headers": headers}
        await self.app(scope, receive, send)


class BodyLimitMiddleware:
    """Answer 413 to a request whose body is larger than ``max_bytes``.

    A ``Content-Length`` over the limit is refused before anything is read; a chunked body is
    read up to the limit and refused as soon as it goes past it. An accepted body is replayed to
    the app, and later ``receive`` calls (the disconnect a stream waits for) go through unchanged.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away while sending
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                await self._refuse(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit = f"{self.max_bytes // 1024} KiB" if self.max_bytes >= 1024 else f"{self.max_bytes} B"
        response = error_response(
            413,
            "payload_too_large",
            f"request body is larger than {limit}",
            {"max_bytes": self.max_bytes},
            headers={"Connection": "close"},
        )
        await response(scope, receive, send)
