"""The web console's end-to-end site: a real ``ongrid api`` and worker behind a cuttable proxy,
and headless Chromium (Debian's, driven by Playwright) signed in as the people of the config.

- ``chromium`` (one per test module): the browser; the tests are skipped, saying why, when no
  Chromium binary is there (``$ONGRID_CHROMIUM``, default ``/usr/bin/chromium``). Playwright's
  own browser download is never used.
- ``console``: a :class:`ConsoleSite` on top of the ``cluster`` fixture: the tokens and
  approvers of ``test_approvals_api`` (alice admin; carol, erin operators; bob viewer), disk
  personas, the fake LLM's rules for every scenario, the API and a plain ``ongrid worker`` (its
  coordinator pool included). The browser reaches the API only through a :class:`CutProxy`;
  the worker reaches the fake LLM through another, which can pace a streamed reply.
- :meth:`ConsoleSite.visit`: a new browser context per person ("two people, two browsers"),
  signed in through the sign-in form. Every request to another host is aborted and recorded,
  and Chromium's console errors and page errors are collected: the test fails at teardown if
  either happened (errors a test expects, such as a 422 it provoked, are allowed by name).
- :meth:`ConsoleSite.shoot`: a full-page PNG under ``$ONGRID_ARTIFACTS_DIR/console/`` (default
  ``<repo>/artifacts/console/``).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from harness import MODEL, Cluster, Proc, call, final, wait_for
from playwright.sync_api import (
    Browser,
    BrowserContext,
    Locator,
    Page,
    Request,
    Route,
    expect,
    sync_playwright,
)
from procs import ALL_QUEUES, api_client, free_port, ongrid, wait_consumers

REPO = Path(__file__).resolve().parents[2]
#: The built console ``ongrid api`` serves at ``/``.
CONSOLE_INDEX = REPO / "coordinator" / "web" / "dist" / "index.html"
#: Liveness deadline of one HTTP request made by a test (not a browser): only so nothing hangs.
DEADLINE = 120.0
#: How long a browser assertion or action waits (milliseconds): a bound, never a measure of
#: speed; generous for a loaded CI machine.
WAIT_MS = 60_000
expect.set_options(timeout=WAIT_MS)
TOKENS = {
    "alice": ("console-alice-admin-token-01", "admin"),
    "carol": ("console-carol-operator-token", "operator"),
    "erin": ("console-erin-operator-token-1", "operator"),
    "bob": ("console-bob-viewer-token-0001", "viewer"),
}
COORDINATOR_MARK = "You are Ongrid's coordinator"

#: A question for the coordinator, which routes it to ``fixer`` with a reason.
ROUTED = "The metrics exporter on db1 is stuck, please sort it out."
FIX_TASK = "Restart the stuck metrics exporter on db1."
ROUTE_REASON = "a stuck exporter needs a restart"
FIXED = "Restarted the exporter on db1."
#: The coordinator relays the specialist's answer whole: the tile does not show it twice.
ROUTED_ANSWER = f"fixer reports: {FIXED} The metrics exporter reports again."
WIPE = "Wipe /tmp on db1."
WIPED = "Wiped /tmp on db1."
NIGHTLY = "Nightly: restart the backup agent on db2."
NIGHTLY_DONE = "Backup agent restarted."
VIEWER_TASK = "Restart the cache on db4."
#: A question whose answer the fake LLM holds back until the test releases it (``LONG_HOLD``):
#: the spawn stays running, for the cancel test.
LONG_WATCH = "Watch the replication lag on db7 until it settles."
LONG_HOLD = "db7-watch"
#: The question the persona made in the console answers.
OPS_QUESTION = "Which runbook covers a full /var on db5?"
OPS_ANSWER = "Runbook RB-17 covers a full /var: rotate the logs, then clear the core dumps."
#: The first question of the SSE-cut test's session: once it is answered, the page follows the
#: session live, so the worker streams the next answer (it streams only to a live follower).
WARM_UP = "Is db6 up again?"
WARM_UP_ANSWER = "db6 is up again."
#: The follow-up whose answer streams slowly: about forty words, one paced chunk each.
STREAMED = "Tell me the story of the db6 outage."
STREAMED_ANSWER = (
    "At ten past two the primary on db6 stopped accepting writes because its volume filled "
    "with write-ahead logs that a stalled replica never confirmed. The on-call engineer "
    "promoted the standby, rebuilt the replica from a fresh base backup, and writes resumed "
    "eleven minutes later without any lost transactions."
)

#: A question whose answer is Markdown, with what a model must never get to run or load.
MARKDOWN = "Summarise the db8 incident as a report."
MARKDOWN_ANSWER = (
    "## db8 incident\n\n"
    "- **cause**: `/var` full\n"
    "- fix: rotate logs\n\n"
    "| host | use |\n|---|---|\n| db8 | 100% |\n\n"
    "```\ndf -h /var\n```\n\n"
    "See [the runbook](https://runbooks.example/rb-17).\n\n"
    '<script>window.__pwned = true</script><b onclick="window.__pwned = true">raw</b>\n\n'
    "![tracker](https://tracker.example/pixel.png)"
)

PERSONAS: dict[str, dict[str, Any]] = {
    "fixer": {
        "description": "Restarts stuck services once a person approves.",
        "tools": ["restart_thing"],
        "permission_mode": "mutating-with-confirm",
    },
    "wiper": {
        "description": "Wipes scratch space; two people must agree.",
        "tools": ["wipe_thing"],
        "permission_mode": "dual-sign-required",
    },
    "nightly": {
        "description": "Runs the nightly maintenance in the background.",
        "tools": ["restart_thing"],
        "permission_mode": "mutating-with-confirm",
        "background": True,
    },
    "probe": {"description": "Answers questions about hosts."},
    "diskonly": {"description": "A persona that lives only in a file on disk."},
}


def _rules() -> list[dict[str, Any]]:
    """The fake LLM's answers for every scenario; the coordinator's first (first match wins)."""
    dispatch = {"agent": "fixer", "prompt": FIX_TASK, "reason": ROUTE_REASON}
    return [
        call("spawn_agent", dispatch, where="system", match=COORDINATOR_MARK, turn=0),
        final(ROUTED_ANSWER, where="system", match=COORDINATOR_MARK, turn=1),
        call("restart_thing", {"thing": "exporter"}, match=FIX_TASK, turn=0),
        final(FIXED, match=FIX_TASK, turn=1),
        call("wipe_thing", {"thing": "/tmp"}, match=WIPE, turn=0),
        final(WIPED, match=WIPE, turn=1),
        call("restart_thing", {"thing": "backup-agent"}, match=NIGHTLY, turn=0),
        final(NIGHTLY_DONE, match=NIGHTLY, turn=1),
        call("restart_thing", {"thing": "cache"}, match=VIEWER_TASK, turn=0),
        final("Restarted the cache.", match=VIEWER_TASK, turn=1),
        final(OPS_ANSWER, match=OPS_QUESTION),
        final(MARKDOWN_ANSWER, match=MARKDOWN),
        final("The lag on db7 settled.", match=LONG_WATCH, hold=LONG_HOLD),
        final(STREAMED_ANSWER, match=STREAMED),  # before the warm-up: a follow-up may quote it
        final(WARM_UP_ANSWER, match=WARM_UP),
    ]


# -- the proxy ---------------------------------------------------------------------------------

_REQUEST_LINE = re.compile(
    rb"(?:^|\r\n)(GET|POST|PUT|PATCH|DELETE|HEAD|OPTIONS) (\S+) HTTP/1\.[01]\r\n"
)


@dataclass
class _Link:
    """One accepted connection: the client's socket and ours to the target."""

    number: int
    client: socket.socket
    upstream: socket.socket
    ended: int = 0  # directions that have stopped (2: close both sockets)

    def sockets(self) -> tuple[socket.socket, socket.socket]:
        return self.client, self.upstream


