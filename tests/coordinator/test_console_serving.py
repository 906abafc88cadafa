"""The web console as ``ongrid api`` serves it: the page on the SPA routes, the built assets by
an allow-list with ETags, the security headers, and a 503 page when there is no build.

The real app under uvicorn on a free port (so request paths reach it as a browser or an
attacker sends them: ``http.client`` for the raw ones, which httpx would normalise), on a Redis
database claimed for this run and a SQLite file. The build is a stand-in ``dist/`` made per
test, so these tests do not depend on the committed one.
"""

from __future__ import annotations

import hashlib
import http.client
import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import httpx
import pytest
from servers import AppServer

from coordinator.api import create_app
from coordinator.api.console import SECURITY_HEADERS
from registry.settings import Settings, TokenGrant, token_digest

TOKEN = "console-admin-token-000001"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
INDEX = b'<!doctype html><script type="module" src="/assets/app.js?v=1"></script>\n'
APP_JS = b"console.log('console');\n"
APP_CSS = b"body{margin:0}\n"
#: A file beside the build that no path may reach.
SECRET = b"not for the browser\n"


@pytest.fixture(scope="module")
def redis_url(claimed_redis_url: str) -> str:
    return claimed_redis_url


@pytest.fixture
def dist(tmp_path: Path) -> Path:
    """A build as ``node web/build.mjs`` lays it out, with a secret next to it."""
    folder = tmp_path / "web" / "dist"
    (folder / "assets").mkdir(parents=True)
    (folder / "index.html").write_bytes(INDEX)
    (folder / "licenses.txt").write_text("Preact: MIT\n", encoding="utf-8")
    (folder / "assets" / "app.js").write_bytes(APP_JS)
    (folder / "assets" / "app.css").write_bytes(APP_CSS)
    (tmp_path / "web" / "secret.toml").write_bytes(SECRET)
    (folder / "assets" / "nested").mkdir()  # a folder is no asset
    return folder


