"""Running a skill manifest's tools: a script of the bundle, or one HTTP request.

:mod:`marketplace.manifest` has checked every template when the manifest was loaded; what is
left is filling the templates with the call's arguments and running within bounds. A script
gets an argv (each placeholder exactly one element, never seen by a shell), a clean
environment, its own process group, a timeout and an output cap; the group is killed however
the script ends, background jobs included. A request goes straight to the manifest's host (no
ambient proxy, no redirect followed) and its answer is read up to a cap and a deadline.
Every failure comes back as an error :class:`ToolResult` saying why.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from registry.errors import WorkerDraining
from registry.tools import ToolContext, ToolResult

__all__ = ["CLEAN_PATH", "DEFAULT_OUTPUT_BYTES", "HttpExecutor", "ScriptExecutor"]

#: The only PATH a script gets, also where its interpreter is looked up.
CLEAN_PATH = "/usr/local/bin:/usr/bin:/bin"
#: The output cap of a script's stdout and stderr, and of a response, when the manifest sets none.
DEFAULT_OUTPUT_BYTES = 64 * 1024
#: One token per match: ``{{`` or ``}}`` (an escaped brace), ``{name}``, or a stray brace.
_BRACES = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")
#: ``${VAR}`` in a header value: a skill secret (``ONGRID_SKILL_*``), read at call time.
_ENV_REFERENCE = re.compile(r"\$\{([^}]*)\}")
#: A script's background processes get this long to let go of its pipes once it is killed.
_DRAIN_SECONDS = 2.0
_POLL_SECONDS = 0.05


class _BadHeader(Exception):
    """A header that cannot be sent as this worker's environment stands; the message says why."""


@dataclass(frozen=True)
class ScriptExecutor:
    """Runs one script of the bundle with an argv template."""

    #: The script, symlinks resolved: inside the bundle, under ``scripts/``.
    script: Path
    #: The interpreter's name (``sh``); ``None``: the script is executed itself.
    interpreter: str | None
    #: The argv template after the script: ``{param}`` placeholders only.
    args: tuple[str, ...]
    #: Where the script runs: the folder holding the manifest.
    cwd: Path
    timeout_seconds: float
    #: Cap on each of stdout and stderr; a script that writes more is stopped.
    max_output_bytes: int
    #: The tool declares the network and its plugin's install granted it: the script reaches
    #: it through the worker's egress proxy only; otherwise it runs with no network at all.
    network: bool = False


@dataclass(frozen=True)
class HttpExecutor:
    """Sends one HTTP request built from a template."""

    method: str
    #: ``{param}`` placeholders in the path and query only, percent-encoded when filled.
    url: str
    #: Fixed values; ``${ONGRID_SKILL_*}`` references are read from the worker's skill secrets.
    headers: Mapping[str, str] = field(default_factory=dict)
    #: A JSON template: strings may hold placeholders; ``"{param}"`` alone keeps the JSON type.
    body: Any = None
    timeout_seconds: float = 10.0
    max_response_bytes: int = DEFAULT_OUTPUT_BYTES


# -- filling templates -------------------------------------------------------------------------