class CutProxy:
    """A TCP forwarder on a free port of 127.0.0.1 in front of ``target_port``.

    :meth:`cut` closes every live connection both ways, as a dropped network would; the
    clients see their streams end mid-response. It counts the connections it accepted and
    records the HTTP request lines each carried, so a test can tell how often a client
    (re)connected to a path. ``pace``, when set, holds each Server-Sent Event of a response
    back that many seconds: a streamed model reply then arrives word by word.
    """

    def __init__(self, target_port: int, *, pace: float = 0.0) -> None:
        self.target_port = target_port
        self.pace = pace
        self.accepted = 0
        self.requests: list[tuple[int, str, str]] = []  # (connection number, method, path)
        self._lock = threading.Lock()
        self._links: dict[int, _Link] = {}
        self._closed = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)  # so that close() is noticed without a wake-up trick
        self.port: int = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, name="cut-proxy", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def connections_to(self, path_pattern: str) -> int:
        """How many connections carried a request whose path matches ``path_pattern``."""
        pattern = re.compile(path_pattern)
        with self._lock:
            return len({n for n, _method, path in self.requests if pattern.search(path)})

    def cut(self) -> int:
        """Close every live connection, both ways; returns how many there were."""
        with self._lock:
            links = list(self._links.values())
        for link in links:
            for sock in link.sockets():
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        return len(links)

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=10)
        self._listener.close()
        self.cut()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _address = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=10)
            except OSError:
                client.close()  # the target is down: the client sees a refused request
                continue
            upstream.settimeout(None)
            with self._lock:
                self.accepted += 1
                link = _Link(self.accepted, client, upstream)
                self._links[link.number] = link
            for source, sink, outbound in ((client, upstream, True), (upstream, client, False)):
                threading.Thread(
                    target=self._pump, args=(link, source, sink, outbound), daemon=True
                ).start()

    def _pump(
        self, link: _Link, source: socket.socket, sink: socket.socket, outbound: bool
    ) -> None:
        try:
            while data := source.recv(65536):
                if outbound:
                    self._record(link.number, data)
                    sink.sendall(data)
                else:
                    self._send_paced(sink, data)
            sink.shutdown(socket.SHUT_WR)  # pass the half-close on
        except OSError:
            pass  # cut, or the other side went away: the link ends
        self._end(link)

    def _send_paced(self, sink: socket.socket, data: bytes) -> None:
        if not self.pace:
            sink.sendall(data)
            return
        # Split after each event's blank line: a byte stream may be cut anywhere.
        for piece in re.split(rb"(?<=\n\n)", data):
            if piece:
                sink.sendall(piece)
                time.sleep(self.pace)

    def _record(self, number: int, data: bytes) -> None:
        found = [(number, m[1].decode(), m[2].decode()) for m in _REQUEST_LINE.finditer(data)]
        if found:
            with self._lock:
                self.requests.extend(found)

    def _end(self, link: _Link) -> None:
        with self._lock:
            link.ended += 1
            if link.ended < 2:
                return
            self._links.pop(link.number, None)
        for sock in link.sockets():
            sock.close()


