"""What each worker process runs: its registry version and persona set, for the fleet view.

Disk personas are read on each host, so two hosts at one registry version can run different
personas (an agents directory deployed to one host and not the other). Every worker process
therefore reports, in Redis, the cluster version its registry is loaded at and digests of what
that registry holds: ``ongrid:fleet:<member>`` holds the JSON :class:`FleetReport` with a TTL,
and the sorted set ``ongrid:fleet`` indexes the members, scored with the moment (Redis server
time) their report expires, as :mod:`workers.consumers` does for queues. A
:class:`FleetReporter` thread renews the report every :data:`REPORT_EVERY` seconds, and at once
when the worker's registry moves to another version; a clean shutdown withdraws it, a dead
worker's drops out after :data:`REPORT_TTL`.

:func:`assess_fleet` compares the reports with the API's own registry: a worker behind the
cluster version *lags*, a worker at the API's version with another persona set *differs*
(naming the personas), workers that disagree among themselves are flagged too.

Digests leave paths out: the per-persona digest covers the persona's source and its file text
(:func:`registry.parser.dump_persona`, which never holds the path), and
:attr:`~registry.agent_registry.Snapshot.digest` adds only the installed plugins' names,
content hashes and grants and the configured MCP servers (``mcp_servers`` of the settings), so
two hosts with the same files in different directories agree.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, cast

import redis
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from registry.agent_registry import Snapshot
from registry.parser import dump_persona
from registry.persona import Persona
from workers.presence import RENEW_FRACTION, live_members, renew_member, server_now
from workers.reload import RegistryFollower

__all__ = [
    "FLEET_KEY",
    "fleet_key",
    "REPORT_EVERY",
    "REPORT_TTL",
    "ApiRegistry",
    "FleetAssessment",
    "FleetReport",
    "FleetReporter",
    "Status",
    "WorkerAssessment",
    "assess_fleet",
    "loaded_registry",
    "model_choices",
    "model_view",
    "persona_differences",
    "persona_digest",
    "persona_digests",
    "read_fleet",
    "read_fleet_at",
    "runtime_report",
    "runtime_version",
]

log = logging.getLogger(__name__)

#: The index of the reporting members (score: when their report expires, server time), after
#: the stack's key prefix (``Settings.key_prefix``).
FLEET_KEY = "fleet"
#: Seconds a report lasts without renewal (a worker's: ``Settings.presence_ttl_seconds``): a
#: dead worker leaves the fleet after at most this.
REPORT_TTL = 10.0
#: Seconds between renewals: a report survives four missed ones.
REPORT_EVERY = REPORT_TTL * RENEW_FRACTION
#: Seconds between looks at the registry version (an attribute read, no Redis call), so a
#: reload is reported well before the next renewal.
WATCH_EVERY = 0.25

Status = Literal["ok", "lagging", "differs"]


def fleet_key(prefix: str = "ongrid:") -> str:
    return f"{prefix}{FLEET_KEY}"


def report_key(member: str, prefix: str = "ongrid:") -> str:
    return f"{fleet_key(prefix)}:{member}"


# -- digests -----------------------------------------------------------------------------------


def persona_digest(persona: Persona) -> str:
    """A short digest of ``persona``'s source and file text; its path is not part of it."""
    source = persona.source.value if persona.source is not None else ""
    text = f"{source}\0{dump_persona(persona)}"
    return hashlib.sha256(text.encode()).hexdigest()[:12]


# The last snapshot digested and its map: a snapshot never changes, and the reporter and the
# readiness probe ask about the same one many times between reloads.
_digested: tuple[Snapshot, dict[str, str]] | None = None


def persona_digests(snapshot: Snapshot) -> dict[str, str]:
    """``{name: persona_digest}`` of every persona of ``snapshot``."""
    global _digested
    last = _digested
    if last is not None and last[0] is snapshot:
        return dict(last[1])
    found = {name: persona_digest(snapshot.personas[name]) for name in snapshot.names()}
    _digested = (snapshot, found)
    return dict(found)


def persona_differences(expected: Mapping[str, str], found: Mapping[str, str]) -> str:
    """How ``found`` differs from ``expected``: ``missing: a, b; extra: c; changed: d``
    (empty when they agree)."""
    missing = sorted(set(expected) - set(found))
    extra = sorted(set(found) - set(expected))
    changed = sorted(n for n in set(expected) & set(found) if expected[n] != found[n])
    parts = [
        f"{label}: {', '.join(names)}"
        for label, names in (("missing", missing), ("extra", extra), ("changed", changed))
        if names
    ]
    return "; ".join(parts)


