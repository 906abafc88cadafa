"""A process whose memory grows until its limit: ``ingest-cache`` in a cgroup v1 memory group.

The group's limit is :data:`LIMIT_MIB`; its OOM killer is disabled, so at the limit the process
is frozen (``under_oom 1``) instead of killed, and the evidence stays put while it is read. The
group is a child of this process's own memory cgroup, named after the scenario; teardown lifts
the limit, SIGKILLs the process and removes the group. A machine without a writable cgroup v1
memory hierarchy fails the stage saying so. The shipped ``incident_investigator`` investigates.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

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
)
from scenarios._procs import start_named, stop
from workers.testing.fake_openai import Reply
from workers.testing.recipe_model import Conversation, answer, call

NAME = "ingest-cache"
LIMIT_MIB = 384
#: Where the playbook says the memory hierarchy is; the stage checks it is so.
HIERARCHY = Path("/sys/fs/cgroup/memory")
FREEZE_TIMEOUT = 60.0
_GROW = """
chunks = []
with open({procs!r}, "w") as joined:     # into the limited group before the first allocation
    joined.write(str(os.getpid()))
while True:
    chunk = bytearray(16 << 20)
    for at in range(0, len(chunk), 4096):  # touch every page: resident, not just reserved
        chunk[at] = 1
    chunks.append(chunk)
    time.sleep(0.02)
"""


class StageRefused(RuntimeError):
    """This machine has no memory cgroup the scenario can create."""


def _own_group() -> str:
    """This process's cgroup in the v1 memory hierarchy, e.g. ``/process_api/abc``."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return path
    raise StageRefused("no cgroup v1 memory controller in /proc/self/cgroup")


def _make_group() -> tuple[Path, str]:
    """A new memory group with the limit and no OOM killer: its directory and its id."""
    if not (HIERARCHY / "memory.limit_in_bytes").exists():
        raise StageRefused(f"{HIERARCHY} is not a cgroup v1 memory hierarchy")
    parent = _own_group().rstrip("/")
    for stale in (HIERARCHY / parent.lstrip("/")).glob("ongrid-scenario-memory-p*"):
        if left_behind(stale.name) and not _counter(stale, "tasks"):
            stale.rmdir()  # a run killed before its teardown (its process died with it)
    group_id = f"{parent}/{owned_name('memory')}{uuid.uuid4().hex[:8]}-{NAME}.service"
    directory = HIERARCHY / group_id.lstrip("/")
    try:
        directory.mkdir()
        (directory / "memory.limit_in_bytes").write_text(str(LIMIT_MIB << 20))
        (directory / "memory.oom_control").write_text("1")
    except OSError as exc:
        with contextlib.suppress(OSError):
            directory.rmdir()
        raise StageRefused(f"cannot create a memory cgroup at {directory}: {exc}") from None
    return directory, group_id


def _counter(directory: Path, name: str) -> str:
    return (directory / name).read_text().strip()


def _wait_frozen(directory: Path) -> None:
    deadline = time.monotonic() + FREEZE_TIMEOUT
    while "under_oom 1" not in _counter(directory, "memory.oom_control"):
        if time.monotonic() > deadline:
            usage = _counter(directory, "memory.usage_in_bytes")
            raise RuntimeError(f"{NAME} never reached its limit: usage {usage} bytes")
        time.sleep(0.1)


def _remove(directory: Path) -> None:
    """Wait for the killed task to leave, then remove the group."""
    deadline = time.monotonic() + 30
    while _counter(directory, "tasks") and time.monotonic() < deadline:
        time.sleep(0.05)
    directory.rmdir()


@contextmanager
def stage(root: Path) -> Iterator[Staged]:
    directory, group_id = _make_group()
    proc = None
    try:
        proc = start_named(NAME, _GROW.format(procs=str(directory / "cgroup.procs")))
        _wait_frozen(directory)
        yield Staged(
            alert=alert(
                "ContainerMemoryAtLimit",
                "memory cgroup usage at its limit",
                host=host(),
                id=group_id,
                name=NAME,
                severity="critical",
            ),
            evidence={
                "pid": str(proc.pid),
                "limit": _counter(directory, "memory.limit_in_bytes"),
                "freeze": "under_oom 1",
            },
            context={"incident_id": "INC-MEM-1", "device_id": host()},
        )
    finally:
        (directory / "memory.limit_in_bytes").write_text("-1")  # unfreeze, so the kill lands
        if proc is not None:
            stop(proc)
        _remove(directory)


