"""The allow-list of diagnostic commands: parsing as getopt does, and every refusal it owes.

Many cases are generated from the table itself (:data:`COMMANDS`), so a command or option added
later is covered without a new test: each refused option, each file-taking option pointed at a
secret, each long option abbreviated.
"""

from __future__ import annotations

import os

import pytest

from workers.tools._commands import COMMANDS, DEFAULT_READ_ROOTS, check_command
from workers.tools._getopt import CommandRefused, Kind, Option, parse_arguments

ROOTS = list(DEFAULT_READ_ROOTS)
#: Files a hostile command line would like to print, none of them under a readable root.
SECRETS = [
    # named, not numbered: every test process must collect the same test ids
    pytest.param(f"/proc/{os.getpid()}/environ", id="/proc/<this process>/environ"),
    "/proc/1/environ",
    "/proc/self/environ",
    "/root/.ssh/id_rsa",
]


def refused(command: str) -> str:
    with pytest.raises(CommandRefused) as caught:
        check_command(command.split(), ROOTS)
    return str(caught.value)


def _options(
    kind: Kind | None = None, refusing: bool | None = None
) -> list[tuple[str, str, Option]]:
    out = []
    for name, command in COMMANDS.items():
        for option in command.declared():
            if kind is not None and (option.kind is not kind or option.refused):
                continue
            if refusing is not None and bool(option.refused) is not refusing:
                continue
            out.extend((name, n, option) for n in option.names)
    return out


# --- what is accepted, the way the personas write it --------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        "df -h",
        "df -hT",
        "df -i /var",
        "df --output=source,pcent /",
        "du -xh --max-depth=2 /var",
        "du -sh /var/log",
        "findmnt -o TARGET,SOURCE,FSTYPE,OPTIONS",
        "findmnt -T /var/lib",
        "lsblk -f",
        "iostat -x 1 3",
        "vmstat 1 5",
        "dmesg -T",
        "journalctl -u nginx -n 50",
        "journalctl -u nginx -n 50 --no-pager",
        "journalctl -b -1 -p err",
        "journalctl -u postgresql --since -1h",
        "systemctl status nginx",
        "systemctl --no-pager status -- nginx",
        "systemctl list-units --failed",
        "systemctl show -p ActiveState,SubState nginx",
        "ss -s",
        "ss -ltnp",
        "ss -tan state established",
        "ip -br addr",
        "ip route show",
        "head -n 20 /var/log/syslog",
        "head -20 /etc/hostname",
        "tail -n 200 /var/log/syslog",
        "grep -i error /var/log/syslog",
        "grep -rn -m 50 -e oom /var/log",
        "grep -3 panic /var/log/kern.log",
        "cat /proc/meminfo",
        "cat /etc/os-release",
        "ls -la /var/lib",
        "stat -c %s /var/log/syslog",
        "date +%s",
        "date -u",
        "uptime",
        "free -h",
        "uname -a",
        "hostname -f",
        "id",
        "wc -l /var/log/syslog",
    ],
)
def test_accepted(command: str) -> None:
    check_command(command.split(), ROOTS)


def test_parsing_follows_getopt() -> None:
    tail = COMMANDS["tail"]
    parsed = parse_arguments("tail", tail, ["-n20", "/var/log/a", "-q", "--", "-v"])
    assert [(n, v) for n, _, v in parsed.options] == [("-n", "20"), ("-q", None)]
    assert parsed.operands == ["/var/log/a", "-v"]  # after --, and permuted like GNU
    grep = COMMANDS["grep"]
    parsed = parse_arguments("grep", grep, ["-inA", "3", "x", "/etc"])
    assert [(n, v) for n, _, v in parsed.options] == [("-i", None), ("-n", None), ("-A", "3")]
    assert parsed.operands == ["x", "/etc"]
    journal = COMMANDS["journalctl"]
    parsed = parse_arguments("journalctl", journal, ["-n", "20", "-b", "_PID=1"])
    assert [(n, v) for n, _, v in parsed.options] == [("-n", "20"), ("-b", None)]
    assert parsed.operands == ["_PID=1"]


# --- refusals --------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "option", "spec"), _options(refusing=True))
@pytest.mark.parametrize("value", ["", "=x"])
def test_every_refused_option_is_refused_with_its_reason(
    name: str, option: str, spec: Option, value: str
) -> None:
    spelled = f"{option}{value}" if option.startswith("--") else f"{option}{value[1:]}"
    assert spec.refused in refused(f"{name} {spelled} /var/log/syslog")


@pytest.mark.parametrize(("name", "option", "spec"), _options(kind=Kind.FILE))
@pytest.mark.parametrize("secret", SECRETS)
def test_file_options_cannot_reach_secrets(
    name: str, option: str, spec: Option, secret: str
) -> None:
    joined = f"{option}={secret}" if option.startswith("--") else f"{option} {secret}"
    extra = " x /var/log" if name == "grep" else ""
    why = refused(f"{name} {joined}{extra}")
    assert "outside the readable roots" in why or "holds credentials" in why