def loaded_registry(follower: RegistryFollower) -> tuple[int, Snapshot]:
    """The cluster version ``follower``'s registry is loaded at and its snapshot, read so that
    a version never comes with an older snapshot (a reload swaps the snapshot, then records the
    version)."""
    for _ in range(5):
        before = follower.registry.snapshot()
        version = follower.seen
        if follower.registry.snapshot() is before:
            return version, before
    return follower.seen, follower.registry.snapshot()


# -- the report --------------------------------------------------------------------------------


class FleetReport(BaseModel):
    """One worker process's registry, as it reported it."""

    model_config = ConfigDict(frozen=True)

    member: str = Field(description="The worker process, as `<celery hostname> pid <pid>`.")
    host: str = Field(description="The host name of the machine it runs on.")
    pid: int
    queues: list[str] = Field(description="The queues it consumes.")
    registry_version: int = Field(description="The cluster version its registry is loaded at.")
    persona_digest: str = Field(description="Digest of its whole persona set (and plugins).")
    personas: dict[str, str] = Field(description="A short digest of each persona, by name.")
    started_at: float = Field(
        default=0.0, description="When it first reported (Redis server time, Unix seconds)."
    )
    reported_at: float = Field(
        default=0.0, description="When it last reported (Redis server time, Unix seconds)."
    )
    models: dict[str, str] = Field(
        default_factory=dict, description="The model each persona runs on here, by name."
    )
    model_problems: dict[str, str] = Field(
        default_factory=dict,
        description="Why a persona's model cannot be used here (what to set), by name.",
    )


def model_choices(snapshot: Snapshot) -> tuple[dict[str, str], dict[str, str]]:
    """The model each persona of ``snapshot`` runs on in this worker process, and the problem
    of each one whose model cannot be used here (logged once as a warning)."""
    from workers.runtime import worker_runtime

    runtime = worker_runtime()
    models, problems = {}, {}
    for name in snapshot.names():
        choice = runtime.model_choice(snapshot.personas[name])
        models[name] = choice.model_id
        if choice.problem:
            problems[name] = choice.problem
            if _warned.get(name) != choice.problem:
                log.warning("agent %r: %s", name, choice.problem)
    _warned.clear()
    _warned.update(problems)
    return models, problems


#: The model problems last logged, by persona: each is logged when it appears, not every report.
_warned: dict[str, str] = {}


def runtime_report(member: str, queues: Callable[[], Iterable[str]]) -> Callable[[], FleetReport]:
    """What :class:`FleetReporter` sends for this worker process: read from the process's
    runtime (:func:`workers.runtime.worker_runtime`) at each call."""
    from workers.runtime import worker_runtime

    host, pid = socket.gethostname(), os.getpid()

    def report() -> FleetReport:
        version, snapshot = loaded_registry(worker_runtime().follower)
        models, problems = model_choices(snapshot)
        return FleetReport(
            member=member,
            host=host,
            pid=pid,
            queues=sorted(queues()),
            registry_version=version,
            persona_digest=snapshot.digest,
            personas=persona_digests(snapshot),
            models=models,
            model_problems=problems,
        )

    return report


def runtime_version() -> int | None:
    """The registry version of this process's runtime (``None`` once it is gone): what the
    reporter watches to report a reload at once."""
    from workers.runtime import worker_runtime

    try:
        return worker_runtime().follower.seen
    except RuntimeError:
        return None


