"""The command sandbox, for real: bubblewrap namespaces, the unprivileged user, hidden paths.

These call :meth:`Sandbox.run` directly, without the allow-list in front, so they show what the
sandbox alone keeps closed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest

from workers.sandbox import HOST_MOUNTINFO, STDOUT_LIMIT, Sandbox
from workers.tools._commands import COMMANDS
from workers.tools._getopt import Arg

HERE = Path(__file__).resolve().parents[2]


def run(box: Sandbox, *argv: str, timeout: float = 20):
    executable = shutil.which(argv[0], path="/usr/sbin:/usr/bin:/sbin:/bin")
    assert executable, argv[0]
    return box.run([executable, *argv[1:]], timeout)


def test_commands_run_as_an_unprivileged_user_who_sees_no_other_process(sandbox: Sandbox) -> None:
    done = run(sandbox, "id", "-u")
    assert done.exit_code == 0
    assert done.stdout.strip() != "0"
    listing = run(sandbox, "ls", "/proc")
    pids = sorted(int(n) for n in listing.stdout.split() if n.isdigit())
    assert pids and max(pids) < 10, pids  # the sandbox's own few processes, not the host's
    assert str(os.getpid()) not in listing.stdout.split()


def test_neither_the_worker_environment_nor_pid_1_leaks(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    canary = f"canary-{uuid.uuid4().hex}"
    monkeypatch.setenv("OPENAI_API_KEY", canary)
    for argv in (
        ["cat", "/proc/1/environ"],
        ["cat", "/proc/self/environ"],
        ["cat", f"/proc/{os.getpid()}/environ"],
        # the pattern does not hold the canary, or grep's own command line would
        ["grep", "-Ea", f"canar[y]-{canary[7:]}", "/proc/1/environ", "/proc/self/environ"],
        ["sh", "-c", "cat /proc/*/environ; env"],
    ):
        done = run(sandbox, *argv)
        assert canary not in done.stdout + done.stderr, argv
    environment = run(sandbox, "cat", "/proc/self/environ").stdout.split("\0")
    assert sorted(e.split("=")[0] for e in environment if e) == [
        "LC_ALL", "PAGER", "PATH", "PWD", "SYSTEMD_COLORS", "SYSTEMD_PAGER",
    ]  # fmt: skip


def test_the_filesystem_is_read_only_and_nothing_can_be_written(
    sandbox: Sandbox, open_dir: Path
) -> None:
    target = open_dir / "x"
    for argv in (["touch", "/tmp/x"], ["touch", "/var/tmp/x"], ["touch", str(target)]):
        done = run(sandbox, *argv)
        assert done.exit_code != 0, argv
    assert not target.exists()
    # Even a writable place (the sandbox's private /dev/shm) takes no bytes: RLIMIT_FSIZE is 0.
    done = run(sandbox, "sh", "-c", "echo data > /dev/shm/x")
    assert done.exit_code != 0


def test_hidden_paths_are_empty_and_shown_paths_readable(open_dir: Path) -> None:
    root = open_dir
    work = root / "work"
    (work / "repo").mkdir(parents=True)
    (work / "config.yaml").write_text("token: secret-in-config\n")
    (work / "repo" / "notes.md").write_text("visible\n")
    (work / "repo" / "local.yaml").write_text("password: secret-in-repo\n")
    for path in (work, work / "repo"):
        path.chmod(0o755)
    for path in (work / "config.yaml", work / "repo" / "notes.md", work / "repo" / "local.yaml"):
        path.chmod(0o644)
    box = Sandbox(hide=[work, work / "repo" / "local.yaml"], show=[work / "repo"])
    assert run(box, "cat", str(work / "repo" / "notes.md")).stdout == "visible\n"
    assert run(box, "ls", "-A", str(work)).stdout.split() == ["repo"]
    assert run(box, "cat", str(work / "repo" / "local.yaml")).stdout == ""
    hidden = run(box, "cat", str(work / "config.yaml"))
    assert hidden.exit_code != 0 and "secret" not in hidden.stdout


def test_the_worker_own_files_are_hidden(open_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = open_dir
    config = root / "ongrid.yaml"
    config.write_text("auth: {tokens: {'secret-token-000000': {user: a, role: admin}}}\n")
    config.chmod(0o644)
    data = root / "data"
    data.mkdir(mode=0o755)
    (data / "ongrid.db").write_text("secret-db")
    (data / "ongrid.db").chmod(0o644)
    monkeypatch.chdir(root)
    settings = type("S", (), {"data_dir": data, "repo_root": "", "sandbox_hide": []})()
    box = Sandbox.for_worker(settings, {"ONGRID_CONFIG": str(config)})
    for argv in (["cat", str(config)], ["cat", str(data / "ongrid.db")], ["ls", str(data)]):
        done = run(box, *argv)
        assert "secret" not in done.stdout and "ongrid.db" not in done.stdout, argv


def test_findmnt_sees_the_host_mount_table(sandbox: Sandbox) -> None:
    inside = run(sandbox, "cat", HOST_MOUNTINFO).stdout
    assert inside == Path("/proc/self/mountinfo").read_text()
    root_options = run(sandbox, "findmnt", "-n", "-o", "OPTIONS", "--tab-file", HOST_MOUNTINFO, "/")
    host = subprocess.run(
        ["findmnt", "-n", "-o", "OPTIONS", "/"], capture_output=True, text=True, check=True
    )
    assert root_options.stdout == host.stdout


def test_timeout_kills_the_whole_sandbox(sandbox: Sandbox) -> None:
    marker = f"{30 + uuid.uuid4().int % 1000 / 1000:.3f}"
    done = run(sandbox, "sh", "-c", f"echo started; sleep {marker}; echo never", timeout=1)
    assert done.exit_code is None
    assert done.stdout == "started\n"
    left = [
        p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])
    ]
    assert left == [], "a process of the sandbox outlived its timeout"


def test_output_is_capped(sandbox: Sandbox) -> None:
    done = run(sandbox, "head", "-c", "100000", "/dev/zero")
    assert len(done.stdout) < STDOUT_LIMIT + 200
    assert re.search(r"output truncated at 16 KiB: \d+ more bytes", done.stdout)


def test_unavailable_sandboxes_say_why_and_run_nothing(tmp_path: Path) -> None:
    missing = Sandbox(tools_path=str(tmp_path))
    assert "bubblewrap is not installed" in (missing.unavailable() or "")
    with pytest.raises(RuntimeError, match="no sandbox: bubblewrap is not installed"):
        missing.run(["/bin/true"], 5)
    if os.geteuid() == 0:
        assert "does not exist" in (Sandbox(user="no-such-user-x").unavailable() or "")
        assert "must not be root" in (Sandbox(user="root").unavailable() or "")
        assert "no group" in (Sandbox(groups=["no-such-group-x"]).unavailable() or "")


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user needs root")
def test_a_worker_that_is_not_root_sandboxes_in_a_user_namespace() -> None:
    """The worker's own user, in a user namespace: still no host process, still read-only."""
    script = (
        "from workers.sandbox import Sandbox; s = Sandbox(); "
        "print(s.unavailable()); print(s.run(['/usr/bin/id', '-u'], 10).stdout.strip()); "
        "print(' '.join(sorted(n for n in s.run(['/usr/bin/ls', '/proc'], 10).stdout.split() "
        "if n.isdigit())))"
    )
    python = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
    done = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", python, "-c", script],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(HERE)},
        cwd="/",
        timeout=60,
        check=False,
    )
    if "No module named" in done.stderr or "Permission denied" in done.stderr:
        pytest.skip(f"no Python the unprivileged user can run here: {done.stderr.strip()[-200:]}")
    assert done.returncode == 0, done.stderr
    unavailable, uid, pids = done.stdout.splitlines()
    assert (unavailable, uid) == ("None", "65534")
    assert max(int(p) for p in pids.split()) < 10


