"""What a plugin's tools may do, on a live worker: their class bounded by what they do and capped
by the install, never inherited by a persona that asked for none.

The reproduction of the review: a plugin installed read-only declares a ``class: read`` tool
that sends an HTTP DELETE. A generalist persona (empty ``tools``: the role's ``*``) whose model
calls it — by its catalog name or by the name its manifest gives — gets "not in your tool bag",
and the test's HTTP server never receives a DELETE. Installed again allowed to confirm writes,
the tool is a write tool: a persona that names it is stopped for a person's approval and still
nothing is sent.

Real parts: ``ongrid plugins`` subprocesses, an ``ongrid worker`` process, Redis, SQLite, an
HTTP server in this process; the model is the fake at its HTTP boundary.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from bundles import marketplace, ongrid, ongrid_json, plugin_manifest
from harness import MODEL, RELOAD_LINE, Cluster, Worker, call, final


class _Recorder(BaseHTTPRequestHandler):
    seen: list[str]

    def _answer(self) -> None:
        self.seen.append(f"{self.command} {self.path}")
        body = b"ok\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = do_DELETE = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[tuple[str, list[str]]]:
    seen: list[str] = []
    handler = type("Handler", (_Recorder,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


def _tool(name: str, method: str, url: str) -> dict[str, object]:
    return {
        "name": name,
        "description": f"{method} {url}",
        "class": "read",  # what the review's plugin declared, whatever it does
        "parameters": {"type": "object", "properties": {}},
        "http": {"method": method, "url": url},
    }


def _reloaded(cluster: Cluster, worker: Worker) -> None:
    version = int(cluster.redis.get("ongrid:registry:version"))
    worker.wait_log(f"{RELOAD_LINE} {version}", timeout=60)


def _results(cluster: Cluster, prompt: str) -> list[str]:
    last = cluster.fake.requests_for(prompt)[-1]
    return [str(m.get("content") or "") for m in last["messages"] if m["role"] == "tool"]


def test_a_read_only_plugins_delete_tool_never_runs(
    cluster: Cluster, tmp_path: Path, recorder: tuple[str, list[str]]
) -> None:
    base, seen = recorder
    source = tmp_path / "market"
    plugin = source / "plugins" / "ops"
    plugin_manifest(plugin, "ops")
    manifest = {
        "tools": [
            _tool("restart_skill", "DELETE", f"{base}/units/nginx"),
            _tool("status_skill", "GET", f"{base}/units/nginx"),
        ]
    }
    (plugin / "ongrid-tools.yaml").write_text(json.dumps(manifest))
    marketplace(source, "local", [{"name": "ops", "source": "./plugins/ops"}])
    cluster.persona("generalist", max_turns=6)  # empty tools: the role's "*"
    cluster.persona("checker", tools=["ops__status_skill"], max_turns=4)
    cluster.persona("fixer", tools=["ops__*"], permission_mode="mutating-with-confirm")
    worker = cluster.start_worker(env={"ONGRID_DEFAULT_MODEL": MODEL})
    ongrid(cluster, "plugins", "marketplace", "add", str(source))

    installed = ongrid_json(cluster, "plugins", "install", "ops@local")
    assert installed["tools"] == ["ops__status_skill"]
    said = "\n".join(installed["warnings"])
    assert "'ops__restart_skill': declared class read, runs as write: an HTTP DELETE" in said
    assert "'ops__restart_skill' not loaded: its class write is more than the install" in said
    _reloaded(cluster, worker)

    prompt = "Nginx is stuck: restart it."
    cluster.fake.script(
        [
            call("ops__restart_skill", match=prompt, turn=0),
            call("restart_skill", match=prompt, turn=1),
            call("ops__status_skill", match=prompt, turn=2),
            final("I could not.", match=prompt, turn=3),
        ]
    )
    done = cluster.client.wait(cluster.client.spawn("generalist", prompt).spawn_id, timeout=90)
    assert done.status == "ok", done.error
    results = _results(cluster, prompt)
    assert len(results) == 3 and all("is not in your tool bag" in r for r in results), results
    assert seen == []  # nothing reached the server

    ask = "How is nginx?"
    cluster.fake.script([call("ops__status_skill", match=ask, turn=0), final("Fine.", match=ask)])
    done = cluster.client.wait(cluster.client.spawn("checker", ask).spawn_id, timeout=90)
    assert done.status == "ok", done.error
    assert _results(cluster, ask)[0].startswith("HTTP 200")
    assert seen == ["GET /units/nginx"]  # named, a read tool of a plugin runs

    again = ongrid_json(
        cluster, "plugins", "install", "ops@local", "--allow-mode", "mutating-with-confirm"
    )
    assert again["tools"] == ["ops__restart_skill", "ops__status_skill"]
    _reloaded(cluster, worker)
    fix = "Restart nginx, it is stuck."
    cluster.fake.script([call("ops__restart_skill", match=fix, turn=0), final("Done.", match=fix)])
    record = cluster.client.spawn("fixer", fix)
    waiting = cluster.client.wait(record.spawn_id, timeout=90)
    assert waiting.status == "waiting", waiting.error
    bag = {t["name"]: t["confirmation"] for t in cluster.history(record.session_id)[0].tools}
    assert bag == {"ops__restart_skill": "once", "ops__status_skill": "none"}
    assert seen == ["GET /units/nginx"]  # the DELETE waits for a person
