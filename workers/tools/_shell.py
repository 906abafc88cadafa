"""Commands on the host: ``bash``/``host_bash`` (read-only diagnostics, no shell),
``host_restart_service`` (write) and ``host_reboot`` (destructive, off unless allowed)."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, Annotated

from pydantic import Field

from registry.tools import ToolClass, ToolContext, ToolResult, function_tool
from workers.tools._commands import (
    DEFAULT_READ_ROOTS,
    GREP_EXCLUDES,
    CommandRefused,
    check_command,
)
from workers.tools._common import error, setting, truthy

__all__ = ["TOOLS", "run_argv"]

COMMAND_TIMEOUT = 20.0
SERVICE_TIMEOUT = 90.0  # a unit's stop + start can legitimately take a while
OUTPUT_LIMIT = 16 * 1024
_UNIT = re.compile(r"^[A-Za-z0-9@._-]+(\.service)?$")


@dataclass(frozen=True)
class Completed:
    """The outcome of one command: exit code (None on timeout) and capped output."""

    argv: tuple[str, ...]
    exit_code: int | None
    stdout: str
    stderr: str

    def render(self) -> str:
        status = "timed out" if self.exit_code is None else f"exit code: {self.exit_code}"
        parts = [f"$ {shlex.join(self.argv)}", status, "--- stdout ---", self.stdout or "(empty)"]
        if self.stderr:
            parts += ["--- stderr ---", self.stderr]
        return "\n".join(parts)


class _Capture(threading.Thread):
    """Drains one pipe, keeping the first ``limit`` bytes: a child must never block on a full pipe,
    and a huge output must not fill the worker's memory."""

    def __init__(self, stream: IO[bytes], limit: int) -> None:
        super().__init__(daemon=True)
        self.stream, self.limit = stream, limit
        self.kept, self.total = bytearray(), 0

    def run(self) -> None:
        while chunk := self.stream.read(65536):
            room = self.limit - len(self.kept)
            if room > 0:
                self.kept += chunk[:room]
            self.total += len(chunk)

    def text(self) -> str:
        out = self.kept.decode("utf-8", "replace")
        if self.total > self.limit:
            dropped = self.total - self.limit
            out += f"\n[output truncated at {self.limit // 1024} KiB: {dropped} more bytes]"
        return out


def _child_env() -> dict[str, str]:
    # A clean environment: the worker's own variables (API keys) are not the command's business.
    return {
        "PATH": os.environ.get("PATH") or os.defpath,
        "LC_ALL": "C.UTF-8",
        "SYSTEMD_PAGER": "",
        "SYSTEMD_COLORS": "0",
        "PAGER": "cat",
    }


