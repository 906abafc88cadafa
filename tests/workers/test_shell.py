"""``bash`` / ``host_bash`` and the write tools beside them, run for real in the real sandbox.

The red-team part drives the tool the way a steered model would: every file-taking and writing
option of every allowed command, aimed at the worker's environment, PID 1's and a config file
holding a canary secret, plus the reproductions of the security review. Every attempt must be
refused or harmless, and the canary must appear in no output.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from registry.tools import ToolContext, ToolResult
from workers.sandbox import Sandbox, run_argv
from workers.tools import _shell as shell
from workers.tools import default_catalog
from workers.tools._commands import COMMANDS
from workers.tools._getopt import Kind

CATALOG = default_catalog()


def call(name: str, sandbox: Sandbox | None, settings: Any = None, **arguments: Any) -> ToolResult:
    tool = CATALOG.get(name)
    context = ToolContext(settings=settings, sandbox=sandbox)
    return tool.run(tool.validate_arguments(arguments), context)


def test_bash_runs_df_for_real(sandbox: Sandbox) -> None:
    result = call("bash", sandbox, command="df -h")
    assert not result.is_error
    assert result.data["exit_code"] == 0
    assert "Filesystem" in result.data["stdout"]
    assert result.content.startswith("$ df -h\nexit code: 0")


def test_host_bash_is_the_same_tool_under_another_name(sandbox: Sandbox) -> None:
    result = call("host_bash", sandbox, command="uname -a")
    assert not result.is_error
    assert os.uname().release in result.data["stdout"]


def test_findmnt_shows_the_host_options_not_the_sandbox_binds(sandbox: Sandbox) -> None:
    result = call("bash", sandbox, command="findmnt -n -o OPTIONS /")
    host = run_argv(["/usr/bin/findmnt", "-n", "-o", "OPTIONS", "/"], 10)
    assert result.data["stdout"] == host.stdout


@pytest.mark.parametrize(
    ("command", "why"),
    [
        ("rm -rf /", "not an allowed command"),
        ("cat /root/secret", "outside the readable roots"),
        ("ls; id", "shell metacharacters"),
        ("cat /etc/hostname > /tmp/x", "shell metacharacters"),
        ("echo $(id)", "shell metacharacters"),
        ("cat /proc/self/environ", "credentials"),
        ("systemctl restart nginx", "not allowed; allowed verbs"),
        ("/bin/rm -rf /", "by name"),
        ("cat 'unterminated", "cannot parse"),
    ],
)
def test_refusals_come_before_anything_runs(sandbox: Sandbox, command: str, why: str) -> None:
    result = call("bash", sandbox, command=command)
    assert result.is_error
    assert result.content.startswith("refused:")
    assert why in result.content


def test_without_a_sandbox_nothing_runs(tmp_path: Path) -> None:
    for box in (None, Sandbox(tools_path=str(tmp_path))):
        result = call("bash", box, command="df -h")
        assert result.is_error
        assert result.content.startswith("bash is unavailable on this worker:")
        assert result.content.endswith("Nothing was run.")


def test_bash_reads_inside_roots_and_truncates_long_output(
    sandbox: Sandbox, open_dir: Path
) -> None:
    repo = open_dir / "repo"
    repo.mkdir(mode=0o755)
    big = repo / "big.log"
    big.write_text("x" * 40_000 + "\n")
    big.chmod(0o644)
    box = Sandbox(show=[repo])
    result = call("bash", box, SimpleNamespace(repo_root=str(repo)), command=f"cat {big}")
    assert not result.is_error, result.content
    assert "output truncated at 16 KiB" in result.content
    assert len(result.data["stdout"]) < 17_000
    refused = call("bash", box, command=f"cat {big}")  # without the setting, it is no root
    assert refused.is_error and "outside the readable roots" in refused.content


def test_bash_reports_nonzero_exit_without_failing(sandbox: Sandbox) -> None:
    result = call("bash", sandbox, command="grep -c no-such-string-anywhere-xyz /etc/hostname")
    assert not result.is_error
    assert result.data["exit_code"] == 1


def test_arguments_too_long_or_with_nul_are_tool_errors(sandbox: Sandbox) -> None:
    from registry.errors import ToolArgumentError

    tool = CATALOG.get("bash")
    for bad in ({"command": "ls " + "x" * 200_000}, {"command": "cat /etc/hostname\0x"}):
        with pytest.raises(ToolArgumentError, match="invalid arguments for bash"):
            tool.validate_arguments(bad)


def test_commands_are_killed_at_the_timeout_with_partial_output() -> None:
    script = "print('started', flush=True); import time; time.sleep(30)"
    done = run_argv([sys.executable, "-c", script], timeout=1)
    assert done.exit_code is None
    assert done.stdout == "started\n"
    assert done.render().splitlines()[1] == "timed out"


def test_restart_service_validates_unit_and_needs_systemctl(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    bad = call("host_restart_service", None, unit="nginx;reboot")
    assert bad.is_error and "not a valid systemd unit name" in bad.content
    assert call("host_restart_service", None, unit="--force").is_error
    monkeypatch.setattr(shell, "SAFE_PATH", str(tmp_path))  # an empty directory: no systemctl
    missing = call("host_restart_service", None, unit="nginx.service")
    assert missing.is_error and "systemctl is not on PATH" in missing.content


def test_reboot_is_disabled_unless_allowed() -> None:
    for settings in (None, SimpleNamespace(allow_reboot=False)):
        result = call("host_reboot", None, settings, reason="kernel update")
        assert result.is_error
        assert "disabled on this host" in result.content


# --- red team ----------------------------------------------------------------------------------


@pytest.fixture
def planted(open_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SimpleNamespace]:
    """A worker's view with a canary: in this process's environment, in a config file inside the
    repository root (readable by the allow-list, hidden by the sandbox), and in the data dir."""
    canary = f"sk-canary-{uuid.uuid4().hex}"
    monkeypatch.setenv("OPENAI_API_KEY", canary)
    repo = open_dir / "repo"
    data = open_dir / "data"
    for path in (repo, data):
        path.mkdir()
    config = repo / "ongrid.yaml"
    config.write_text(f"auth:\n  tokens:\n    {canary}: {{user: alice, role: admin}}\n")
    (data / "ongrid.db").write_text(canary)
    (repo / "README.md").write_text("an ops repository\n")
    for path in (config, data / "ongrid.db", repo / "README.md", repo, data):
        path.chmod(0o755 if path.is_dir() else 0o644)
    settings = SimpleNamespace(repo_root=str(repo), data_dir=data, sandbox_hide=[])
    box = Sandbox.for_worker(settings, {"ONGRID_CONFIG": str(config)})
    yield SimpleNamespace(canary=canary, config=config, data=data, repo=repo, box=box,
                          settings=settings)  # fmt: skip


def _targets(planted: SimpleNamespace) -> list[str]:
    return [
        f"/proc/{os.getpid()}/environ",
        "/proc/self/environ",
        "/proc/1/environ",
        str(planted.config),
        str(planted.data / "ongrid.db"),
    ]


def _attempts(planted: SimpleNamespace) -> list[str]:
    """Every file-taking option and file operand of every command, aimed at every target; every
    refused option; and the security review's reproductions."""
    out = []
    for target in _targets(planted):
        for name, command in COMMANDS.items():
            pattern = "x " if name == "grep" else ""
            if command.operands in (Kind.FILE, Kind.PATH):
                out.append(f"{name} {pattern}{target}")
            for option in command.declared():
                if option.kind in (Kind.FILE, Kind.PATH) or option.refused:
                    for spelled in option.names:
                        out.append(f"{name} {spelled} {target} {pattern}/var/log".strip())
    out += [
        f"du --files0-from=/proc/{os.getpid()}/environ",
        f"dmesg -F {planted.config}",
        f"grep -r {planted.canary[:12]} {planted.repo}",
        f"grep -ra sk-canary /proc/1 {planted.repo}",
        f"cat {planted.repo}/../repo/ongrid.yaml",
        f"ls -la {planted.repo} {planted.data}",
        f"stat {planted.config}",
        "systemctl --message status --root=/tmp enable foo",
        "date --s=2020-01-01",
        "tail --f /var/log/syslog",
        "ss --ki",
        f"head -c 100000 {planted.config}",
        f"wc -c {planted.config}",
    ]
    return out


def test_no_attempt_reaches_the_canary(planted: SimpleNamespace) -> None:
    attempts = _attempts(planted)
    assert len(attempts) > 400  # the table really was walked
    ran = 0
    for command in attempts:
        result = call("bash", planted.box, planted.settings, command=command)
        text = result.content + str(result.data or "")
        assert planted.canary not in text, command
        assert planted.canary[10:] not in text, command  # nor the part a pattern left out
        ran += not result.content.startswith("refused:")
    assert ran > 20  # the sandbox, not only the allow-list, was put to the test


def test_the_repository_stays_readable_beside_the_hidden_config(planted: SimpleNamespace) -> None:
    listed = call("bash", planted.box, planted.settings, command=f"ls {planted.repo}")
    assert "README.md" in listed.data["stdout"]
    read = call("bash", planted.box, planted.settings, command=f"cat {planted.repo}/README.md")
    assert read.data["stdout"] == "an ops repository\n"
    hidden = call("bash", planted.box, planted.settings, command=f"cat {planted.config}")
    assert hidden.data["stdout"] == ""