def _text_of(value: Any) -> str:
    """An argument as one piece of text: strings as they are, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _fill(
    template: str,
    values: Mapping[str, Any],
    *,
    quote: Callable[[str], str] = lambda s: s,
    escapes: bool = False,
) -> str:
    def replace(match: re.Match[str]) -> str:
        token = match.group(0)
        if escapes and token in ("{{", "}}"):
            return token[0]
        return quote(_text_of(values[match.group(1)]))

    return _BRACES.sub(replace, template)


def _fill_json(template: Any, values: Mapping[str, Any]) -> Any:
    if isinstance(template, str):
        whole = re.fullmatch(r"\{([A-Za-z_][A-Za-z0-9_]*)\}", template)
        if whole:
            return values[whole.group(1)]  # "{count}" alone keeps the argument's JSON type
        return _fill(template, values, escapes=True)
    if isinstance(template, dict):
        return {k: _fill_json(v, values) for k, v in template.items()}
    if isinstance(template, list):
        return [_fill_json(v, values) for v in template]
    return template


# -- running a script --------------------------------------------------------------------------


class _Capture(threading.Thread):
    """Drains one pipe keeping the first ``limit`` bytes; past them it sets ``overflow`` so
    the script is stopped rather than left writing into the void until its timeout."""

    def __init__(self, stream: IO[bytes], limit: int, overflow: threading.Event) -> None:
        super().__init__(daemon=True)
        self.stream, self.limit, self.overflow = stream, limit, overflow
        self.kept, self.total = bytearray(), 0

    def run(self) -> None:
        with contextlib.closing(self.stream):
            while chunk := self.stream.read1(65536):  # type: ignore[attr-defined]
                room = self.limit - len(self.kept)
                if room > 0:
                    self.kept += chunk[:room]
                self.total += len(chunk)
                if self.total > self.limit:
                    self.overflow.set()

    def text(self, what: str) -> str:
        out = self.kept.decode("utf-8", "replace")
        if self.total > self.limit:
            out += f"\n[{what} truncated at {self.limit} bytes]"
        return out


def _exited(pid: int) -> bool:
    """Whether the child exited, without reaping it: while it is a zombie its process group id
    cannot be reused, so killing the group afterwards hits only the script's own processes."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _supervise(
    proc: subprocess.Popen[bytes], ex: ScriptExecutor, context: ToolContext
) -> tuple[str, _Capture, _Capture]:
    """Wait for the script within its bounds: ``exited``, ``timeout``, ``overflow`` or
    ``stopping``; the whole process group is killed in every case (background jobs too)."""
    assert proc.stdout is not None and proc.stderr is not None
    overflow = threading.Event()
    out = _Capture(proc.stdout, ex.max_output_bytes, overflow)
    err = _Capture(proc.stderr, ex.max_output_bytes, overflow)
    out.start()
    err.start()
    deadline = time.monotonic() + ex.timeout_seconds
    status = "exited"
    while not _exited(proc.pid):
        if time.monotonic() >= deadline:
            status = "timeout"
        elif overflow.is_set():
            status = "overflow"
        elif context.stopping.is_set():
            status = "stopping"
        if status != "exited":
            break
        overflow.wait(_POLL_SECONDS)
    _kill_group(proc.pid)
    proc.wait()
    out.join(_DRAIN_SECONDS)
    err.join(_DRAIN_SECONDS)
    return status, out, err


def _run_script(
    name: str, ex: ScriptExecutor, values: Mapping[str, Any], context: ToolContext
) -> ToolResult:
    argv: list[str] = []
    if ex.interpreter is not None:
        found = shutil.which(ex.interpreter, path=CLEAN_PATH)
        if found is None:
            return ToolResult(
                f"{name}: interpreter {ex.interpreter} is not installed on this worker "
                f"(looked in {CLEAN_PATH})",
                is_error=True,
            )
        argv.append(found)
    if not ex.script.is_file():
        return ToolResult(f"{name}: script {ex.script} is gone from the bundle", is_error=True)
    sandbox = context.sandbox
    script = str(ex.script)
    if sandbox is not None:
        # The worker's sandbox (bubblewrap, as for the diagnostics): the script's folder is all
        # it sees of the bundle, read-only, and nothing of the worker's own.
        relative = os.path.relpath(os.path.realpath(ex.script), os.path.realpath(ex.cwd))
        script = f"{sandbox.bundle_dir}/{relative}"
    argv += [script, *(_fill(arg, values) for arg in ex.args)]
    note = ""
    if sandbox is not None:
        try:
            argv, note = _confined(sandbox, name, ex, argv)
        except RuntimeError as exc:
            return ToolResult(f"{name}: not run: {exc}", is_error=True)
    with tempfile.TemporaryDirectory(prefix="ongrid-skill-", ignore_cleanup_errors=True) as home:
        try:
            proc = subprocess.Popen(
                argv,
                cwd=ex.cwd,
                env={"PATH": CLEAN_PATH, "LANG": "C.UTF-8", "HOME": home},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # its own process group: a kill reaches its children
            )
        except OSError as exc:
            return ToolResult(f"{name}: cannot start {ex.script}: {exc.strerror}", is_error=True)
        status, out, err = _supervise(proc, ex, context)
    if status == "stopping":
        raise WorkerDraining(f"the worker is shutting down: {name} was stopped")
    result = _script_result(status, proc.returncode, ex, out, err)
    if note:
        result = ToolResult(f"{note}\n{result.content}", result.is_error, result.data)
    return result


def _confined(
    sandbox: Any, name: str, ex: ScriptExecutor, argv: list[str]
) -> tuple[list[str], str]:
    """The sandbox's command line for the script, and a note when the network it was granted
    cannot be given here: it then runs with none (never with the host's)."""
    if ex.network:
        try:
            return sandbox.confine(argv, workdir=str(ex.cwd), network=name), ""
        except RuntimeError as exc:
            if "no sandbox" in str(exc):
                raise
            note = f"[{name} ran with no network: {exc}]"
            return sandbox.confine(argv, workdir=str(ex.cwd)), note
    return sandbox.confine(argv, workdir=str(ex.cwd)), ""