# -- the site ----------------------------------------------------------------------------------


@dataclass
class Visitor:
    """One person's browser: a context of their own (its cookies and storage), one page."""

    user: str
    context: BrowserContext
    page: Page


@dataclass
class ConsoleSite:
    """The API, a worker and the fake LLM of one test, and the people's browsers."""

    cluster: Cluster
    env: dict[str, str]
    browser: Browser
    proxy: CutProxy  # the browsers' only way to the API
    llm: CutProxy  # the worker's way to the fake LLM
    api_port: int
    artifacts: Path
    visitors: list[Visitor] = field(default_factory=list)
    clients: dict[str, httpx.Client] = field(default_factory=dict)
    #: Requests a page made to any host but the proxy's (aborted): "METHOD url (user)".
    foreign: list[str] = field(default_factory=list)
    #: Console errors and uncaught page errors: "user: kind: text".
    errors: list[str] = field(default_factory=list)
    allowed: list[re.Pattern[str]] = field(default_factory=list)

    # -- people --------------------------------------------------------------------------------

    def visit(self, user: str, path: str = "/chat") -> Page:
        """A new browser context for ``user`` at ``path``, signed in through the form."""
        page = self.open(user, path)
        sign_in(page, user)
        return page

    def open(self, user: str, path: str) -> Page:
        """A new browser context (``user`` names it in the evidence) at ``path``, the proxy's
        origin its only host, its console watched."""
        context = self.browser.new_context(
            base_url=self.proxy.url, viewport={"width": 1280, "height": 900}
        )
        context.set_default_timeout(WAIT_MS)
        origin = self.proxy.url + "/"
        context.route(lambda url: not url.startswith(origin), self._refuse_foreign(user))
        page = context.new_page()
        page.on("console", lambda message: self._console(user, message.type, message.text))
        page.on("pageerror", lambda error: self._console(user, "pageerror", str(error)))
        self.visitors.append(Visitor(user, context, page))
        page.goto(path)
        return page

    def api(self, user: str) -> httpx.Client:
        """An HTTP client of ``user`` straight to the API (not through the proxy)."""
        if user not in self.clients:
            token, _role = TOKENS[user]
            self.clients[user] = httpx.Client(
                base_url=f"http://127.0.0.1:{self.api_port}",
                headers={"Authorization": f"Bearer {token}"},
                timeout=DEADLINE,
            )
        return self.clients[user]

    def allow_console_error(self, pattern: str) -> None:
        """Console errors matching ``pattern`` are expected in this test (say why at the call)."""
        self.allowed.append(re.compile(pattern))

    def _refuse_foreign(self, user: str) -> Callable[[Route, Request], None]:
        def refuse(route: Route, request: Request) -> None:
            self.foreign.append(f"{request.method} {request.url} ({user})")
            route.abort()

        return refuse

    def _console(self, user: str, kind: str, text: str) -> None:
        if kind in ("error", "pageerror"):
            self.errors.append(f"{user}: {kind}: {text}")

    # -- spawns --------------------------------------------------------------------------------

    def park(self, user: str, agent: str, prompt: str) -> str:
        """``user``'s chat turn with ``agent`` (over HTTP, not the browser), until its call
        waits for people; the spawn's id."""
        body = {"prompt": prompt, "agent": agent}
        with self.api(user).stream("POST", "/api/v1/chat", json=body) as chat:
            assert chat.status_code == 200, chat.read()
            spawn_id = chat.headers["x-spawn-id"]
        wait_for(lambda: self.status(spawn_id) == "waiting", DEADLINE, f"{spawn_id} to wait")
        return spawn_id

    def status(self, spawn_id: str) -> str:
        return str(self.api("alice").get(f"/api/v1/spawns/{spawn_id}").json()["status"])

    # -- evidence ------------------------------------------------------------------------------

    def shoot(self, page: Page, name: str) -> Path:
        """A full-page screenshot ``<artifacts>/console/<name>.png``, of a view whose every
        control has an accessible name (checked first: each main view is shot)."""
        unnamed = unnamed_controls(page)
        assert not unnamed, f"controls without an accessible name on {name}: {unnamed}"
        path = self.artifacts / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    def unexpected_errors(self) -> list[str]:
        return [e for e in self.errors if not any(p.search(e) for p in self.allowed)]

    def close(self, failed: bool, test_name: str) -> None:
        for visitor in self.visitors:
            if failed:
                with contextlib.suppress(Exception):  # evidence only: never mask the failure
                    self.shoot(visitor.page, f"FAILED-{test_name}-{visitor.user}")
            visitor.context.close()
        for client in self.clients.values():
            client.close()
        self.proxy.close()
        self.llm.close()
        if failed:
            print("\n===== browser console =====\n" + "\n".join(self.errors or ["(none)"]))


