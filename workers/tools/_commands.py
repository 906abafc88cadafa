"""Which diagnostic commands ``bash`` may run, and with which arguments.

The command never reaches a shell: it is split with :func:`shlex.split` and executed as an argv.
Each allowed executable has a :class:`Rule` naming the options that take a value (so a value is
not mistaken for a file), the options that would change the host (refused), and whether its
operands are files that must lie under the readable roots. A few commands need a custom check.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["CommandRefused", "Parsed", "check_command", "parse_options"]

#: Characters that mean something only to a shell; refused so nobody believes they work.
SHELL_METACHARACTERS = set(";|&$`<>")
#: Where cat/head/tail/grep may read, besides the repository root setting.
DEFAULT_READ_ROOTS = ("/proc", "/sys", "/var/log", "/etc")
#: Inside the roots, files that hold credentials (process environments carry API keys).
DENIED_PATHS = (
    "/etc/shadow*",
    "/etc/gshadow*",
    "/etc/ssl/private/*",
    "/etc/ssh/ssh_host_*key",
    "/proc/*/environ",
    "/proc/*/task/*/environ",
    "/proc/*/mem",
    "/proc/kcore",
)
#: Injected before a grep's own arguments so a recursive search skips the same files.
GREP_EXCLUDES = (
    "--exclude=environ",
    "--exclude=shadow*",
    "--exclude=gshadow*",
    "--exclude=*_key",
    "--exclude=kcore",
    "--exclude-dir=private",
)


class CommandRefused(Exception):
    """The command is not allowed; the message says why and what to do instead."""


@dataclass
class Parsed:
    """A command line split into option names, option values and operands."""

    options: list[str] = field(default_factory=list)
    values: dict[str, list[str]] = field(default_factory=dict)
    operands: list[str] = field(default_factory=list)


def _expand_long(name: str, known: frozenset[str]) -> str:
    # GNU getopt accepts unambiguous prefixes (--se for --set), so compare prefixes too.
    if name in known or len(name) <= 3:
        return name
    return next((k for k in sorted(known) if k.startswith(name)), name)


def parse_options(args: Sequence[str], value_short: str, value_long: frozenset[str]) -> Parsed:
    """Split ``args`` the way getopt does: clusters (``-rn``), attached values (``-n20``),
    ``--long=value``, ``--long value`` and ``--`` ending the options."""
    parsed, i, only_operands = Parsed(), 0, False
    while i < len(args):
        arg = args[i]
        if only_operands or arg == "-" or not arg.startswith("-"):
            parsed.operands.append(arg)
        elif arg == "--":
            only_operands = True
        elif arg.startswith("--"):
            name, eq, value = arg.partition("=")
            name = _expand_long(name, value_long)
            parsed.options.append(name)
            if name in value_long and not eq and i + 1 < len(args):
                i, value, eq = i + 1, args[i + 1], "="
            if eq:
                parsed.values.setdefault(name, []).append(value)
        else:
            i = _parse_cluster(args, i, value_short, parsed)
        i += 1
    return parsed


def _parse_cluster(args: Sequence[str], i: int, value_short: str, parsed: Parsed) -> int:
    cluster = args[i][1:]
    for j, char in enumerate(cluster):
        parsed.options.append(f"-{char}")
        if char in value_short:
            value = cluster[j + 1 :]
            if not value and i + 1 < len(args):
                i, value = i + 1, args[i + 1]
            parsed.values.setdefault(f"-{char}", []).append(value)
            break
    return i


@dataclass(frozen=True)
class Rule:
    """What one executable may be given."""

    value_short: str = ""
    value_long: frozenset[str] = frozenset()
    #: option name ("-c" or "--clear") -> why it is refused
    refused: Mapping[str, str] = field(default_factory=dict)
    reads_files: bool = False
    check: Callable[[Parsed], None] | None = None


def _longs(*names: str) -> frozenset[str]:
    return frozenset(names)


def _refuse(reason: str, *options: str) -> dict[str, str]:
    return dict.fromkeys(options, reason)


_FOLLOWS = "it never finishes; ask for a bounded amount (-n N, --since) instead"


def _check_systemctl(parsed: Parsed) -> None:
    verbs = {"status", "is-active", "list-units"}
    if not parsed.operands or parsed.operands[0] not in verbs:
        raise CommandRefused(
            f"systemctl is limited to: {', '.join(sorted(verbs))} "
            "(use host_restart_service to restart a unit)"
        )


def _check_mount(parsed: Parsed) -> None:
    if parsed.operands or set(parsed.options) - {"-l", "-t", "--types"}:
        raise CommandRefused(
            "mount may only list mounts (mount, mount -l, mount -t TYPE); use findmnt for details"
        )


def _check_hostname(parsed: Parsed) -> None:
    if parsed.operands:
        raise CommandRefused("hostname may only show the name; it cannot set it")


def _check_date(parsed: Parsed) -> None:
    # "date MMDDhhmm" sets the clock just like --set does.
    if any(re.fullmatch(r"[\d.]+", op) for op in parsed.operands):
        raise CommandRefused("date may only print the time; it cannot set the clock")


def _check_ps(parsed: Parsed) -> None:
    # BSD-style "ps e" / "ps auxe" prints every process's environment, where secrets live.
    previous = ""
    for operand in parsed.operands:
        is_value = re.fullmatch(r"[A-Za-z]*[oOpUtkq]", previous) is not None  # "ps o user"
        if not is_value and re.fullmatch(r"[A-Za-z]*e[A-Za-z]*", operand):
            raise CommandRefused("ps with the BSD 'e' flag (process environments) is not allowed")
        previous = operand


_IP_OBJECTS = {"addr", "address", "a", "route", "r", "ro", "link", "l"}
_IP_VERBS = {"show", "list", "ls", "lst", "sh", "s"}
_IP_OPTIONS = {
    "-4",
    "-6",
    "-br",
    "-brief",
    "-j",
    "-json",
    "-p",
    "-pretty",
    "-s",
    "-stats",
    "-statistics",
    "-d",
    "-details",
    "-o",
    "-oneline",
    "-h",
    "-human",
    "-c",
    "-color",
}


def check_ip(args: Sequence[str]) -> None:
    """``ip [options] addr|route|link [show ...]``; ``ip`` has its own single-dash long options."""
    rest = list(args)
    while rest and rest[0].startswith("-"):
        if rest[0] not in _IP_OPTIONS:
            raise CommandRefused(f"ip option {rest[0]} is not allowed")
        rest.pop(0)
    if (
        not rest
        or rest[0] not in _IP_OBJECTS
        or (len(rest) > 1 and rest[1] not in _IP_VERBS and not rest[1].startswith("-"))
    ):
        raise CommandRefused("ip is limited to: ip [-br|-j|-s|-4|-6] addr|route|link [show ...]")


_HEAD_TAIL_VALUES = _longs(
    "--lines", "--bytes", "--pid", "--sleep-interval", "--max-unchanged-stats"
)
_GREP_VALUES = _longs(
    "--regexp",
    "--file",
    "--max-count",
    "--after-context",
    "--before-context",
    "--context",
    "--include",
    "--exclude",
    "--exclude-dir",
    "--exclude-from",
    "--label",
    "--binary-files",
    "--devices",
    "--directories",
    "--group-separator",
)
_PS_VALUES = _longs(
    "--sort",
    "--format",
    "--pid",
    "--ppid",
    "--user",
    "--User",
    "--group",
    "--Group",
    "--tty",
    "--cols",
    "--columns",
    "--rows",
    "--width",
    "--quick-pid",
)

RULES: dict[str, Rule] = {
    "df": Rule(),
    "du": Rule(),
    "ls": Rule(),
    "uptime": Rule(),
    "free": Rule(),
    "uname": Rule(),
    "findmnt": Rule(),
    "lsblk": Rule(),
    "stat": Rule(),
    "wc": Rule(),
    "iostat": Rule(),
    "vmstat": Rule(),
    "lsof": Rule(),
    "id": Rule(),
    "ip": Rule(),  # checked by check_ip: its options are not getopt-style
    "cat": Rule(reads_files=True),
    "head": Rule(value_short="nc", value_long=_HEAD_TAIL_VALUES, reads_files=True),
    "tail": Rule(
        value_short="ncs",
        value_long=_HEAD_TAIL_VALUES,
        reads_files=True,
        refused=_refuse(_FOLLOWS, "-f", "-F", "--follow"),
    ),
    "grep": Rule(
        value_short="efmABCdD",
        value_long=_GREP_VALUES,
        reads_files=True,
        refused=_refuse(
            "it follows symlinks out of the readable roots; use -r", "-R", "--dereference-recursive"
        ),
    ),
    "ps": Rule(value_short="oOpqugUGtC", value_long=_PS_VALUES, check=_check_ps),
    "dmesg": Rule(
        value_short="lfFs",
        value_long=_longs("--level", "--facility", "--file", "--buffer-size", "--time-format"),
        refused=_refuse(
            "it clears or reconfigures the kernel log",
            "-c",
            "-C",
            "-D",
            "-E",
            "-n",
            "--clear",
            "--read-clear",
            "--console-off",
            "--console-on",
            "--console-level",
        )
        | _refuse(_FOLLOWS, "-w", "-W", "--follow", "--follow-new"),
    ),
    "journalctl": Rule(
        value_short="upnSUtoDMiI",
        value_long=_longs(
            "--unit",
            "--user-unit",
            "--priority",
            "--lines",
            "--since",
            "--until",
            "--output",
            "--identifier",
            "--directory",
            "--file",
        ),
        refused=_refuse(
            "it deletes or rewrites journal files",
            "--vacuum-size",
            "--vacuum-time",
            "--vacuum-files",
            "--rotate",
            "--flush",
            "--sync",
            "--relinquish-var",
            "--smart-relinquish-var",
            "--setup-keys",
            "--update-catalog",
        )
        | _refuse(_FOLLOWS, "-f", "--follow"),
    ),
    "systemctl": Rule(
        value_short="tpPnoHM",
        value_long=_longs(
            "--type", "--property", "--state", "--lines", "--output", "--host", "--machine"
        ),
        refused=_refuse("only this host is in scope", "-H", "-M", "--host", "--machine"),
        check=_check_systemctl,
    ),
    "ss": Rule(
        value_short="fAFD",
        refused=_refuse("it kills sockets or writes files", "-K", "--kill", "-D", "--diag"),
    ),
    "mount": Rule(value_short="t", value_long=_longs("--types"), check=_check_mount),
    "hostname": Rule(
        value_short="F",
        refused=_refuse("it sets the hostname", "-F", "--file", "-b", "--boot"),
        check=_check_hostname,
    ),
    "date": Rule(
        value_short="dfrI",
        value_long=_longs("--date", "--file", "--reference"),
        refused=_refuse("it sets the clock", "-s", "--set"),
        check=_check_date,
    ),
}


def _refusal(option: str, refused: Mapping[str, str]) -> str | None:
    if option in refused:
        return refused[option]
    # A GNU long-option prefix (--vac) is the option it abbreviates.
    if option.startswith("--") and len(option) > 3:
        return next((why for r, why in refused.items() if r.startswith(option)), None)
    return None


def _grep_paths(parsed: Parsed) -> list[str]:
    """The files grep would open: its operands minus the pattern, plus pattern/exclude files."""
    operands = list(parsed.operands)
    if not ({"-e", "--regexp", "-f", "--file"} & set(parsed.options)) and operands:
        operands.pop(0)  # the first operand is the pattern
    if not operands:
        raise CommandRefused(
            "grep needs at least one file or directory to search, "
            "e.g. grep -i error /var/log/syslog"
        )
    pattern_options = ("-f", "--file", "--exclude-from")
    return operands + [v for k in pattern_options for v in parsed.values.get(k, [])]


def check_readable(path: str, roots: Sequence[str], cwd: str = "/") -> None:
    """Refuse a path that, symlinks resolved, is outside ``roots`` or holds credentials."""
    real = os.path.realpath(os.path.join(cwd, path))
    real_roots = [os.path.realpath(r) for r in roots]
    if not any(real == r or real.startswith(r.rstrip(os.sep) + os.sep) for r in real_roots):
        raise CommandRefused(f"{path} is outside the readable roots ({', '.join(roots)})")
    if any(fnmatch.fnmatch(real, pattern) for pattern in DENIED_PATHS):
        raise CommandRefused(f"{path} holds credentials and may not be read")


def check_command(argv: Sequence[str], roots: Sequence[str]) -> None:
    """Raise :class:`CommandRefused` unless ``argv`` is an allowed read-only diagnostic."""
    if not argv:
        raise CommandRefused("empty command")
    for arg in argv:
        bad = sorted(SHELL_METACHARACTERS & set(arg))
        if bad:
            raise CommandRefused(
                f"argument {arg!r} contains shell metacharacters {' '.join(bad)}: commands run "
                "without a shell, one command per call, no pipes, redirections or substitutions"
            )
    name, args = argv[0], argv[1:]
    rule = RULES.get(name)
    if rule is None:
        raise CommandRefused(
            f"{name!r} is not an allowed command; allowed: {', '.join(sorted(RULES))}"
        )
    if name == "ip":
        check_ip(args)
        return
    parsed = parse_options(args, rule.value_short, rule.value_long)
    for option in parsed.options:
        why = _refusal(option, rule.refused)
        if why:
            raise CommandRefused(f"{name} {option} is not allowed: {why}")
    if rule.check:
        rule.check(parsed)
    if rule.reads_files:
        paths = _grep_paths(parsed) if name == "grep" else parsed.operands
        for path in paths:
            if path != "-":
                check_readable(path, roots)