def _script_result(
    status: str, code: int, ex: ScriptExecutor, out: _Capture, err: _Capture
) -> ToolResult:
    if status == "timeout":
        head = f"timed out after {ex.timeout_seconds:g} s: the script was killed"
    elif status == "overflow":
        head = f"stopped: the script wrote more than {ex.max_output_bytes} bytes of output"
    elif code < 0:
        head = f"killed by signal {-code}"
    else:
        head = f"exit code: {code}"
    stdout, stderr = out.text("stdout"), err.text("stderr")
    parts = [head, "--- stdout ---", stdout or "(empty)"]
    if stderr:
        parts += ["--- stderr ---", stderr]
    data = {"exit_code": code, "status": status, "stdout": stdout, "stderr": stderr}
    return ToolResult("\n".join(parts), is_error=status != "exited" or code != 0, data=data)


# -- sending a request -------------------------------------------------------------------------


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # The manifest names the endpoint; a redirect could lead anywhere.
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]
        return None


# No ProxyHandler defaults: requests go straight to the manifest's host, never an ambient proxy.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())


def _headers(name: str, ex: HttpExecutor, secrets: Mapping[str, str]) -> dict[str, str]:
    """The headers with ``${ONGRID_SKILL_*}`` read from ``secrets``, the skill secrets the worker
    took out of its environment when it hardened (at call time: nothing is read at import),
    :class:`_BadHeader` naming a variable that is not set."""
    out = {}
    for key, value in ex.headers.items():
        missing = [m for m in _ENV_REFERENCE.findall(value) if not secrets.get(m)]
        if missing:
            raise _BadHeader(
                f"{name}: header {key} needs {missing[0]}, unset on this worker (set it in the "
                "worker's environment: the worker keeps it for skill manifests only)"
            )
        filled = _ENV_REFERENCE.sub(lambda m: secrets[m.group(1)], value)
        if any(c in filled for c in "\r\n\0"):  # a value must not smuggle in another header
            raise _BadHeader(f"{name}: header {key} would hold a line break (check its variable)")
        out[key] = filled
    return out


def _read_body(response: Any, limit: int, deadline: float) -> tuple[bytes, bool]:
    read = getattr(response, "read1", response.read)
    body = bytearray()
    while len(body) <= limit:
        if time.monotonic() > deadline:
            raise TimeoutError("the response did not arrive in time")
        chunk = read(65536)
        if not chunk:
            break
        body += chunk
    return bytes(body[:limit]), len(body) > limit


def _run_http(
    name: str, ex: HttpExecutor, values: Mapping[str, Any], secrets: Mapping[str, str]
) -> ToolResult:
    url = _fill(ex.url, values, quote=lambda s: urllib.parse.quote(s, safe=""))
    origin = "{0.scheme}://{0.netloc}".format(urllib.parse.urlsplit(url))
    try:
        headers = _headers(name, ex, secrets)
    except _BadHeader as exc:
        return ToolResult(str(exc), is_error=True)
    data = None
    if ex.body is not None:
        data = json.dumps(_fill_json(ex.body, values), ensure_ascii=False).encode()
        if not any(k.lower() == "content-type" for k in headers):
            headers["Content-Type"] = "application/json"
    request = urllib.request.Request(url, data=data, headers=headers, method=ex.method)
    deadline = time.monotonic() + ex.timeout_seconds
    try:
        response: Any = _OPENER.open(request, timeout=ex.timeout_seconds)
    except urllib.error.HTTPError as exc:
        response = exc  # an error status is an answer too: its body says why
    except (OSError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(exc, TimeoutError) or isinstance(reason, TimeoutError):
            return ToolResult(
                f"{name}: {origin} did not answer within {ex.timeout_seconds:g} s", is_error=True
            )
        return ToolResult(f"{name}: could not reach {origin}: {reason}", is_error=True)
    with contextlib.closing(response):
        status = int(getattr(response, "status", None) or getattr(response, "code", None) or 0)
        try:
            raw, truncated = _read_body(response, ex.max_response_bytes, deadline)
        except (OSError, http.client.HTTPException) as exc:
            return ToolResult(f"{name}: the answer of {origin} was cut short: {exc}", is_error=True)
        location = response.headers.get("Location", "") if 300 <= status < 400 else ""
    text = raw.decode("utf-8", "replace")
    if truncated:
        text += f"\n[response truncated at {ex.max_response_bytes} bytes]"
    head = f"HTTP {status}" + (f" (redirect to {location} not followed)" if location else "")
    data_out = {"status": status, "body": text}
    return ToolResult(f"{head}\n{text}", is_error=status >= 300, data=data_out)