class FleetReporter:
    """Keeps ``report()`` in Redis for ``member``: renewed every ``every`` seconds by one
    daemon thread, and as soon as ``watch()`` returns something new (the registry version).

    ``report()`` leaves ``started_at`` and ``reported_at`` to the reporter, which stamps them in
    Redis server time. A Redis error is logged and the report tried again the next period.
    """

    def __init__(
        self,
        client: redis.Redis,
        member: str,
        report: Callable[[], FleetReport],
        every: float = REPORT_EVERY,
        ttl: float = REPORT_TTL,
        *,
        watch: Callable[[], Hashable] | None = None,
        watch_every: float = WATCH_EVERY,
        prefix: str = "ongrid:",
    ) -> None:
        self.client = client
        self.prefix = prefix
        self.member = member
        self._report, self._every, self._ttl = report, every, ttl
        self._watch = watch
        self._tick = min(watch_every, every) if watch is not None else every
        self._started: float | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Report now (a worker that says it is ready is in the fleet), then keep renewing."""
        try:
            self.report_now()
        except redis.RedisError as exc:
            log.warning("could not report this worker to the fleet (retrying): %s", exc)
        except Exception:  # noqa: BLE001 - the fleet view must never stop a worker
            log.exception("could not build this worker's fleet report (retrying)")
        self._thread = threading.Thread(target=self._run, name="fleet-reporter", daemon=True)
        self._thread.start()

    def report_now(self) -> FleetReport | None:
        """Build the report and write it; ``None`` once stopped. Raises Redis errors."""
        with self._lock:
            if self._stop.is_set():
                return None
            report = self._report()
            now = server_now(self.client.time())
            if self._started is None:
                self._started = now
            stamped = report.model_copy(update={"started_at": self._started, "reported_at": now})
            pipe = self.client.pipeline(transaction=False)
            pipe.set(
                report_key(self.member, self.prefix),
                stamped.model_dump_json(),
                px=int(self._ttl * 1000),
            )
            renew_member(pipe, fleet_key(self.prefix), self.member, now, self._ttl)
            pipe.execute()
            return stamped

    def _watched(self) -> Hashable:
        if self._watch is None:
            return None
        try:
            return self._watch()
        except Exception:  # noqa: BLE001 - a failed look is no change; the renewal still runs
            log.debug("could not read what the fleet reporter watches", exc_info=True)
            return None

    def _run(self) -> None:
        seen = self._watched()
        due = time.monotonic() + self._every
        while not self._stop.wait(self._tick):
            now_seen = self._watched()
            if now_seen == seen and time.monotonic() < due:
                continue
            seen, due = now_seen, time.monotonic() + self._every
            try:
                self.report_now()
            except redis.RedisError as exc:
                log.warning("could not renew this worker's fleet report: %s", exc)
            except Exception:  # noqa: BLE001 - the thread must outlive one bad report
                log.exception("could not build this worker's fleet report")

    def stop(self) -> None:
        """Stop renewing and withdraw the report: the fleet no longer lists this worker."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._every + 5)
        with self._lock:
            pipe = self.client.pipeline(transaction=False)
            pipe.delete(report_key(self.member, self.prefix))
            pipe.zrem(fleet_key(self.prefix), self.member)
            try:
                pipe.execute()
            except redis.RedisError as exc:
                log.warning("could not withdraw the fleet report (it expires anyway): %s", exc)


def read_fleet_at(client: redis.Redis, prefix: str = "ongrid:") -> tuple[float, list[FleetReport]]:
    """Redis server time and the live members' reports, by member (two round trips)."""
    pipe = client.pipeline(transaction=False)
    pipe.time()
    pipe.zrange(fleet_key(prefix), 0, -1, withscores=True)
    time_reply, indexed = pipe.execute()
    now = server_now(time_reply)
    members = live_members(indexed, now)
    if not members:
        return now, []
    raws = cast(list[bytes | None], client.mget([report_key(m, prefix) for m in members]))
    reports = []
    for member, raw in zip(members, raws, strict=True):
        if raw is None:  # expired between the two calls
            continue
        try:
            reports.append(FleetReport.model_validate_json(raw))
        except ValidationError as exc:
            log.warning("the fleet report of %s is unreadable: %s", member, exc)
    return now, reports


def read_fleet(client: redis.Redis, prefix: str = "ongrid:") -> list[FleetReport]:
    """The reports of the live members, by member."""
    return read_fleet_at(client, prefix)[1]


@dataclass(frozen=True)
class ModelView:
    """A persona's model as the workers report it: ``model`` (the first report's), ``problem``
    (each distinct one, naming the worker when not all of them report it), and how many of the
    workers reported the persona at all (0: nobody has checked it)."""

    model: str = ""
    problem: str = ""
    checked_by: int = 0


def model_view(reports: Sequence[FleetReport], name: str) -> ModelView:
    """What ``reports`` say of persona ``name``'s model."""
    having = [r for r in reports if name in r.models]
    if not having:
        return ModelView()
    problems: dict[str, list[str]] = defaultdict(list)
    for report in having:
        if problem := report.model_problems.get(name, ""):
            problems[problem].append(report.member)
    shown = [
        problem if len(members) == len(having) else f"on {', '.join(members)}: {problem}"
        for problem, members in problems.items()
    ]
    return ModelView(having[0].models[name], "; ".join(shown), len(having))


# -- the assessment ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ApiRegistry:
    """The registry of the process that assesses the fleet (an API process)."""

    registry_version: int
    persona_digest: str
    personas: Mapping[str, str]