# --- the incident_investigator's recipe, as the playbook orders it -----------------------------

_COUNTERS = ("limit_in_bytes", "usage_in_bytes", "max_usage_in_bytes", "failcnt", "oom_control")


def _read_counters(output: str) -> dict[str, str]:
    """``grep -H .`` lines → ``{"limit_in_bytes": "...", "under_oom": "1", ...}``."""
    found: dict[str, str] = {}
    for path, _, value in (line.partition(":") for line in output.splitlines()):
        counter = path.rsplit("/memory.", 1)[-1]
        if counter == "oom_control":
            key, _, number = value.partition(" ")
            found[key] = number
        else:
            found[counter] = value
    return found


def follow(conv: Conversation) -> Reply:
    """Step 0, then the cgroup's counters (``bash``) → the process by name (``host_probe``)."""
    first = knowledge_first(conv)
    if first is not None:
        return first
    alerted = labels(conv.task)
    directory = f"{HIERARCHY}{alerted.get('id', '')}"
    if not conv.of("bash"):
        files = " ".join(f"{directory}/memory.{c}" for c in _COUNTERS)
        return call("bash", command=f"grep -H . {files}")
    if not conv.of("host_probe"):
        return call("host_probe", section="processes")
    counters = _read_counters(conv.of("bash")[0].result)
    report = json.loads(conv.of("host_probe")[0].result)
    named = [p for p in report["processes"]["top_memory"] if p["name"] == alerted.get("name")]
    return answer(_report(conv, directory, counters, named[0] if named else None))


def _report(
    conv: Conversation, directory: str, counters: dict[str, str], proc: dict[str, Any] | None
) -> str:
    limit, usage = counters.get("limit_in_bytes", "?"), counters.get("usage_in_bytes", "?")
    at_limit = usage == limit and int(counters.get("failcnt", "0") or 0) > 0
    frozen = counters.get("under_oom") == "1"
    who = (
        f"{proc['name']} (pid {proc['pid']}, {proc['rss_mib']} MiB resident)"
        if proc
        else f"the process named {labels(conv.task).get('name', '?')} "
        "(not in host_probe's top_memory)"
    )
    state = "frozen at the limit (under_oom 1, OOM killer disabled)" if frozen else "at the limit"
    status = "root-cause" if at_limit and proc else "probable-cause" if at_limit else "symptom-only"
    mib = f"{int(limit) >> 20} MiB" if limit.isdigit() else limit
    return "\n".join(
        [
            f"Status: {status}. {who} grew to its memory cgroup's limit of {mib} and is {state}."
            + kb_cite(conv),
            f"Root cause: {who} in cgroup {labels(conv.task).get('id', '?')}: usage {usage} bytes "
            f"= limit {limit} bytes, failcnt {counters.get('failcnt', '?')}; ongoing at the probe",
            "Blast radius: single node",
            "Evidence:",
            f"- bash: grep -H . {directory}/memory.* -> limit_in_bytes {limit}, usage_in_bytes "
            f"{usage}, max_usage_in_bytes {counters.get('max_usage_in_bytes', '?')}, failcnt "
            f"{counters.get('failcnt', '?')}, under_oom {counters.get('under_oom', '?')}, "
            f"oom_kill {counters.get('oom_kill', '?')}",
            f"- host_probe: section=processes -> top_memory: {who}",
            "Recommendation: dispatch specialist-ops to restart "
            + (f"{proc['name']} (pid {proc['pid']})" if proc else "the service")
            + " to unfreeze it, and open a leak bug for its owners with these counters",
            kb_line(conv),
        ]
    )


SCENARIO = Scenario("memory", "incident_investigator", stage, follow)
