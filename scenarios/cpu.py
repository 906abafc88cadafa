"""A runaway CPU process: ``thumbnailer`` hashing in a loop on as many threads as there are CPUs.

The threads hash large buffers (hashlib lets go of the GIL), so the one process keeps every core
busy and stands far above anything else in a CPU sample. It is SIGKILLed at teardown, dies with
the test process, and exits by itself after :data:`scenarios._procs.LIFETIME_SECONDS`. The
shipped ``incident_investigator`` investigates.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

from scenarios._base import Scenario, Staged, alert, host, kb_cite, kb_line, knowledge_first
from scenarios._procs import start_named, stop
from workers.testing.fake_openai import Reply
from workers.testing.recipe_model import Conversation, answer, call

NAME = "thumbnailer"
_BUSY = """
import contextlib, hashlib
# A runaway dominates its host; on a shared test machine other runs compete for the cores, so
# the process and its session's scheduling group (its own: it leads a new session) weigh about
# ten times a normal one. Everything else still gets its turn.
os.nice(-10)
with contextlib.suppress(OSError), open("/proc/self/autogroup", "w") as group:
    group.write("-10")
block = os.urandom(1 << 20)
def spin():
    while True:
        hashlib.sha256(block).digest()
for _ in range({threads}):
    threading.Thread(target=spin, daemon=True).start()
threading.Event().wait()
"""
#: How busy the hog must be before the alert fires (percent of one CPU, over a short sample).
BUSY_PERCENT = 80.0
#: The playbook's rule: the runaway uses at least half a core, and 1.5 times the next process;
#: when no process leads like that, sample again, up to this many samples in all.
RUNAWAY_PERCENT, RUNAWAY_LEAD, SAMPLES = 50.0, 1.5, 3


@contextmanager
def stage(root: Path) -> Iterator[Staged]:
    threads = os.cpu_count() or 1
    proc = start_named(NAME, _BUSY.format(threads=threads))
    try:
        hog = psutil.Process(proc.pid)
        hog.cpu_percent(None)
        # Busy for real before anyone is told: a sample after the threads have started.
        for _ in range(50):
            if hog.cpu_percent(0.2) >= BUSY_PERCENT:
                break
        else:
            raise RuntimeError(f"{NAME} (pid {proc.pid}) never got busy: {hog.cpu_percent(0.2)}%")
        yield Staged(
            alert=alert(
                "HostHighCpuLoad",
                "CPU busy above 90% for 5 minutes",
                host=host(),
                severity="warning",
            ),
            evidence={"pid": str(proc.pid), "name": NAME},
            context={"incident_id": "INC-CPU-1", "device_id": host()},
        )
    finally:
        stop(proc)


# --- the incident_investigator's recipe, as the playbook orders it -----------------------------


def _probe(conv: Conversation, number: int) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(conv.of("host_probe")[number].result)
    return loaded


def follow(conv: Conversation) -> Reply:
    """Step 0, then ``host_probe`` cpu (is it saturated?) → processes (who is busy?), sampled
    again while no process leads the sample clearly."""
    first = knowledge_first(conv)
    if first is not None:
        return first
    probes = conv.of("host_probe")
    if not probes:
        return call("host_probe", section="cpu")
    samples = [_probe(conv, n)["processes"]["top_cpu"] for n in range(1, len(probes))]
    culprit = _runaway(samples)
    if culprit is None and len(samples) < SAMPLES:
        return call("host_probe", section="processes")
    return answer(_report(conv, _probe(conv, 0), culprit, len(samples)))


def _leader(top: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The process far above the rest of one CPU sample, if one is."""
    if not top or top[0]["cpu_percent"] < RUNAWAY_PERCENT:
        return None
    second = top[1]["cpu_percent"] if len(top) > 1 else 0.0
    return top[0] if top[0]["cpu_percent"] >= RUNAWAY_LEAD * second else None


def _runaway(samples: list[list[dict[str, Any]]]) -> dict[str, Any] | None:
    """The leader of the latest sample; after the last sample, the process that was at the top
    of most of them."""
    if samples and (leader := _leader(samples[-1])) is not None:
        return leader
    if len(samples) < SAMPLES:
        return None
    tops = [s[0] for s in samples if s]
    counts = Counter(p["pid"] for p in tops)
    pid, times = counts.most_common(1)[0] if counts else (None, 0)
    return next(p for p in reversed(tops) if p["pid"] == pid) if times > 1 else None


def _report(
    conv: Conversation, cpu: dict[str, Any], top: dict[str, Any] | None, samples: int
) -> str:
    busy, load = cpu["cpu"]["percent"], cpu["load_average"]
    cpus = cpu["cpu"]["logical_cpus"]
    saturated = f"CPU {busy}% busy, load {load['1m']} on {cpus} CPUs"
    if top is None:
        status, cause = "symptom-only", "no single process stands out in the CPU sample"
        culprit = "none found"
    else:
        status = "root-cause"
        culprit = f"{top['name']} (pid {top['pid']}, user {top['user']}) at {top['cpu_percent']}%"
        cause = f"process {culprit} keeps the CPUs busy, ongoing at the time of the probe"
    return "\n".join(
        [
            f"Status: {status}. {saturated} on {cpu['hostname']}; {cause}.{kb_cite(conv)}",
            f"Root cause: {cause}",
            "Blast radius: single node",
            "Evidence:",
            f"- host_probe: section=cpu -> percent {busy}, load 1m/5m/15m "
            f"{load['1m']}/{load['5m']}/{load['15m']}, iowait {cpu['cpu']['iowait_percent']}%",
            f"- host_probe: section=processes ({samples} sample(s) of 0.3 s) -> top_cpu[0]: "
            f"{culprit}",
            "Recommendation: dispatch specialist-ops to stop or restart "
            + (f"{top['name']} (pid {top['pid']})" if top else "the busiest service")
            + " after its owner confirms it is not a legitimate batch run",
            kb_line(conv),
        ]
    )


SCENARIO = Scenario("cpu", "incident_investigator", stage, follow)