class Served:
    """The app under uvicorn in a thread, on a free port."""

    def __init__(self, settings: Settings, dist: Path) -> None:
        self.app = create_app(settings, console_dist=dist)
        self._http = AppServer(self.app)
        self.port = self._http.port
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=30)

    def raw(self, path: str) -> tuple[int, dict[str, str], bytes]:
        """GET ``path`` exactly as written (no normalisation of ``..`` or escapes)."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            connection.putrequest("GET", path, skip_accept_encoding=True)
            connection.endheaders()
            response = connection.getresponse()
            headers = {k.lower(): v for k, v in response.getheaders()}
            return response.status, headers, response.read()
        finally:
            connection.close()

    def close(self) -> None:
        self.http.close()
        self._http.stop()
        self.app.state.services.close()


Serve = Callable[[Path], AbstractContextManager[Served]]


@pytest.fixture
def serve(tmp_path: Path, redis_url: str) -> Serve:
    """Start the app on a given console build; it stops when the ``with`` block ends."""
    settings = Settings(
        agents_dir=tmp_path / "agents",
        marketplace_root=tmp_path / "marketplace",
        shipped_agents=False,
        redis_url=redis_url,
        database_url=f"sqlite:///{tmp_path / 'ongrid.db'}",
        data_dir=tmp_path / ".ongrid",
        token_grants={token_digest(TOKEN): TokenGrant(user="alice", role="admin")},
    )

    @contextmanager
    def make(dist: Path) -> Iterator[Served]:
        server = Served(settings, dist)
        try:
            yield server
        finally:
            server.close()

    return make


def assert_secured(headers: httpx.Headers | dict[str, str]) -> None:
    assert headers["content-security-policy"] == CSP
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["referrer-policy"] == "no-referrer"
    assert headers["x-frame-options"] == "DENY"


def etag_of(body: bytes) -> str:
    return f'"{hashlib.sha256(body).hexdigest()[:32]}"'


# -- the page ----------------------------------------------------------------------------------


def test_the_page_answers_every_spa_route_without_a_token(serve: Serve, dist: Path):
    with serve(dist) as api:
        for path in (
            "/",
            "/chat",
            "/chat/abc",
            "/approvals",
            "/spawns/0123abcd",
            "/settings",
            "/settings/agents",
            "/settings/agents/disk_doctor",
            "/settings/skills",
        ):
            page = api.http.get(path)
            assert page.status_code == 200, (path, page.text)
            assert page.headers["content-type"] == "text/html; charset=utf-8", path
            assert page.content == INDEX, path
            assert page.headers["cache-control"] == "no-cache"
            assert_secured(page.headers)
        assert SECURITY_HEADERS["Content-Security-Policy"] == CSP


def test_other_paths_keep_the_json_404(serve: Serve, dist: Path):
    with serve(dist) as api:
        for path in ("/api/v1/nope", "/nope", "/chat/abc/more", "/index.html", "/api/v1/chat/x"):
            missing = api.http.get(path, headers={"Authorization": f"Bearer {TOKEN}"})
            assert missing.status_code in (404, 405), (path, missing.text)
            assert missing.headers["content-type"] == "application/json", path
            assert missing.json()["error"]["code"] in ("not_found", "method_not_allowed"), path
        nope = api.http.get("/api/v1/nope").json()
        assert nope == {"error": {"code": "not_found", "message": "Not Found", "details": None}}


def test_the_console_routes_are_not_in_the_openapi_document(serve: Serve, dist: Path):
    with serve(dist) as api:
        paths = api.http.get("/openapi.json").json()["paths"]
        assert "/api/v1/me" in paths
        console = [p for p in paths if not p.startswith(("/api/", "/v1/", "/healthz", "/readyz"))]
        assert console == ["/metrics"], console


# -- the assets --------------------------------------------------------------------------------


def test_an_asset_has_its_type_an_etag_and_answers_304_when_unchanged(serve: Serve, dist: Path):
    with serve(dist) as api:
        script = api.http.get("/assets/app.js", params={"v": "1"})
        assert script.status_code == 200 and script.content == APP_JS
        assert script.headers["content-type"] == "text/javascript; charset=utf-8"
        assert script.headers["cache-control"] == "no-cache"
        assert script.headers["etag"] == etag_of(APP_JS)
        assert_secured(script.headers)
        style = api.http.get("/assets/app.css")
        assert style.headers["content-type"] == "text/css; charset=utf-8"
        assert style.headers["etag"] == etag_of(APP_CSS) != script.headers["etag"]

        for sent in (etag_of(APP_JS), f'"other", W/{etag_of(APP_JS)}', "*"):
            unchanged = api.http.get("/assets/app.js", headers={"If-None-Match": sent})
            assert unchanged.status_code == 304, sent
            assert unchanged.content == b"" and unchanged.headers["etag"] == etag_of(APP_JS)
            assert_secured(unchanged.headers)
        stale = api.http.get("/assets/app.js", headers={"If-None-Match": etag_of(APP_CSS)})
        assert stale.status_code == 200 and stale.content == APP_JS

        page = api.http.get("/chat")
        again = api.http.get("/chat", headers={"If-None-Match": page.headers["etag"]})
        assert again.status_code == 304
        licences = api.http.get("/licenses.txt")
        assert licences.status_code == 200 and licences.text == "Preact: MIT\n"
        assert licences.headers["content-type"] == "text/plain; charset=utf-8"


def test_only_the_files_built_at_start_are_served(serve: Serve, dist: Path):
    with serve(dist) as api:
        (dist / "assets" / "late.js").write_bytes(b"late\n")  # after the start: not listed
        for name in ("late.js", "nope.js", "nested", "app.js.map", "APP.JS"):
            missing = api.http.get(f"/assets/{name}")
            assert missing.status_code == 404, name
            assert missing.json()["error"]["code"] == "not_found"
            assert_secured(missing.headers)


def test_no_path_reaches_a_file_outside_the_assets(serve: Serve, dist: Path):
    with serve(dist) as api:
        for path in (
            "/assets/../secret.toml",
            "/assets/../../secret.toml",
            "/assets/..%2Fsecret.toml",
            "/assets/..%2F..%2Fsecret.toml",
            "/assets/%2e%2e%2f%2e%2e%2fsecret.toml",
            "/assets/..%5C..%5Csecret.toml",
            "/assets/%2Fetc%2Fpasswd",
            "/assets//etc/passwd",
            "/assets/../index.html",
            "/assets/../../pyproject.toml",
            "/assets/.",
            "/assets/..",
        ):
            status, headers, body = api.raw(path)
            assert status == 404, (path, status, body)
            assert headers["content-type"] == "application/json", path
            assert SECRET not in body and b"root:" not in body and INDEX not in body, path


# -- no build ----------------------------------------------------------------------------------


def test_without_a_build_the_console_answers_503_and_the_api_works(
    serve: Serve, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    missing = tmp_path / "never-built" / "dist"
    captured = caplog.at_level(logging.WARNING, logger="coordinator.api.console")
    with captured, serve(missing) as api:
        warned = [r for r in caplog.records if r.name == "coordinator.api.console"]
        assert len(warned) == 1 and str(missing) in warned[0].getMessage()
        for path in ("/", "/chat/abc", "/settings/agents", "/assets/app.js"):
            page = api.http.get(path)
            assert page.status_code == 503, path
            assert page.headers["content-type"] == "text/html; charset=utf-8"
            assert "built assets are missing from" in page.text and str(missing) in page.text
            assert "./dev console" in page.text
            assert_secured(page.headers)
        me = api.http.get("/api/v1/me", headers={"Authorization": f"Bearer {TOKEN}"})
        assert me.status_code == 200 and me.json()["user"] == "alice"
        assert api.http.get("/api/v1/nope").json()["error"]["code"] == "not_found"


def test_a_dist_without_its_page_is_no_build(serve: Serve, dist: Path):
    (dist / "index.html").unlink()
    with serve(dist) as api:
        assert api.http.get("/chat").status_code == 503
        assert api.http.get("/assets/app.js").status_code == 503


def test_no_page_of_the_api_may_be_framed(serve: Serve, dist: Path):
    """The interactive docs, the schema, errors and probes carry the framing headers too; the
    console keeps its own stricter policy."""
    with serve(dist) as api:
        for path, status in [
            ("/docs", 200),
            ("/redoc", 200),
            ("/docs/oauth2-redirect", 200),
            ("/openapi.json", 200),
            ("/healthz", 200),
            ("/api/v1/agents", 401),
            ("/no/such/page", 404),
        ]:
            answer = api.http.get(path)
            assert answer.status_code == status, (path, answer.text[:200])
            assert answer.headers["x-frame-options"] == "DENY", path
            assert answer.headers["content-security-policy"] == "frame-ancestors 'none'", path
            assert answer.headers["x-content-type-options"] == "nosniff", path
        assert_secured(api.http.get("/").headers)
        stream = api.http.get(
            "/api/v1/approvals/events?until_idle=0.2", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        assert stream.status_code == 200 and stream.headers["x-frame-options"] == "DENY"
