"""A Prometheus scrape target down: one of the ``node`` job's two exporters stopped.

Two real node exporters are scraped every second by a real Prometheus
(:mod:`workers.testing.backends`); once both are ``up``, one is stopped and the stage waits until
Prometheus itself reports ``up == 0`` for it. Everything is stopped at teardown. The shipped
``incident_investigator`` investigates.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from scenarios._base import Scenario, Staged, alert, host, kb_cite, kb_line, knowledge_first
from workers.testing.backends import start_node_exporter, start_prometheus
from workers.testing.fake_openai import Reply
from workers.testing.recipe_model import Conversation, answer, call

JOB = "node"
#: Bounds on Prometheus seeing the targets come up, and the stopped one go down.
SCRAPE_TIMEOUT = 60.0


@contextmanager
def stage(root: Path) -> Iterator[Staged]:
    with ExitStack() as stack:
        exporters = [start_node_exporter(root / f"exporter-{n}") for n in range(2)]
        for exporter in exporters:
            stack.callback(exporter.stop)
        prometheus = start_prometheus(root / "prometheus", {JOB: [e.address for e in exporters]})
        stack.callback(prometheus.stop)
        prometheus.wait_for(f'up{{job="{JOB}"}} == 1', lambda r: len(r) == 2, SCRAPE_TIMEOUT)
        down = exporters[1]
        down.stop()
        prometheus.wait_for(f'up{{instance="{down.address}"}} == 0', timeout=SCRAPE_TIMEOUT)
        yield Staged(
            alert=alert(
                "TargetDown",
                "Prometheus scrape target is down (up == 0)",
                job=JOB,
                severity="warning",
            ),
            evidence={"instance": down.address, "up": f'instance="{down.address}", job="{JOB}"'},
            context={"incident_id": "INC-TARGET-1", "device_id": host()},
            env={"PROMETHEUS_URL": prometheus.url},
        )


# --- the incident_investigator's recipe, as the playbook orders it -----------------------------

_SERIES = re.compile(r"(?m)^up\{(?P<labels>[^}]*)\}")
_SUMMARY = re.compile(r"min=(?P<min>\S+) max=(?P<max>\S+) avg=\S+ last=(?P<last>\S+)")


def _down(result: str) -> list[dict[str, str]]:
    """The ``up`` series of a ``up == 0`` answer, as label dicts."""
    return [dict(re.findall(r'(\w+)="([^"]*)"', m["labels"])) for m in _SERIES.finditer(result)]


def follow(conv: Conversation) -> Reply:
    """Step 0, then ``up == 0`` → that target's ``up`` over 10 minutes → ``ss`` on its port."""
    first = knowledge_first(conv)
    if first is not None:
        return first
    queries = conv.of("query_promql")
    if not queries:
        return call("query_promql", query="up == 0")
    targets = _down(queries[0].result)
    if not targets:
        return answer(_report(conv, None))
    target = targets[0]
    if len(queries) == 1:
        selector = f'up{{job="{target["job"]}",instance="{target["instance"]}"}}'
        return call("query_promql", query=selector, start="10m", step="5s")
    if not conv.of("bash"):
        port = target["instance"].rsplit(":", 1)[-1]
        return call("bash", command=f"ss -ltn sport = :{port}")
    return answer(_report(conv, target))


def _report(conv: Conversation, target: dict[str, str] | None) -> str:
    queries = conv.of("query_promql")
    first_line = next((ln for ln in queries[0].result.splitlines() if ln.startswith("up{")), "")
    if target is None:
        return "\n".join(
            [
                f"Status: symptom-only. up == 0 matches no target now: {queries[0].result}",
                "Root cause: none found; the alert may have resolved",
                "Blast radius: single node",
                "Evidence:",
                f"- query_promql: up == 0 -> {queries[0].result.splitlines()[0]}",
                "Recommendation: observation only",
                kb_line(conv),
            ]
        )
    summary = _SUMMARY.search(queries[1].result)
    history = (
        f"min={summary['min']} max={summary['max']} last={summary['last']}" if summary else "?"
    )
    was_up = summary is not None and float(summary["max"]) == 1.0
    listening = [ln for ln in conv.of("bash")[0].result.splitlines() if ln.startswith("LISTEN")]
    instance = target["instance"]
    cause = (
        f"nothing listens on {instance} any more: the {target['job']} exporter there stopped"
        if not listening
        else f"a process still listens on {instance}: the scrape fails on the way or times out"
    )
    return "\n".join(
        [
            f"Status: {'root-cause' if not listening else 'probable-cause'}. Target {instance} of "
            f"job {target['job']} is down (up == 0){' after being up' if was_up else ''}; "
            f"{cause}.{kb_cite(conv)}",
            f"Root cause: {cause}; ongoing at the query",
            f"Blast radius: the target {instance} only (every alert on its metrics is blind)",
            "Evidence:",
            f"- query_promql: up == 0 -> {first_line}",
            f'- query_promql: up{{job="{target["job"]}",instance="{instance}"}}[10m] -> {history}',
            f"- bash: ss -ltn sport = :{instance.rsplit(':', 1)[-1]} -> "
            + (f"{len(listening)} listener(s)" if listening else "no LISTEN line"),
            f"Recommendation: dispatch specialist-ops to start the {target['job']} exporter on "
            f"{instance} and check up returns to 1",
            kb_line(conv),
        ]
    )


SCENARIO = Scenario("target_down", "incident_investigator", stage, follow)