#: Every visible control with no accessible name: no aria-label, aria-labelledby, <label>, text
#: or title. (The accessible-name computation, reduced to what the console's markup uses.)
_UNNAMED = """() => {
    const named = (el) => {
        if ((el.getAttribute("aria-label") || "").trim()) return true;
        const by = el.getAttribute("aria-labelledby");
        if (by && by.split(/\\s+/).some((id) => document.getElementById(id)?.textContent.trim()))
            return true;
        if (el.labels && [...el.labels].some((l) => l.textContent.trim())) return true;
        if ((el.getAttribute("title") || "").trim()) return true;
        return el.tagName !== "INPUT" && el.tagName !== "SELECT" && el.tagName !== "TEXTAREA"
            && el.textContent.trim() !== "";
    };
    const controls = document.querySelectorAll(
        "button, a[href], input, select, textarea, summary, [role=button], [tabindex]"
    );
    return [...controls]
        .filter((el) => el.offsetParent !== null || el.getClientRects().length > 0)
        .filter((el) => !named(el))
        .map((el) => el.outerHTML.slice(0, 120));
}"""


def unnamed_controls(page: Page) -> list[str]:
    """The visible controls of ``page`` without an accessible name (outer HTML, shortened)."""
    return list(page.evaluate(_UNNAMED))