@dataclass(frozen=True)
class WorkerAssessment:
    """One worker's report, its status and the reasons for it."""

    report: FleetReport
    status: Status
    flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class FleetAssessment:
    """Every live worker assessed, and the assessing process's own registry."""

    cluster_version: int
    api: ApiRegistry
    workers: tuple[WorkerAssessment, ...]
    #: What is wrong with the assessing process's own registry (it lags the cluster or a worker).
    api_flags: tuple[str, ...] = ()

    @property
    def consistent(self) -> bool:
        return not self.api_flags and all(w.status == "ok" for w in self.workers)

    @property
    def flagged(self) -> dict[str, list[str]]:
        """``{member: flags}`` of the workers that are not ``ok``."""
        return {w.report.member: list(w.flags) for w in self.workers if w.flags}


@dataclass
class _Findings:
    """What :func:`assess_fleet` found, by member."""

    lagging: dict[str, str] = field(default_factory=dict)
    differs: defaultdict[str, list[str]] = field(default_factory=lambda: defaultdict(list))


def _ago(now: float, report: FleetReport) -> str:
    return f"{max(0.0, now - report.reported_at):.1f} s ago"


def _against_api(api: ApiRegistry, report: FleetReport) -> str:
    differences = persona_differences(api.personas, report.personas)
    if differences:
        return f"personas differ from the API's at version {api.registry_version}: {differences}"
    return (
        f"same personas as the API at version {api.registry_version}, but its installed "
        "plugins or configured MCP servers differ"
    )


def _against_peer(reference: FleetReport, report: FleetReport) -> str:
    differences = persona_differences(reference.personas, report.personas) or (
        "same personas, other installed plugins or configured MCP servers"
    )
    return (
        f"differs from worker {reference.member} at version {report.registry_version}: "
        f"{differences}"
    )


def _peer_flags(api: ApiRegistry, group: Sequence[FleetReport], found: _Findings) -> None:
    """Flag the workers of one version that disagree among themselves, when the API cannot
    settle it (it is at another version, or agrees with none of them): against the persona set
    most of them hold, or against each other when no set has a majority."""
    counts = Counter(r.persona_digest for r in group)
    if len(counts) < 2:
        return
    version = group[0].registry_version
    if api.registry_version == version and api.persona_digest in counts:
        return  # each one that differs is flagged against the API already
    (top, top_count), (_, second_count) = counts.most_common(2)
    reference = top if top_count > second_count else None
    for report in group:
        if report.persona_digest == reference:
            continue
        other = next(
            r
            for r in group
            if r.persona_digest != report.persona_digest
            and (reference is None or r.persona_digest == reference)
        )
        found.differs[report.member].append(_against_peer(other, report))


def assess_fleet(
    cluster_version: int, api: ApiRegistry, reports: Iterable[FleetReport], now: float
) -> FleetAssessment:
    """Compare each worker's report with the cluster version, the API's registry and the other
    workers; ``now`` is Redis server time (the reports' clock)."""
    ordered = sorted(reports, key=lambda r: r.member)
    found = _Findings()
    groups: dict[int, list[FleetReport]] = defaultdict(list)
    for report in ordered:
        groups[report.registry_version].append(report)
        if report.registry_version < cluster_version:
            found.lagging[report.member] = (
                f"registry at version {report.registry_version}, cluster at {cluster_version} "
                f"(reported {_ago(now, report)})"
            )
        elif (
            report.registry_version == api.registry_version
            and report.persona_digest != api.persona_digest
        ):
            found.differs[report.member].append(_against_api(api, report))
    for group in groups.values():
        _peer_flags(api, group, found)
    workers = tuple(_assessed(report, found) for report in ordered)
    return FleetAssessment(cluster_version, api, workers, _api_flags(cluster_version, api, ordered))


def _assessed(report: FleetReport, found: _Findings) -> WorkerAssessment:
    lagging = found.lagging.get(report.member)
    differs = found.differs.get(report.member, [])
    flags = ([lagging] if lagging else []) + differs
    status: Status = "lagging" if lagging else "differs" if differs else "ok"
    return WorkerAssessment(report, status, tuple(flags))


def _api_flags(
    cluster_version: int, api: ApiRegistry, reports: Sequence[FleetReport]
) -> tuple[str, ...]:
    flags = []
    if api.registry_version < cluster_version:
        flags.append(
            f"API registry at version {api.registry_version}, cluster at {cluster_version}"
        )
    ahead = [r for r in reports if r.registry_version > api.registry_version]
    if ahead:
        named = ", ".join(f"{r.member} (version {r.registry_version})" for r in ahead)
        flags.append(f"API registry at version {api.registry_version} is behind {named}")
    return tuple(flags)
