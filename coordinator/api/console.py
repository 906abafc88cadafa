"""Serving the web console: its page at ``/`` and the SPA routes, its built assets.

The files are read once, when the app is built: only what ``dist/`` holds then is served, by
name from that allow-list, so no request path ever reaches the file system. The page holds no
data (every data call needs the bearer token), so these routes need none and are left out of
the OpenAPI document. Every response carries a strict Content-Security-Policy: the console runs
only its own script and style, and talks only to this origin.

Without a build (``dist/`` missing, or no ``index.html``) the API works as before and the console
routes answer 503 saying where the assets were looked for and how to build them.
"""

from __future__ import annotations

import hashlib
import html
import logging
import mimetypes
from dataclasses import dataclass
from pathlib import Path

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response

from coordinator.api.errors import error_response

__all__ = ["SECURITY_HEADERS", "SPA_ROUTES", "install_console"]

log = logging.getLogger(__name__)

#: Paths the single-page app routes itself (history API): each answers ``index.html``.
SPA_ROUTES = (
    "/",
    "/chat",
    "/chat/{session_id}",
    "/approvals",
    "/approvals/{spawn_id}/{call_id}",
    "/spawns/{spawn_id}",
    "/schedules",
    "/settings",
    "/settings/{rest:path}",
)
#: Sent with every console response.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'self'; "
        "frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
#: Media types of what the build emits; the platform's table (which varies) for anything else.
_MEDIA_TYPES = {
    ".html": "text/html",
    ".js": "text/javascript",
    ".mjs": "text/javascript",
    ".css": "text/css",
    ".map": "application/json",
    ".json": "application/json",
    ".txt": "text/plain",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
    ".woff2": "font/woff2",
}


@dataclass(frozen=True)
class _File:
    """One built file, held in memory with its validator."""

    body: bytes
    media_type: str
    etag: str

    @classmethod
    def read(cls, path: Path) -> _File:
        body = path.read_bytes()
        media_type = _MEDIA_TYPES.get(path.suffix.lower())
        if media_type is None:
            media_type = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        return cls(body, media_type, f'"{hashlib.sha256(body).hexdigest()[:32]}"')


def _matches(if_none_match: str | None, etag: str) -> bool:
    """RFC 9110 §13.1.2: any listed tag equal to ours (weak comparison), or ``*``."""
    if not if_none_match:
        return False
    tags = [tag.strip().removeprefix("W/") for tag in if_none_match.split(",")]
    return "*" in tags or etag in tags


def _serve(file: _File, request: Request) -> Response:
    # no-cache: the browser revalidates every time (a 304 when unchanged), so a new build is
    # picked up at the next load, never a stale script with a fresh page.
    headers = {**SECURITY_HEADERS, "ETag": file.etag, "Cache-Control": "no-cache"}
    if _matches(request.headers.get("if-none-match"), file.etag):
        return Response(status_code=304, headers=headers)
    return Response(file.body, media_type=file.media_type, headers=headers)


def _missing_page(dist: Path) -> Response:
    where = html.escape(str(dist))
    body = (
        '<!doctype html><html lang="en"><meta charset="utf-8"><title>Ongrid console</title>'
        f"<p>The console's built assets are missing from {where} (no index.html there). "
        "<code>./dev console</code> builds them; then restart the API. The HTTP API itself "
        "works without them.</p></html>\n"
    )
    return Response(body, status_code=503, media_type="text/html", headers=SECURITY_HEADERS)


@dataclass(frozen=True)
class _Build:
    """What ``dist/`` held when the app was built."""

    index: _File
    #: The allow-list: the files directly in ``dist/assets``, by name.
    assets: dict[str, _File]
    licences: _File | None

    @classmethod
    def load(cls, dist: Path) -> _Build | None:
        """The build in ``dist``; ``None`` without its page."""
        index = dist / "index.html"
        if not index.is_file():
            return None
        folder = dist / "assets"
        found = sorted(folder.iterdir()) if folder.is_dir() else []
        licences = dist / "licenses.txt"
        return cls(
            index=_File.read(index),
            assets={p.name: _File.read(p) for p in found if p.is_file()},
            licences=_File.read(licences) if licences.is_file() else None,
        )


def install_console(app: FastAPI, dist: Path) -> None:
    """Serve the console built in ``dist`` (logs one warning if there is no build)."""
    build = _Build.load(dist)
    if build is None:
        log.warning(
            "the web console's built assets are missing from %s: the console answers 503 "
            "(./dev console builds them); the API works without them",
            dist,
        )
    router = APIRouter(include_in_schema=False)

    async def page(request: Request) -> Response:
        return _serve(build.index, request) if build else _missing_page(dist)

    for path in SPA_ROUTES:
        router.add_api_route(path, page, methods=["GET"])

    @router.get("/assets/{name}")
    async def asset(name: str, request: Request) -> Response:
        if build is None:
            return _missing_page(dist)
        found = build.assets.get(name)
        if found is None:
            message = f"no console asset {name!r}"
            return error_response(404, "not_found", message, headers=SECURITY_HEADERS)
        return _serve(found, request)

    @router.get("/licenses.txt")
    async def licences(request: Request) -> Response:
        if build is None:
            return _missing_page(dist)
        if build.licences is None:
            message = "this build has no licence notice"
            return error_response(404, "not_found", message, headers=SECURITY_HEADERS)
        return _serve(build.licences, request)

    app.include_router(router)
