"""A filesystem filling up: a size-limited tmpfs (or a loop-mounted image) a log has filled.

The mount lives under ``/var/tmp`` (the command sandbox hides ``/tmp``), world-readable so the
sandbox's unprivileged user can ``du`` it; its directory carries the test process's pid, so a
run killed before its teardown has its mount cleared by the next one. A tmpfs is tried first;
where the kernel refuses it, a 16 MiB ext4 image is loop-mounted instead; where both are
refused the stage fails saying what each answered. The shipped ``disk_specialist``
investigates.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from scenarios._base import (
    Scenario,
    Staged,
    alert,
    host,
    kb_cite,
    kb_line,
    knowledge_first,
    labels,
    left_behind,
    owned_name,
    stdout,
)
from workers.testing.fake_openai import Reply
from workers.testing.recipe_model import Conversation, answer, call

#: Where the mount goes: not /tmp, which the command sandbox replaces with an empty tmpfs.
SCRATCH_ROOT = Path("/var/tmp")
SIZE_MIB = 16
#: How much of the filesystem the runaway log fills.
FILL = 0.97
COMMAND_TIMEOUT = 30


class StageRefused(RuntimeError):
    """This machine would not mount a filesystem for the scenario."""


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT)


def _mount(scratch: Path, mountpoint: Path) -> str:
    """Mount a small filesystem at ``mountpoint``; its type."""
    tmpfs = _run(
        "mount", "-t", "tmpfs", "-o", f"size={SIZE_MIB}m,mode=0755", "tmpfs", str(mountpoint)
    )
    if tmpfs.returncode == 0:
        return "tmpfs"
    image = scratch / "spool.img"
    with open(image, "wb") as out:
        out.truncate(SIZE_MIB * 1024 * 1024)
    made = _run("mkfs.ext4", "-q", "-m", "0", "-F", str(image))
    loop = (
        _run("mount", "-o", "loop", str(image), str(mountpoint)) if made.returncode == 0 else made
    )
    if loop.returncode == 0:
        mountpoint.chmod(0o755)
        return "ext4"
    raise StageRefused(
        f"cannot stage a filesystem at {mountpoint}: mounting a tmpfs was refused "
        f"({tmpfs.stderr.strip()}), and so was a loop-mounted ext4 image ({loop.stderr.strip()})"
    )


def _use_percent(mountpoint: Path) -> int:
    """Use % as ``df`` computes it: used / (used + available), rounded up."""
    st = os.statvfs(mountpoint)
    used = st.f_blocks - st.f_bfree
    return math.ceil(100 * used / (used + st.f_bavail))


def _fill(mountpoint: Path) -> Path:
    """A service's spool: a few small files, and one export log nobody rotates."""
    logs = mountpoint / "exporter" / "logs"
    logs.mkdir(parents=True)
    (mountpoint / "exporter" / "state").mkdir()
    (mountpoint / "exporter" / "state" / "cursor").write_text("offset=1048576\n")
    for day in range(1, 4):
        (logs / f"export-2026-11-0{day}.log.gz").write_bytes(os.urandom(8 * 1024))
    runaway = logs / "export-current.log"
    line = b"2026-12-01T10:00:00Z INFO exported batch id=42 rows=1000 retry=0\n"
    # As df counts it: used / (used + available), which writing leaves unchanged (an ext4
    # image keeps blocks for itself that are neither).
    st = os.statvfs(mountpoint)
    used = st.f_blocks - st.f_bfree
    target = int((FILL * (used + st.f_bavail) - used) * st.f_frsize)
    with open(runaway, "wb") as out:
        out.write(line * (target // len(line)))
        os.fsync(out.fileno())  # counted now, as df will count it
    for path in (mountpoint, *mountpoint.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return runaway


def _unmount(mountpoint: Path) -> None:
    done = _run("umount", str(mountpoint))
    if done.returncode != 0:  # something still holds it: detach now, freed when let go
        _run("umount", "--lazy", str(mountpoint))


def _clear_left_behind() -> None:
    """Mounts of runs killed before their teardown."""
    for scratch in SCRATCH_ROOT.glob("ongrid-scenario-disk-p*"):
        if left_behind(scratch.name):
            if (scratch / "spool").is_mount():
                _unmount(scratch / "spool")
            shutil.rmtree(scratch, ignore_errors=True)


@contextmanager
def stage(root: Path) -> Iterator[Staged]:
    _clear_left_behind()
    scratch = Path(tempfile.mkdtemp(prefix=owned_name("disk"), dir=SCRATCH_ROOT))
    scratch.chmod(0o755)
    mountpoint = scratch / "spool"
    mountpoint.mkdir()
    mounted = False
    try:
        fstype = _mount(scratch, mountpoint)
        mounted = True
        runaway = _fill(mountpoint)
        percent = _use_percent(mountpoint)
        yield Staged(
            alert=alert(
                "FilesystemAlmostFull",
                "filesystem almost full, writes will soon fail with no space left on device",
                host=host(),
                mountpoint=str(mountpoint),
                fstype=fstype,
                severity="critical",
            ),
            evidence={"mountpoint": str(mountpoint), "use": f"{percent}%", "file": runaway.name},
        )
    finally:
        if mounted:
            _unmount(mountpoint)
        shutil.rmtree(scratch, ignore_errors=True)


# --- the disk_specialist's recipe ------------------------------------------------------------


def _df_rows(output: str) -> list[dict[str, str]]:
    """Rows of ``df -hT``: filesystem, type, size, used, avail, use, mountpoint."""
    rows = []
    for line in output.splitlines():
        parts = line.split(None, 6)
        if len(parts) == 7 and parts[5].endswith("%") and parts[5][:-1].isdigit():
            keys = ("filesystem", "type", "size", "used", "avail", "use", "mountpoint")
            rows.append(dict(zip(keys, parts, strict=True)))
    return rows


def _target(conv: Conversation) -> dict[str, str] | None:
    """The df row of the alerted mount, else the fullest one."""
    rows = _df_rows(conv.of("bash")[0].result)
    named = [r for r in rows if r["mountpoint"] == labels(conv.task).get("mountpoint")]
    candidates = named or sorted(rows, key=lambda r: -int(r["use"][:-1]))
    return candidates[0] if candidates else None


_REGULAR = re.compile(r"^-[r-][w-][xsS-]")  # a regular file's mode in ls -l
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)([KMGTP]?)$")
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "P": 2**50}


def _bytes(human: str) -> float:
    found = _SIZE.match(human)
    return float(found.group(1)) * _UNITS[found.group(2)] if found else 0.0


def _largest_dir(output: str, mountpoint: str) -> tuple[str, str] | None:
    """The biggest directory of ``du -xh --max-depth=2``, the deepest of equals."""
    rows = [line.split("\t", 1) for line in output.splitlines() if "\t" in line]
    inside = [(size, path) for size, path in rows if path != mountpoint]
    if not inside:
        return None
    return max(inside, key=lambda r: (_bytes(r[0]), r[1].count("/")))


def _first_file(output: str) -> str | None:
    """The first (largest) regular file line of ``ls -l --sort=size``."""
    return next((line for line in output.splitlines() if _REGULAR.match(line)), None)


def follow(conv: Conversation) -> Reply:
    """Step 0, then: ``df -hT`` → the alerted mount → ``df -i`` on it → ``du`` → ``ls``."""
    first = knowledge_first(conv)
    if first is not None:
        return first
    shell = conv.of("bash")
    if not shell:
        return call("bash", command="df -hT")
    row = _target(conv)
    if row is None:
        return answer(_inconclusive(conv, "df -hT showed no filesystem"))
    mountpoint = row["mountpoint"]
    if len(shell) == 1:
        return call("bash", command=f"df -i {mountpoint}")
    if len(shell) == 2:
        return call("bash", command=f"du -xh --max-depth=2 {mountpoint}")
    largest = _largest_dir(shell[2].result, mountpoint)
    if len(shell) == 3 and largest is not None:
        return call("bash", command=f"ls -l --sort=size --human-readable {largest[1]}")
    return answer(_report(conv, row, largest, _first_file(shell[3].result) if largest else None))


def _inodes(output: str, mountpoint: str) -> str:
    """IUse% of ``mountpoint`` in ``df -i`` output."""
    rows = [line.split() for line in stdout(output).splitlines()]
    found = [row[4] for row in rows if len(row) >= 6 and row[-1] == mountpoint]
    return found[0] if found else "unknown"


def _report(
    conv: Conversation, row: dict[str, str], largest: tuple[str, str] | None, top: str | None
) -> str:
    shell = conv.of("bash")
    use = int(row["use"][:-1])
    status = "critical" if use >= 95 else "warning" if use >= 85 else "ok"
    inodes = _inodes(shell[1].result, row["mountpoint"])
    holder = top.split()[-1] if top else None
    lines = [
        f"Status: {status}. On {labels(conv.task).get('host', 'this host')}, "
        f"{row['mountpoint']} ({row['type']}) is {row['use']} full by bytes "
        f"({row['avail']} of {row['size']} left; inodes {inodes} used), "
        + (f"held by {largest[1]}/{holder}." if largest and holder else "holder not found.")
        + kb_cite(conv),
        "Evidence:",
        f"- bash: df -hT -> {row['filesystem']} {row['type']} {row['size']} size, "
        f"{row['used']} used, {row['avail']} avail, {row['use']} on {row['mountpoint']}",
        f"- bash: df -i {row['mountpoint']} -> IUse% {inodes}",
    ]
    if largest is not None:
        lines.append(
            f"- bash: du -xh --max-depth=2 {row['mountpoint']} -> {largest[0]} in {largest[1]}"
        )
    if top is not None and largest is not None:
        lines.append(f"- bash: ls -l --sort=size --human-readable {largest[1]} -> {top}")
    lines += [
        "Time to full: n/a (no Prometheus series for this mount was queried; it is "
        f"{row['use']} full now)",
        "Recommendation: dispatch specialist-ops to rotate or compress "
        + (f"{largest[1]}/{holder}" if largest and holder else "the largest files")
        + " and fix its writer's log rotation",
        kb_line(conv),
    ]
    return "\n".join(lines)


def _inconclusive(conv: Conversation, why: str) -> str:
    return "\n".join(
        [
            f"Status: inconclusive. {why}.",
            "Evidence:",
            f"- bash: df -hT -> {why}",
            "Time to full: n/a",
            "Recommendation: observation only",
            kb_line(conv),
        ]
    )


SCENARIO = Scenario("disk", "disk_specialist", stage, follow)
