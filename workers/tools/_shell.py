"""Commands on the host: ``bash``/``host_bash`` (read-only diagnostics, confined, no shell),
``host_restart_service`` (write) and ``host_reboot`` (destructive, off unless allowed).

The diagnostics run in the worker's :class:`workers.sandbox.Sandbox`, handed in on the tool
context; without one they do not run at all. The allow-list of :mod:`workers.tools._commands` is
checked first, so a refusal comes with its reason before anything starts.
"""

from __future__ import annotations

import re
import shlex
import shutil
from typing import Annotated

from pydantic import Field

from registry.tools import ToolClass, ToolContext, ToolResult, function_tool
from workers.sandbox import HOST_MOUNTINFO, SAFE_PATH, Completed, Sandbox, run_argv
from workers.tools._commands import DEFAULT_READ_ROOTS, GREP_EXCLUDES, check_command
from workers.tools._common import error, setting, truthy
from workers.tools._getopt import CommandRefused, Parsed

__all__ = ["TOOLS"]

COMMAND_TIMEOUT = 20.0
SERVICE_TIMEOUT = 90.0  # a unit's stop + start can legitimately take a while
_UNIT = re.compile(r"^[A-Za-z0-9@._-]+(\.service)?$")


def _read_roots(context: ToolContext) -> list[str]:
    repo_root = setting(context, "repo_root")
    return [*DEFAULT_READ_ROOTS, *([str(repo_root)] if repo_root else [])]


def _prepare(command: str, context: ToolContext) -> tuple[list[str], list[str]]:
    """Split and check the command; return it as given and as it will run."""
    if "\0" in command:
        raise CommandRefused("the command contains a NUL character")
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise CommandRefused(f"cannot parse the command: {exc}") from None
    if argv and "/" in argv[0]:
        raise CommandRefused("give the command by name (df, not /bin/df)")
    parsed = check_command(argv, _read_roots(context))
    executable = shutil.which(argv[0], path=SAFE_PATH)
    if executable is None:
        raise CommandRefused(f"{argv[0]} is allowed but not installed on this host")
    return argv, [executable, *_injected(argv[0], parsed), *argv[1:]]


def _injected(name: str, parsed: Parsed) -> list[str]:
    """Arguments put before the model's own."""
    if name == "grep":  # keep a recursive search away from credential files too
        return list(GREP_EXCLUDES)
    if name == "findmnt" and not parsed.given("-s", "--fstab", "-m", "--mtab", "-F", "--tab-file"):
        # The sandbox's own mounts are all read-only binds: show the host's table instead.
        return ["--tab-file", HOST_MOUNTINFO]
    return []


def _run_diagnostic(
    command: Annotated[
        str,
        Field(
            description="One command line, e.g. 'df -h' or "
            "'journalctl -u nginx --since -1h -n 200'.",
            max_length=16384,
        ),
    ],
    context: ToolContext,
) -> ToolResult:
    """Run ONE read-only diagnostic command on this host and return its exit code, stdout and
    stderr. It runs in a sandbox as an unprivileged user that sees the host's filesystem
    read-only and none of its processes. There is no shell: no pipes, redirections, `;`, `&&`,
    `$VAR` or backticks (the characters ; | & $ ` < > are refused, also inside quotes - write
    regexes without `$`). Allowed: df, du, ls, stat, wc, cat, head, tail, grep, findmnt, lsblk,
    uptime, free, uname, vmstat, iostat, dmesg, journalctl, systemctl (status, show -p ...,
    is-active, list-units, ...), ss, ip (addr/route/link show), hostname, id, date. Each takes
    only its documented options, written in full (--human-readable, not --hum); options that
    change the host or never finish (tail -f, journalctl -f, vmstat 1 without a count) are
    refused. cat/head/tail/grep and options that read a file read only under /proc, /sys,
    /var/log, /etc and the repository root; credential files are refused. grep needs an
    explicit file or directory. For processes use host_probe (section "processes"). Runs for at
    most 20 s; stdout is cut at 16 KiB, so ask for what you need (tail -n 200, grep -m 50).
    A non-zero exit code is reported as-is (grep exits 1 when nothing matches).
    """
    try:
        argv, runnable = _prepare(command, context)
    except CommandRefused as exc:
        return error(f"refused: {exc}")
    sandbox: Sandbox | None = context.sandbox
    why = "no sandbox was given to this tool" if sandbox is None else sandbox.unavailable()
    if sandbox is None or why is not None:
        return error(f"bash is unavailable on this worker: {why}. Nothing was run.")
    done = sandbox.run(runnable, COMMAND_TIMEOUT)
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
    systemctl = shutil.which("systemctl", path=SAFE_PATH)
    if systemctl is None:
        return error(
            "systemctl is not on PATH on this host: it does not run systemd, "
            "so host_restart_service cannot work here"
        )
    done = run_argv([systemctl, "restart", "--", unit], timeout=SERVICE_TIMEOUT)
    status = run_argv(
        [systemctl, "status", "--no-pager", "--lines=20", "--", unit], timeout=COMMAND_TIMEOUT
    )
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
    systemctl = shutil.which("systemctl", path=SAFE_PATH)
    if systemctl is None:
        return error("systemctl is not on PATH on this host; cannot reboot it from here")
    done = run_argv([systemctl, "reboot"], timeout=SERVICE_TIMEOUT)
    return ToolResult(
        content=f"reboot requested (reason: {reason})\n{done.render()}",
        is_error=done.exit_code != 0,
    )


TOOLS = (bash, host_bash, host_restart_service, host_reboot)