# --- the allow-list agrees with the programs it names -------------------------------------------


def _conformance_cases() -> list[tuple[str, str, str]]:
    cases = []
    for name, command in COMMANDS.items():
        if name == "ip" or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin") is None:
            continue
        for option in command.declared():
            if option.refused or option.arg not in (Arg.NONE, Arg.REQUIRED):
                continue
            for spelled in option.names:
                if option.arg is Arg.REQUIRED:
                    cases.append((name, spelled, "requires"))
                elif spelled.startswith("--"):
                    cases.append((name, spelled, "no-value"))
                else:
                    cases.append((name, spelled, "known"))
    return cases


@pytest.mark.parametrize(("name", "option", "expect"), _conformance_cases())
def test_the_allow_list_parses_options_as_the_program_does(
    sandbox: Sandbox, name: str, option: str, expect: str
) -> None:
    """A value-taking option given last must make the program ask for its value; a flag given a
    value must be refused by the program; a short flag must be one the program knows. Any
    disagreement would let a value pass for a file or a file for a value."""
    if expect == "requires":
        done = run(sandbox, name, option)
        assert "requires an argument" in done.stderr, done.stderr
    elif expect == "no-value":
        done = run(sandbox, name, f"{option}=x")
        assert "allow an argument" in done.stderr, done.stderr
    else:
        done = run(sandbox, name, option, "--no-such-option-anywhere")
        assert "invalid option" not in done.stderr, done.stderr