@pytest.mark.parametrize("name", [n for n, c in COMMANDS.items() if c.operands is Kind.FILE])
@pytest.mark.parametrize("secret", SECRETS)
def test_file_operands_cannot_reach_secrets(name: str, secret: str) -> None:
    pattern = "x " if name == "grep" else ""
    why = refused(f"{name} {pattern}{secret}")
    assert "outside the readable roots" in why or "holds credentials" in why


def _abbreviations() -> list[tuple[str, str]]:
    out = []
    for name, command in COMMANDS.items():
        if name == "ip":  # its own parser, tested by name below
            continue
        for option in command.declared():
            for long in (n for n in option.names if n.startswith("--") and len(n) > 4):
                short = long[:-1]
                if command.option(short) is None:
                    out.append((name, short))
    return out


@pytest.mark.parametrize(("name", "abbreviation"), _abbreviations())
def test_abbreviated_long_options_are_refused(name: str, abbreviation: str) -> None:
    assert "not an allowed option" in refused(f"{name} {abbreviation}")


@pytest.mark.parametrize(
    ("command", "why"),
    [
        # the review's reproductions
        ("du --files0-from=/proc/1/environ", "--files0-from is not allowed"),
        ("wc --files0-from=/proc/1/environ", "--files0-from is not allowed"),
        ("dmesg -F /etc/ongrid/config.yaml", "-F is not allowed"),
        ("systemctl --message status --root=/tmp enable foo", "--message is not an allowed"),
        ("date --s=2020-01-01", "--s is not an allowed"),
        ("tail --f /var/log/syslog", "--f is not an allowed"),
        ("ss --ki", "--ki is not an allowed"),
        ("ss -K dst 10.0.0.1", "kills sockets"),
        ("ps e", "not an allowed command"),
        ("lsof -p 1", "not an allowed command"),
        ("cat /etc/postgresql/15/main/pg_hba.conf", "holds credentials"),
        ("cat /etc/shadow", "holds credentials"),
        # verbs, values and operands
        ("systemctl enable foo", "not allowed; allowed verbs"),
        ("systemctl -p status enable foo", "not allowed; allowed verbs"),
        ("systemctl show nginx", "needs -p/--property"),
        ("systemctl show -p Environment nginx", "may hold secrets"),
        ("systemctl show --property=ExecStart nginx", "may hold secrets"),
        ("systemctl -H host status", "only this host"),
        ("date 010100002020", "only a +FORMAT"),
        ("hostname pwned", "takes no operands"),
        ("vmstat 1", "needs a count"),
        ("iostat -x 5 100", "at most"),
        ("tail -f /var/log/syslog", "never finishes"),
        ("journalctl -f", "never finishes"),
        ("journalctl --vacuum-time=1s", "deletes, rewrites"),
        ("ip -detail addr", "ip option -detail is not allowed"),
        ("journalctl -D /root", "outside the readable roots"),
        ("head -n lots /etc/hostname", "not a number"),
        ("grep -R root /etc", "follows symlinks"),
        ("grep root", "needs at least one file"),
        ("grep -f /root/patterns /etc/hostname", "outside the readable roots"),
        ("cat /etc/../root/secret", "outside the readable roots"),
        ("findmnt --poll", "never finishes"),
        ("findmnt -N 1", "not in scope"),
        ("lsblk --sysroot /x", "another root"),
        ("ip link set lo down", "ip is limited"),
        ("ip -b /etc/passwd", "ip option -b is not allowed"),
        ("ip -n other addr", "ip option -n is not allowed"),
        ("ip addr show -b x", "ip is limited"),
        ("mount /dev/sda1 /mnt", "not an allowed command"),
        ("rm -rf /", "not an allowed command"),
        ("free -s 1", "it repeats"),
        ("df --sync", "flushes"),
        ("ls --hyperlink", "not an allowed option"),
        ("cat -z /etc/hostname", "not an allowed option"),
        ("uname extra", "takes no operands"),
        ("tail -n", "needs a value"),
        ("id a b", "at most 1"),
        ("ls;id", "shell metacharacters"),
    ],
)
def test_refused(command: str, why: str) -> None:
    assert why in refused(command)


def test_long_and_nul_arguments_are_refused() -> None:
    with pytest.raises(CommandRefused, match="longer than"):
        check_command(["ls", "x" * 5000], ROOTS)
    with pytest.raises(CommandRefused, match="longer than"):
        check_command(["ls", *(["/var"] * 5000)], ROOTS)
    with pytest.raises(CommandRefused, match="NUL"):
        check_command(["cat", "/etc/hostname\0/proc/1/environ"], ROOTS)


def test_every_command_takes_help_and_version() -> None:
    for name in COMMANDS:
        if name != "ip":
            check_command([name, "--version"], ROOTS)
