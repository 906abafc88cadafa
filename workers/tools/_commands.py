"""Which diagnostic commands ``bash`` may run, and with which arguments: an allow-list.

The command never reaches a shell: it is split with :func:`shlex.split` and executed as an argv,
inside the sandbox of :mod:`workers.sandbox`. This module is the second line: for each allowed
executable a :class:`~workers.tools._getopt.Command` lists every option it may take, **by its full
name**, whether the option takes a value, and what kind of value (a file to read is checked
against the readable roots). Anything not listed is refused: unknown options, GNU abbreviations
of long options (``--s`` for ``--set``), options that write or never finish. Options are parsed
the way the programs' own ``getopt_long`` parses them (see :mod:`workers.tools._getopt`), so a
value is never taken for a verb or a file, nor the other way round. ``tests/workers/
test_sandbox.py`` checks every declaration against the installed program.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Callable, Sequence

from workers.tools._getopt import Command, CommandRefused, Kind, Parsed, parse_arguments

__all__ = ["COMMANDS", "CommandRefused", "check_command", "check_readable"]

#: Characters that mean something only to a shell; refused so nobody believes they work.
SHELL_METACHARACTERS = set(";|&$`<>")
#: Where commands may read file contents, besides the repository root setting.
DEFAULT_READ_ROOTS = ("/proc", "/sys", "/var/log", "/etc", "/usr/lib/os-release")
#: Inside the roots, files that hold credentials (process environments carry API keys). The
#: sandbox already hides the worker's processes and runs as an unprivileged user; this is the
#: second line, and it gives the model a reason instead of a permission error.
DENIED_PATHS = (
    "/etc/shadow*",
    "/etc/gshadow*",
    "/etc/ssl/private/*",
    "/etc/ssh/ssh_host_*key",
    "/etc/sudoers*",
    "/etc/postgresql/*",
    "/etc/redis/*",
    "/etc/clickhouse-server/*",
    "/etc/ongrid/*",
    "/proc/*/environ",
    "/proc/*/task/*/environ",
    "/proc/*/mem",
    "/proc/*/cmdline",
    "/proc/*/task/*/cmdline",
    "/proc/kcore",
)
#: Injected before a grep's own arguments so a recursive search skips the same files.
GREP_EXCLUDES = (
    "--exclude=environ",
    "--exclude=cmdline",
    "--exclude=shadow*",
    "--exclude=gshadow*",
    "--exclude=*_key",
    "--exclude=kcore",
    "--exclude-dir=private",
)
#: Longest single argument and whole command line, in characters.
MAX_ARGUMENT = 4096
MAX_COMMAND = 16384
#: A number as the tools take it: a sign, a fraction, a unit suffix (``-20``, ``1.5``, ``10K``).
_NUMBER = re.compile(r"[+-]?\d+(\.\d+)?[A-Za-z]{0,3}")


# --- commands with rules of their own -----------------------------------------------------------

_SYSTEMCTL_VERBS = {
    "status",
    "show",
    "is-active",
    "is-enabled",
    "is-failed",
    "is-system-running",
    "list-units",
    "list-unit-files",
    "list-sockets",
    "list-timers",
    "list-dependencies",
    "list-jobs",
}
#: Properties that can carry secrets (environment, command lines, credentials).
_SECRET_PROPERTIES = re.compile(r"(?i)^(environment.*|exec.*|.*credential.*|pass.*)$")


def _check_systemctl(parsed: Parsed) -> None:
    verb = parsed.operands[0] if parsed.operands else "list-units"
    if verb not in _SYSTEMCTL_VERBS:
        allowed = ", ".join(sorted(_SYSTEMCTL_VERBS))
        raise CommandRefused(
            f"systemctl {verb!r} is not allowed; allowed verbs: {allowed} "
            "(use host_restart_service to restart a unit)"
        )
    properties = [p for v in parsed.values("-p", "--property", "-P") for p in v.split(",")]
    if verb == "show" and not properties:
        raise CommandRefused(
            "systemctl show needs -p/--property naming what to show "
            "(e.g. -p ActiveState,SubState,NRestarts): unit environments may hold secrets"
        )
    secret = [p for p in properties if _SECRET_PROPERTIES.match(p.strip())]
    if secret:
        raise CommandRefused(f"systemctl property {secret[0]} may hold secrets and is not shown")


def _check_date(parsed: Parsed) -> None:
    # "date MMDDhhmm" sets the clock just like --set does; the only operand allowed is +FORMAT.
    if len(parsed.operands) > 1 or any(not op.startswith("+") for op in parsed.operands):
        raise CommandRefused("date takes only a +FORMAT operand; it cannot set the clock")


def _check_interval(name: str, max_seconds: float = 15.0) -> Callable[[Parsed], None]:
    """``vmstat``/``iostat`` ``[interval [count]]``: without a count they never end."""

    def check(parsed: Parsed) -> None:
        numbers = [op for op in parsed.operands if re.fullmatch(r"\d+(\.\d+)?", op)]
        if not numbers:
            return
        if len(numbers) == 1 or float(numbers[0]) * int(float(numbers[1])) > max_seconds:
            raise CommandRefused(
                f"{name} with an interval needs a count, and interval x count at most "
                f"{max_seconds:.0f} s (e.g. {name} 1 5)"
            )

    return check


def _check_grep(parsed: Parsed) -> None:
    if parsed.given("--help", "--version", "-V"):
        return
    operands = list(parsed.operands)
    if not parsed.given("-e", "--regexp", "-f", "--file") and operands:
        operands.pop(0)  # the first operand is the pattern
    if not operands:
        raise CommandRefused(
            "grep needs at least one file or directory to search, "
            "e.g. grep -i error /var/log/syslog"
        )


_IP_OBJECTS = {"addr", "address", "a", "route", "r", "ro", "link", "l"}
_IP_VERBS = {"show", "list", "ls", "lst", "sh", "s"}
_IP_OPTIONS = {
    "-4", "-6", "-br", "-brief", "-j", "-json", "-p", "-pretty", "-s", "-stats", "-statistics",
    "-d", "-details", "-o", "-oneline", "-h", "-human",
}  # fmt: skip


def check_ip(args: Sequence[str]) -> None:
    """``ip [options] addr|route|link [show ...]``; ``ip`` has its own single-dash options,
    which it also accepts abbreviated: only these exact spellings pass."""
    rest = list(args)
    while rest and rest[0].startswith("-"):
        if rest[0] not in _IP_OPTIONS:
            raise CommandRefused(
                f"ip option {rest[0]} is not allowed; allowed: {', '.join(sorted(_IP_OPTIONS))}"
            )
        rest.pop(0)
    if (
        not rest
        or rest[0] not in _IP_OBJECTS
        or (len(rest) > 1 and rest[1] not in _IP_VERBS)
        or any(word.startswith("-") for word in rest[1:])
    ):
        raise CommandRefused("ip is limited to: ip [-br|-j|-s|-4|-6] addr|route|link [show ...]")


# --- the allow-list ----------------------------------------------------------------------------

_FOLLOWS = "it never finishes; ask for a bounded amount (-n N, --since) instead"
_READS_LIST = "it reads names from a file and prints them, the file's content, in its errors"

COMMANDS: dict[str, Command] = {
    "df": Command(
        "-h/--human-readable --si -k -a/--all -B/--block-size= -H -i/--inodes -l/--local "
        "--no-sync --output[=] -P/--portability --total -t/--type= -T/--print-type "
        "-x/--exclude-type= -v",
        {"it flushes every filesystem to disk first": "--sync"},
        Kind.PATH,
    ),
    "du": Command(
        "-h/--human-readable --si -k -0/--null -a/--all --apparent-size -B/--block-size= "
        "-b/--bytes -c/--total -D/--dereference-args -H -d/--max-depth=NUMBER --inodes "
        "-L/--dereference -l/--count-links -m -P/--no-dereference -S/--separate-dirs "
        "-s/--summarize -t/--threshold= --time[=] --time-style= -X/--exclude-from=FILE "
        "--exclude= -x/--one-file-system",
        {_READS_LIST: "--files0-from"},
        Kind.PATH,
    ),
    "ls": Command(
        "-a/--all -A/--almost-all --author -b/--escape --block-size= -B/--ignore-backups -c -C "
        "--color[=] -d/--directory -f -F/--classify[=] --file-type --format= --full-time -g "
        "--group-directories-first -G/--no-group -h/--human-readable --si "
        "-H/--dereference-command-line --dereference-command-line-symlink-to-dir --hide= "
        "--indicator-style= -i/--inode -I/--ignore= -k/--kibibytes -l -L/--dereference -m "
        "-n/--numeric-uid-gid -N/--literal -o -p -q/--hide-control-chars --show-control-chars "
        "-Q/--quote-name --quoting-style= -r/--reverse -R/--recursive -s/--size -S --sort= "
        "--time= --time-style= -t -T/--tabsize=NUMBER -u -U -v -w/--width=NUMBER -x -X "
        "-Z/--context --zero -1",
        operands=Kind.PATH,
    ),
    "stat": Command(
        "-L/--dereference -f/--file-system --cached= -c/--format= --printf= -t/--terse",
        operands=Kind.PATH,
    ),
    "wc": Command(
        "-c/--bytes -m/--chars -l/--lines -L/--max-line-length -w/--words",
        {_READS_LIST: "--files0-from"},
        Kind.PATH,
    ),
    "cat": Command(
        "-A/--show-all -b/--number-nonblank -e -E/--show-ends -n/--number -s/--squeeze-blank -t "
        "-T/--show-tabs -u -v/--show-nonprinting",
        operands=Kind.FILE,
    ),
    "head": Command(
        "-c/--bytes=NUMBER -n/--lines=NUMBER -q/--quiet/--silent -v/--verbose -z/--zero-terminated",
        operands=Kind.FILE,
        numeric="-n",
    ),
    "tail": Command(
        "-c/--bytes=NUMBER -n/--lines=NUMBER -q/--quiet/--silent -v/--verbose -z/--zero-terminated",
        {
            _FOLLOWS: "-f/--follow -F --retry",
            "it only matters with --follow": "--pid -s/--sleep-interval --max-unchanged-stats",
        },
        Kind.FILE,
        numeric="-n",
    ),
    "grep": Command(
        "-E/--extended-regexp -F/--fixed-strings -G/--basic-regexp -P/--perl-regexp "
        "-e/--regexp= -f/--file=FILE -i/--ignore-case --no-ignore-case -w/--word-regexp "
        "-x/--line-regexp -z/--null-data -s/--no-messages -v/--invert-match -V "
        "-m/--max-count=NUMBER -b/--byte-offset -n/--line-number --line-buffered "
        "-H/--with-filename -h/--no-filename --label= -o/--only-matching -q/--quiet/--silent "
        "--binary-files= -a/--text -I -d/--directories= -r/--recursive --include= --exclude= "
        "--exclude-from=FILE --exclude-dir= -L/--files-without-match -l/--files-with-matches "
        "-c/--count -T/--initial-tab -Z/--null -B/--before-context=NUMBER "
        "-A/--after-context=NUMBER -C/--context=NUMBER --group-separator= "
        "--no-group-separator --color[=] --colour[=] -U/--binary",
        {
            "it follows symlinks out of the readable roots; use -r": "-R/--dereference-recursive",
            "devices, FIFOs and sockets can block forever; they are skipped": "-D/--devices",
        },
        Kind.FILE,
        numeric="-C",
        check=_check_grep,
    ),
    "uptime": Command("-p/--pretty -s/--since -h -V"),
    "free": Command(
        "-b/--bytes --kilo --mega --giga --tera --peta -k/--kibi -m/--mebi -g/--gibi --tebi "
        "--pebi -h/--human --si -l/--lohi -t/--total -v/--committed -w/--wide -V",
        {"it repeats; call free again instead": "-s/--seconds -c/--count"},
    ),
    "uname": Command(
        "-a/--all -s/--kernel-name -n/--nodename -r/--kernel-release -v/--kernel-version "
        "-m/--machine -p/--processor -i/--hardware-platform -o/--operating-system"
    ),
    "findmnt": Command(
        "-s/--fstab -m/--mtab -k/--kernel -A/--all -a/--ascii -b/--bytes -C/--nocanonicalize "
        "-c/--canonicalize -D/--df -d/--direction= -e/--evaluate -F/--tab-file=FILE "
        "-f/--first-only -i/--invert -J/--json -l/--list -n/--noheadings -O/--options= "
        "-o/--output= --output-all -P/--pairs --pseudo --shadowed -R/--submounts -r/--raw "
        "--real -S/--source= -T/--target=PATH --tree -M/--mountpoint=PATH -t/--types= -U/--uniq "
        "-u/--notruncate -v/--nofsroot -y/--shell -x/--verify --verbose --vfs-all -h -V",
        {
            _FOLLOWS: "-p/--poll",
            "it only matters with --poll": "-w/--timeout",
            "other processes' mount tables are not in scope": "-N/--task",
        },
        Kind.PATH,
        max_operands=2,
    ),
    "lsblk": Command(
        "-A/--noempty -D/--discard -E/--dedup= -I/--include= -J/--json -M/--merge "
        "-O/--output-all -P/--pairs -S/--scsi -T/--tree[=] -a/--all -b/--bytes -d/--nodeps "
        "-e/--exclude= -f/--fs -i/--ascii -l/--list -m/--perms -n/--noheadings -o/--output= "
        "-p/--paths -r/--raw -s/--inverse -t/--topology -w/--width=NUMBER -x/--sort= -y/--shell "
        "-z/--zoned -h -V",
        {"it reads another root's device tree": "--sysroot"},
        Kind.PATH,
    ),
    "dmesg": Command(
        "-f/--facility= -H/--human -J/--json -k/--kernel -L/--color[=] -l/--level= -P/--nopager "
        "-p/--force-prefix -r/--raw --noescape -S/--syslog -s/--buffer-size=NUMBER "
        "-u/--userspace -x/--decode -d/--show-delta -e/--reltime -T/--ctime -t/--notime "
        "--time-format= --since= --until= -h -V",
        {
            "it reads a file instead of the kernel log": "-F/--file",
            "it clears or reconfigures the kernel log": (
                "-C/--clear -c/--read-clear -D/--console-off -E/--console-on -n/--console-level"
            ),
            _FOLLOWS: "-w/--follow -W/--follow-new",
        },
    ),
    "journalctl": Command(
        "--system --user -m/--merge -D/--directory=FILE --file=FILE -S/--since= -U/--until= "
        "-c/--cursor= --after-cursor= -b/--boot[=]+ -u/--unit= --user-unit= -t/--identifier= "
        "-p/--priority= --facility= -g/--grep= --case-sensitive[=] -k/--dmesg -o/--output= "
        "--output-fields= -n/--lines[=]+ -r/--reverse --show-cursor --utc -x/--catalog "
        "--no-hostname --no-full -l/--full -a/--all -q/--quiet --no-pager -N/--fields "
        "-F/--field= --list-boots --disk-usage --header -h",
        {
            _FOLLOWS: "-f/--follow --no-tail",
            "only this host's journal is in scope": "-M/--machine --root --image --namespace",
            "it writes the cursor file": "--cursor-file",
            "it deletes, rewrites or reconfigures journal files": (
                "--vacuum-size --vacuum-time --vacuum-files --rotate --flush --sync "
                "--relinquish-var --smart-relinquish-var --setup-keys --update-catalog --force "
                "--verify"
            ),
        },
        Kind.TEXT,
    ),
    "systemctl": Command(
        "--system -t/--type= --state= --failed -p/--property= -P= -a/--all -l/--full --reverse "
        "--with-dependencies --show-types --value -q/--quiet --legend= --no-pager "
        "-n/--lines=NUMBER -o/--output= --plain --timestamp= -h",
        {"only this host is in scope": "-H/--host -M/--machine --root --image"},
        Kind.TEXT,
        check=_check_systemctl,
    ),
    "ss": Command(
        "-h -V -n/--numeric -a/--all -l/--listening -o/--options -e/--extended -m/--memory "
        "-p/--processes -T/--threads -i/--info --tipcinfo -s/--summary --tos --cgroup -b/--bpf "
        "-Z/--context -z/--contexts -4/--ipv4 -6/--ipv6 -0/--packet -t/--tcp -M/--mptcp "
        "-S/--sctp -u/--udp -d/--dccp -w/--raw -x/--unix --tipc --vsock --xdp -f/--family= "
        "-H/--no-header -O/--oneline --inet-sockopt -A/--query/--socket=",
        {
            "it kills sockets": "-K/--kill",
            "it resolves names over the network; use -n": "-r/--resolve",
            _FOLLOWS: "-E/--events",
            "it writes a file": "-D/--diag",
            "give the filter as operands instead": "-F/--filter",
            "only this host's network namespace is in scope": "-N/--net",
        },
        Kind.TEXT,
    ),
    "ip": Command(operands=Kind.TEXT),  # checked by check_ip: its options are not getopt-style
    "iostat": Command(
        "-c -d -h -k -m -N -s -t -x -y -z -H -g= -j= -o= -p= --dec= --human --pretty --compact -V",
        operands=Kind.TEXT,
        check=_check_interval("iostat"),
    ),
    "vmstat": Command(
        "-a/--active -f/--forks -m/--slabs -n/--one-header -s/--stats -d/--disk -D/--disk-sum "
        "-p/--partition= -S/--unit= -w/--wide -t/--timestamp -y/--no-first -h -V",
        operands=Kind.NUMBER,
        max_operands=2,
        check=_check_interval("vmstat"),
    ),
    "hostname": Command(
        "-a/--alias -A/--all-fqdns -d/--domain -f/--fqdn/--long -i/--ip-address "
        "-I/--all-ip-addresses -s/--short -y/--yp/--nis -V",
        {"it sets the hostname": "-F/--file -b/--boot"},
    ),
    "id": Command(
        "-a -Z/--context -g/--group -G/--groups -n/--name -r/--real -u/--user -z/--zero",
        operands=Kind.TEXT,
        max_operands=1,
    ),
    "date": Command(
        "-d/--date= --debug -I/--iso-8601[=] --resolution -R/--rfc-email --rfc-3339= "
        "-r/--reference=PATH -u/--utc/--universal",
        {
            "it sets the clock": "-s/--set",
            "it reads a file and prints its lines in errors": "-f/--file",
        },
        Kind.TEXT,
        check=_check_date,
    ),
}


def check_readable(path: str, roots: Sequence[str], cwd: str = "/") -> None:
    """Refuse a path that, symlinks resolved, is outside ``roots`` or holds credentials."""
    real = os.path.realpath(os.path.join(cwd, path))
    real_roots = [os.path.realpath(r) for r in roots]
    if not any(real == r or real.startswith(r.rstrip(os.sep) + os.sep) for r in real_roots):
        raise CommandRefused(f"{path} is outside the readable roots ({', '.join(roots)})")
    if any(fnmatch.fnmatch(real, pattern) for pattern in DENIED_PATHS):
        raise CommandRefused(f"{path} holds credentials and may not be read")


def _check_words(argv: Sequence[str]) -> None:
    if sum(len(a) for a in argv) > MAX_COMMAND:
        raise CommandRefused(f"the command is longer than {MAX_COMMAND} characters")
    for arg in argv:
        if len(arg) > MAX_ARGUMENT:
            raise CommandRefused(f"an argument is longer than {MAX_ARGUMENT} characters")
        if "\0" in arg:
            raise CommandRefused("an argument contains a NUL character")
        bad = sorted(SHELL_METACHARACTERS & set(arg))
        if bad:
            raise CommandRefused(
                f"argument {arg!r} contains shell metacharacters {' '.join(bad)}: commands run "
                "without a shell, one command per call, no pipes, redirections or substitutions"
            )


def check_command(argv: Sequence[str], roots: Sequence[str]) -> Parsed:
    """Raise :class:`CommandRefused` unless ``argv`` is an allowed read-only diagnostic."""
    if not argv:
        raise CommandRefused("empty command")
    _check_words(argv)
    name, args = argv[0], argv[1:]
    command = COMMANDS.get(name)
    if command is None:
        raise CommandRefused(
            f"{name!r} is not an allowed command; allowed: {', '.join(sorted(COMMANDS))}"
        )
    if name == "ip":
        check_ip(args)
        return Parsed(operands=list(args))
    parsed = parse_arguments(name, command, args)
    if command.operands is None and parsed.operands:
        raise CommandRefused(f"{name} takes no operands, got {parsed.operands[0]!r}")
    if command.max_operands is not None and len(parsed.operands) > command.max_operands:
        raise CommandRefused(f"{name} takes at most {command.max_operands} operand(s)")
    for option_name, option, given in parsed.options:
        _check_value(name, option_name, option.kind, given, roots)
    if command.check is not None:
        command.check(parsed)
    files = parsed.operands
    if name == "grep" and not parsed.given("-e", "--regexp", "-f", "--file"):
        files = files[1:]
    for operand in files:
        _check_value(name, "operand", command.operands or Kind.TEXT, operand, roots)
    return parsed


def _check_value(name: str, what: str, kind: Kind, given: str | None, roots: Sequence[str]) -> None:
    if given is None:
        return
    if kind is Kind.NUMBER and not _NUMBER.fullmatch(given):
        raise CommandRefused(f"{name} {what}: {given!r} is not a number")
    if kind is Kind.FILE and given != "-":
        check_readable(given, roots)
