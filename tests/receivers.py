"""Webhook receivers for the notification tests: real HTTP servers on free 127.0.0.1 ports.

One :class:`Receiver` serves several behaviours, by path:

* ``/slack/<hook>`` answers as Slack's incoming webhooks do: ``200 ok`` to a JSON object with
  ``text`` or ``blocks``, ``400 invalid_payload`` otherwise, ``404 no_service`` for the hook
  ``gone``;
* ``/hook/<name>`` is a generic receiver: it verifies ``X-Ongrid-Signature`` with the code the
  documentation gives (``docs/operators/notifications.md``, run as written) and answers 200, or
  401 when the signature does not hold;
* ``/flaky/<n>/<name>``: ``503`` with ``Retry-After: 1`` to the first ``n`` requests carrying an
  ``Idempotency-Key``, then as ``/hook/<name>``;
* ``/silent/<name>``: reads the request and never answers (until the receiver stops);
* ``/refuse/<name>``: ``410 Gone``.

Every request is recorded (path, headers, body, the answer given) in arrival order.
"""

from __future__ import annotations

import functools
import json
import re
import threading
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

__all__ = ["Received", "Receiver", "verify_signature"]

_DOCS = Path(__file__).resolve().parent.parent / "docs" / "operators" / "notifications.md"


@functools.cache
def _documented_verifier() -> Any:
    """The receiver example of the documentation, executed as a user would paste it."""
    text = _DOCS.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    (code,) = [b for b in blocks if "def verify(" in b]
    namespace: dict[str, Any] = {}
    exec(compile(code, str(_DOCS), "exec"), namespace)  # noqa: S102 - the project's own docs
    return namespace["verify"]


def verify_signature(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """The documentation's ``verify``, called as its example does."""
    return bool(_documented_verifier()(secret, headers, body))


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    status: int

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def key(self) -> str:
        return self.headers.get("idempotency-key", "")


class Receiver:
    """The receiver (see the module docstring); ``secrets`` by name, for ``/hook/<name>``."""

    def __init__(self, secrets: dict[str, str] | None = None) -> None:
        self.secrets = dict(secrets or {})
        self.received: list[Received] = []
        self._lock = threading.Lock()
        self._tried: Counter[str] = Counter()
        self._release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib's name
                return

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length)
                headers = {k.lower(): v for k, v in self.headers.items()}
                receiver._answer(self, self.path, headers, body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._release.set()
        self.server.shutdown()
        self.server.server_close()

    def at(self, prefix: str) -> list[Received]:
        """What arrived at paths starting with ``prefix``, in order."""
        with self._lock:
            return [r for r in self.received if r.path.startswith(prefix)]

    def _record(self, path: str, headers: dict[str, str], body: bytes, status: int) -> None:
        with self._lock:
            self.received.append(Received(path, headers, body, status))

    def _answer(self, handler: Any, path: str, headers: dict[str, str], body: bytes) -> None:
        parts = path.strip("/").split("/")
        status, text, extra = 200, "ok", {}
        if parts[0] == "silent":
            self._record(path, headers, body, 0)
            self._release.wait()
            return
        if parts[0] == "slack":
            status, text = self._slack(parts[-1], body)
        elif parts[0] == "refuse":
            status, text = 410, "gone"
        elif parts[0] == "flaky":
            with self._lock:
                self._tried[path] += 1
                tried = self._tried[path]
            if tried <= int(parts[1]):
                status, text, extra = 503, "busy", {"Retry-After": "1"}
            else:
                status, text = self._hook(parts[-1], headers, body)
        else:
            status, text = self._hook(parts[-1], headers, body)
        self._record(path, headers, body, status)
        data = text.encode()
        handler.send_response(status)
        for name, value in extra.items():
            handler.send_header(name, value)
        handler.send_header("Content-Type", "text/plain")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    @staticmethod
    def _slack(hook: str, body: bytes) -> tuple[int, str]:
        if hook == "gone":
            return 404, "no_service"
        try:
            message = json.loads(body)
        except ValueError:
            return 400, "invalid_payload"
        if not isinstance(message, dict) or not (message.get("text") or message.get("blocks")):
            return 400, "invalid_payload"
        return 200, "ok"

    def _hook(self, name: str, headers: dict[str, str], body: bytes) -> tuple[int, str]:
        secret = self.secrets.get(name)
        if secret is None or not verify_signature(secret, headers, body):
            return 401, "bad signature"
        return 200, "ok"