def sign_in(page: Page, user: str) -> None:
    """Sign in through the console's form; wait until the header names the person."""
    token, role = TOKENS[user]
    page.get_by_label("Access token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    signed_in = page.get_by_label("Signed in as")
    expect(signed_in, f"{user} to be signed in").to_have_text(f"{user} · {role}")


def artifacts_dir() -> Path:
    root = os.environ.get("ONGRID_ARTIFACTS_DIR") or str(REPO / "artifacts")
    path = Path(root) / "console"
    path.mkdir(parents=True, exist_ok=True)
    return path


# -- the page, as the contract names its parts -------------------------------------------------


def tile(scope: Page | Locator, persona: str) -> Locator:
    return scope.locator(f'[data-testid="agent-tile"][aria-label="Agent {persona}"]')


def approval(scope: Page | Locator, tool: str) -> Locator:
    return scope.locator(f'[data-testid="approval"][aria-label="Approval for {tool}"]')


def button(scope: Page | Locator, name: str) -> Locator:
    return scope.get_by_role("button", name=name, exact=True)


def conversation(page: Page) -> Locator:
    return page.locator('section[aria-label="Conversation"]')


def background_runs(page: Page) -> Locator:
    return page.locator('aside[aria-label="Background runs"]')


def last_prose(page: Page) -> Locator:
    """The answer prose of the conversation's latest turn."""
    return conversation(page).get_by_test_id("turn").last.get_by_test_id("prose")


def ask(page: Page, question: str, agent: str = "") -> None:
    """Send ``question`` from the composer; ``agent`` picked, or the coordinator's choice."""
    composer = page.locator('form[aria-label="Composer"]')
    composer.get_by_label("Message", exact=True).fill(question)
    composer.get_by_label("Agent", exact=True).select_option(agent)
    button(composer, "Send").click()


def heading_above(item: Locator) -> str:
    """The text of the last heading of its panel before ``item`` in document order: the group
    it is shown under, whether the groups nest their items or only precede them."""
    return str(
        item.evaluate(
            """(el) => {
                const panel = el.closest("aside") ?? document.body;
                let found = "";
                for (const h of panel.querySelectorAll("h1,h2,h3,h4,h5,h6,[role=heading]")) {
                    if (h.compareDocumentPosition(el) & Node.DOCUMENT_POSITION_FOLLOWING) {
                        found = h.textContent.trim();
                    }
                }
                return found;
            }"""
        )
    )


def wait_under(item: Locator, heading: str, what: str) -> None:
    """Wait until ``item`` shows under the group headed ``heading`` (a count may follow it)."""
    wait_for(
        lambda: item.count() == 1 and heading_above(item).startswith(heading),
        WAIT_MS / 1000,
        f"{what} under {heading!r}",
        every=0.25,
    )


# -- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chromium() -> Iterator[Browser]:
    """Debian's Chromium, headless, driven by Playwright (no browser of Playwright's own)."""
    executable = os.environ.get("ONGRID_CHROMIUM") or "/usr/bin/chromium"
    if not os.access(executable, os.X_OK):
        pytest.skip(
            f"no Chromium at {executable}: `./dev test` installs Debian's chromium "
            "(or set ONGRID_CHROMIUM to a Chromium binary)"
        )
    # Chromium's sandbox refuses to start as root; the tests run as root in CI.
    args = ["--no-sandbox"] if os.geteuid() == 0 else []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, headless=True, args=args)
        yield browser
        browser.close()


