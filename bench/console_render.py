"""What the web console costs over reading the same event stream raw, in the same browser.

A real ``ongrid api`` (SQLite in a temporary directory, the Redis database given) holds a finished
session of ``N`` events: one spawn's tile, ``N/2`` tool calls with their results, its answer and
notification, published on the real event bus. In headless Chromium (Debian's, never a
downloaded one), for each size:

- **raw**: ``fetch`` of the session's SSE stream from a page of the console's origin, reading
  until the ``N``-th ``id:`` line: the transfer and the browser's text decoding, nothing else;
- **console**: opening ``/chat/<id>`` until the view says it applied all ``N`` events and the next
  frame painted (sign-in, history, the stream, the state per spawn, the render);
- **tool cards**: opening the tile's tool-call list (``N/2`` cards) until they are in the page;
- **longest frame**: the longest animation frame the browser reported (PerformanceObserver
  ``long-animation-frame``: frames of 50 ms and more, script, style, layout and paint together)
  while the console loaded and rendered the cards: how long the page could not answer a key or a
  click; 0 when no frame took 50 ms.

Each is the median of ``--runs``, after one run that is not counted (the browser's caches).
Prints one table; the ratio console / raw is the figure.

    python -m bench.console_render [--sizes 1000,5000] [--runs 3] [--redis redis://127.0.0.1:6379/3]

The Redis database given is flushed before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import redis
import yaml

from coordinator.storage.chats import ChatStore
from coordinator.storage.engine import make_engine, upgrade
from workers.events import EventBus
from workers.messages import EVENT_ADAPTER
from workers.testing.backends import free_port

TOKEN = "bench-console-token-0123456789"
START_TIMEOUT = 60.0
WAIT_MS = 120_000


@contextmanager
def _api(root: Path, redis_url: str) -> Iterator[tuple[str, str]]:
    """A running ``ongrid api``: its base URL and database URL."""
    config = root / "ongrid.yaml"
    config.write_text(
        yaml.safe_dump({"auth": {"tokens": {TOKEN: {"user": "bench", "role": "admin"}}}})
    )
    database = f"sqlite:///{root / 'ongrid.db'}"
    port = free_port()
    env = {
        **os.environ,
        "ONGRID_CONFIG": str(config),
        "ONGRID_DATABASE_URL": database,
        "REDIS_URL": redis_url,
    }
    log = (root / "api.log").open("wb")
    argv = [sys.executable, "-m", "coordinator", "api", f"--port={port}"]
    proc = subprocess.Popen(argv, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(
                    f"ongrid api did not start; its log:\n{(root / 'api.log').read_text()}"
                )
            time.sleep(0.1)
        yield base, database
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def _seed(database: str, bus: EventBus, events: int) -> tuple[str, int]:
    """A finished session of about ``events`` events: its id and how many it holds."""
    engine = make_engine(database)
    try:
        upgrade(engine)
        chats = ChatStore(engine)
        session_id = chats.create_session("bench", f"{events} events")
        spawn_id = f"bench{events:08d}"
        chats.add_message(session_id, "user", "Probe the fleet.", agent="probe", spawn_id=spawn_id)
    finally:
        engine.dispose()
    ids = {"session_id": session_id, "spawn_id": spawn_id}
    tools = [{"name": "count_probe", "class": "read", "confirmation": "none"}]
    out: list[dict[str, Any]] = [
        {"type": "agent_tile", "persona": "probe", "description": "Probe.", "tools": tools}
    ]
    calls = (events - 3) // 2
    for n in range(calls):
        call = {"call_id": f"call_{n}", "name": "count_probe"}
        out.append({"type": "tool_call", **call, "arguments": json.dumps({"target": f"h{n}"})})
        out.append({"type": "tool_result", **call, "content": f"probed h{n}: healthy\nload 0.1"})
    out.append({"type": "text", "text": "All hosts answered."})
    out.append({"type": "task_notification", "status": "ok", "persona": "probe", "message": "ok"})
    for event in out:
        bus.publish(EVENT_ADAPTER.validate_python({**event, **ids}))
    return session_id, len(out)


_RAW = """async ([url, token, count, limit]) => {
  const started = performance.now();
  const bounded = new AbortController();
  setTimeout(() => bounded.abort(), limit);
  const response = await fetch(url, {
    headers: {Authorization: `Bearer ${token}`}, signal: bounded.signal,
  });
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let seen = 0, tail = "";
  while (seen < count) {
    const {value, done} = await reader.read();
    if (done) break;
    const text = tail + value;
    const lines = text.split("\\n");
    tail = lines.pop();
    for (const line of lines) if (line.startsWith("id:")) seen += 1;
  }
  await reader.cancel();
  if (seen < count) throw new Error(`only ${seen} of ${count} events in ${limit} ms`);
  return performance.now() - started;
}"""

_LONGEST = """() => Math.max(0, ...(window.__longtasks || []))"""
_OBSERVE = """window.__longtasks = [];
new PerformanceObserver((list) => {
  for (const entry of list.getEntries()) window.__longtasks.push(entry.duration);
}).observe({type: "long-animation-frame", buffered: true});"""


def _measure(browser: Any, base: str, session_id: str, events: int) -> dict[str, float]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.add_init_script(f"sessionStorage.setItem('ongrid.token', {json.dumps(TOKEN)});")
    context.add_init_script(_OBSERVE)
    try:
        page = context.new_page()
        page.goto(f"{base}/licenses.txt")  # same origin, no console code running
        url = f"/api/v1/chat/sessions/{session_id}/events"
        raw = page.evaluate(_RAW, [url, TOKEN, events, WAIT_MS])

        page = context.new_page()
        started = time.monotonic()
        page.goto(f"{base}/chat/{session_id}")
        page.wait_for_function(
            "(n) => document.querySelector('.chat-status .muted')?.textContent === `${n} events`",
            arg=events,
            timeout=WAIT_MS,
        )
        page.evaluate("() => new Promise((r) => requestAnimationFrame(() => r(null)))")
        console = (time.monotonic() - started) * 1000
        longest = page.evaluate(_LONGEST)

        started = time.monotonic()
        page.get_by_test_id("tile-activity").locator("summary").click()
        page.wait_for_function(
            "(n) => document.querySelectorAll('[data-testid=tool-card]').length >= n",
            arg=(events - 3) // 2,  # every call of the seeded spawn
            timeout=WAIT_MS,
        )
        cards = (time.monotonic() - started) * 1000
        page.evaluate("() => new Promise((r) => requestAnimationFrame(() => r(null)))")
        longest = max(longest, page.evaluate(_LONGEST))
        return {"raw": raw, "console": console, "cards": cards, "longest": longest}
    finally:
        context.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,5000", help="events per session, comma-separated")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/3")
    parser.add_argument(
        "--chromium", default=os.environ.get("ONGRID_CHROMIUM", "/usr/bin/chromium")
    )
    args = parser.parse_args()
    if not shutil.which(args.chromium):
        raise SystemExit(f"no Chromium at {args.chromium} (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    client = redis.Redis.from_url(args.redis)
    client.flushdb()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp, _api(Path(tmp), args.redis) as (base, db):
            bus = EventBus(client)
            sessions = {n: _seed(db, bus, n) for n in sizes}  # size -> (id, events held)
            with sync_playwright() as play:
                browser = play.chromium.launch(
                    executable_path=args.chromium, headless=True, args=["--no-sandbox"]
                )
                try:
                    for n in sizes:
                        session_id, held = sessions[n]
                        _measure(browser, base, session_id, held)  # warm-up, not counted
                        runs = [_measure(browser, base, session_id, held) for _ in range(args.runs)]
                        medians = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
                        rows.append((held, medians))
                finally:
                    browser.close()
    finally:
        client.flushdb()
    print(f"median of {args.runs} runs, headless Chromium, one machine")
    print(
        f"{'events':>7} {'raw SSE ms':>11} {'console ms':>11} {'ratio':>6} {'cards ms':>9} "
        f"{'longest frame ms':>17}"
    )
    for n, m in rows:
        ratio = m["console"] / m["raw"] if m["raw"] else float("nan")
        print(
            f"{n:>7} {m['raw']:>11.0f} {m['console']:>11.0f} {ratio:>6.1f} {m['cards']:>9.0f} "
            f"{m['longest']:>17.0f}"
        )


if __name__ == "__main__":
    main()