def run_argv(argv: Sequence[str], timeout: float = COMMAND_TIMEOUT) -> Completed:
    """Run ``argv`` without a shell, stdin closed, output capped; kill it at ``timeout``."""
    # A session of its own, so a timeout kills the whole process group, grandchildren included.
    with subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_child_env(),
        cwd="/",
        start_new_session=True,
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        out, err = _Capture(proc.stdout, OUTPUT_LIMIT), _Capture(proc.stderr, OUTPUT_LIMIT // 4)
        out.start()
        err.start()
        code = _wait(proc, timeout)
        out.join()
        err.join()
    return Completed(tuple(argv), code, out.text(), err.text())


def _wait(proc: subprocess.Popen[bytes], timeout: float) -> int | None:
    """The exit code, or ``None`` after killing the process group at ``timeout``."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return None


def _read_roots(context: ToolContext) -> list[str]:
    repo_root = setting(context, "repo_root")
    return [*DEFAULT_READ_ROOTS, *([str(repo_root)] if repo_root else [])]


def _prepare(command: str, context: ToolContext) -> tuple[list[str], list[str]]:
    """Split and check the command; return it as given and as it will run."""
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise CommandRefused(f"cannot parse the command: {exc}") from None
    if argv and "/" in argv[0]:
        raise CommandRefused("give the command by name (df, not /bin/df)")
    check_command(argv, _read_roots(context))
    executable = shutil.which(argv[0], path=_child_env()["PATH"])
    if executable is None:
        raise CommandRefused(f"{argv[0]} is allowed but not installed on this host")
    if argv[0] == "grep":  # keep a recursive search away from credential files too
        return argv, [executable, *GREP_EXCLUDES, *argv[1:]]
    return argv, [executable, *argv[1:]]


def _run_diagnostic(
    command: Annotated[
        str,
        Field(
            description="One command line, e.g. 'df -h' or "
            "'journalctl -u nginx --since -1h -n 200'."
        ),
    ],
    context: ToolContext,
) -> ToolResult:
    """Run ONE read-only diagnostic command on this host and return its exit code, stdout and
    stderr. There is no shell: no pipes, redirections, `;`, `&&`, `$VAR` or backticks (the
    characters ; | & $ ` < > are refused, also inside quotes - write regexes without `$`).
    Allowed: df, du, ls, cat, head, tail, uptime, free, ps, uname, mount, findmnt, lsblk, stat, wc,
    dmesg, journalctl, systemctl (status, is-active, list-units), ss, ip (addr/route/link show),
    iostat, vmstat, lsof, hostname, id, date, grep. cat/head/tail/grep read only under /proc,
    /sys, /var/log, /etc and the repository root; credential files are refused. grep needs an
    explicit file or directory. Options that change the host (dmesg -c, journalctl --vacuum-*,
    date -s, ss -K...) and never-ending ones (tail -f, journalctl -f) are refused. Runs for at
    most 20 s; stdout is cut at 16 KiB, so ask for what you need (tail -n 200, grep -m 50).
    A non-zero exit code is reported as-is (grep exits 1 when nothing matches).
    """
    try:
        argv, runnable = _prepare(command, context)
    except CommandRefused as exc:
        return error(f"refused: {exc}")
    done = run_argv(runnable)
    shown = Completed(tuple(argv), done.exit_code, done.stdout, done.stderr)
    data = {"exit_code": done.exit_code, "stdout": done.stdout, "stderr": done.stderr}
    if done.exit_code is None:
        return ToolResult(
            content=f"{shown.render()}\n[killed after {COMMAND_TIMEOUT:.0f} s]",
            is_error=True,
            data=data,
        )
    return ToolResult(content=shown.render(), data=data)


bash = function_tool(ToolClass.READ, name="bash")(_run_diagnostic)
# The ClickHouse/ops personas know the same tool by this name.
host_bash = function_tool(ToolClass.READ, name="host_bash")(_run_diagnostic)


@function_tool(ToolClass.WRITE, name="host_restart_service")
def host_restart_service(
    unit: Annotated[
        str, Field(description="systemd unit, e.g. 'nginx' or 'clickhouse-server.service'.")
    ],
    context: ToolContext,
) -> ToolResult:
    """Restart one systemd unit on this host (`systemctl restart <unit>`) and report the exit code
    and the unit's status afterwards. This interrupts the service: use it only once the evidence
    shows a restart is the fix. The unit name may contain letters, digits and @ . _ - only."""
    if not _UNIT.match(unit) or unit.startswith("-"):
        return error(f"refused: {unit!r} is not a valid systemd unit name")
    systemctl = shutil.which("systemctl", path=_child_env()["PATH"])
    if systemctl is None:
        return error(
            "systemctl is not on PATH on this host: it does not run systemd, "
            "so host_restart_service cannot work here"
        )
    done = run_argv([systemctl, "restart", "--", unit], timeout=SERVICE_TIMEOUT)
    status = run_argv([systemctl, "status", "--no-pager", "--lines=20", "--", unit])
    text = f"{done.render()}\n\n{status.render()}"
    return ToolResult(
        content=text,
        is_error=done.exit_code != 0,
        data={"exit_code": done.exit_code, "status_exit_code": status.exit_code},
    )


@function_tool(ToolClass.DESTRUCTIVE, name="host_reboot")
def host_reboot(
    reason: Annotated[str, Field(description="Why the host must reboot; recorded in the result.")],
    context: ToolContext,
) -> ToolResult:
    """Reboot this host with `systemctl reboot`. Every service on it goes down and this worker
    with it. Disabled unless the operator set `allow_reboot` for this host (ONGRID_ALLOW_REBOOT);
    when disabled the call does nothing and says so."""
    if not truthy(setting(context, "allow_reboot", False)):
        return error(
            "host_reboot is disabled on this host: the operator has not set "
            "allow_reboot (ONGRID_ALLOW_REBOOT=true). Nothing was done."
        )
    systemctl = shutil.which("systemctl", path=_child_env()["PATH"])
    if systemctl is None:
        return error("systemctl is not on PATH on this host; cannot reboot it from here")
    done = run_argv([systemctl, "reboot"], timeout=SERVICE_TIMEOUT)
    return ToolResult(
        content=f"reboot requested (reason: {reason})\n{done.render()}",
        is_error=done.exit_code != 0,
    )


TOOLS = (bash, host_bash, host_restart_service, host_reboot)
