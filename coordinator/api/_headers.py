"""Headers every response of the API carries, whatever produced it.

No page of the API may be framed by another site (clickjacking of ``/docs``, ``/redoc``, the
console or an error page): ``X-Frame-Options: DENY`` for older browsers, and a
``Content-Security-Policy`` with ``frame-ancestors 'none'`` for the rest. A response that sets
its own policy (the console's, which also has ``frame-ancestors 'none'``) keeps it; Swagger UI and
ReDoc, whose pages run inline scripts, get only the framing directive.

A plain ASGI middleware rather than Starlette's ``BaseHTTPMiddleware``: it touches only the
start of a response, so event streams flow through it unbuffered.
"""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["FRAMING_HEADERS", "FramingHeadersMiddleware"]

#: Set on every response that does not set the header itself.
FRAMING_HEADERS = {
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


class FramingHeadersMiddleware:
    """Adds :data:`FRAMING_HEADERS` to every HTTP response (see the module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in FRAMING_HEADERS.items():
                    if name not in headers:
                        headers[name] = value
            await send(message)

        await self.app(scope, receive, send_with_headers)