def _failed(request: pytest.FixtureRequest) -> bool:
    reports = (getattr(request.node, f"rep_{when}", None) for when in ("setup", "call"))
    return any(r is not None and r.failed for r in reports)


@pytest.fixture
def console(
    cluster: Cluster, chromium: Browser, request: pytest.FixtureRequest
) -> Iterator[ConsoleSite]:
    if not CONSOLE_INDEX.is_file():
        pytest.fail(f"the console's built assets are missing ({CONSOLE_INDEX}): build them first")
    config = cluster.root / "ongrid.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "auth": {"tokens": {t: {"user": u, "role": r} for u, (t, r) in TOKENS.items()}},
                "approvers": {"alice": ["carol", "erin", "bob"]},
            }
        )
    )
    for name, fields in PERSONAS.items():
        cluster.persona(
            name, body=f"# {name.capitalize()}\n\nYou are the {name} test persona.", **fields
        )
    cluster.fake.script(_rules())
    fake_port = int(cluster.fake.base_url.removesuffix("/v1").rsplit(":", 1)[1])
    llm = CutProxy(fake_port)
    env = {
        **cluster.env,
        "ONGRID_CONFIG": str(config),
        "ONGRID_DATABASE_URL": f"sqlite:///{cluster.root / 'ongrid.db'}",
        "ONGRID_DEFAULT_MODEL": MODEL,
        "OPENAI_API_BASE": f"{llm.url}/v1",
    }
    api_port = free_port()
    api = Proc("api", ongrid("api", f"--port={api_port}"), cluster.root, env, forked=True)
    cluster.workers.append(api)  # type: ignore[arg-type]  # killed and logged on close
    # The specialists' queues, and the coordinator's in a process of its own, as a plain worker
    # runs them (both forked: a plain worker would exec its coordinator pool, a whole import of
    # litellm per test; the pool itself is tested in test_worker_entry.py).
    coordinator = ("ongrid.coordinator",)
    specialists = tuple(q for q in ALL_QUEUES if q not in coordinator)
    workers = {}
    for name, queues in (("w1", specialists), ("w1-coordinator", coordinator)):
        argv = ongrid("worker", "-c", "4", f"--queues={','.join(queues)}", f"--name={name}")
        workers[queues] = Proc(name, argv, cluster.root, env, forked=True)
        cluster.workers.append(workers[queues])  # type: ignore[arg-type]  # killed, logged
    token, _role = TOKENS["alice"]
    api_client(api, api_port, token, DEADLINE).close()
    for queues, worker in workers.items():
        wait_consumers(cluster.redis, queues, worker)
    site = ConsoleSite(
        cluster=cluster,
        env=env,
        browser=chromium,
        proxy=CutProxy(api_port),
        llm=llm,
        api_port=api_port,
        artifacts=artifacts_dir(),
    )
    for stale in site.artifacts.glob(f"FAILED-{request.node.name}-*.png"):
        stale.unlink()  # evidence of an earlier run's failure, not of this one
    yield site
    failed = _failed(request)
    site.close(failed, request.node.name)
    assert site.foreign == [], f"the console reached other hosts: {site.foreign}"
    assert site.unexpected_errors() == [], "Chromium's console had errors:\n" + "\n".join(
        site.unexpected_errors()
    )
