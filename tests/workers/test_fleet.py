"""The fleet reports (:mod:`workers.fleet`): digests that leave paths out, the comparison of
workers with the API and with each other, and the reporter against a real Redis (database 7,
flushed around each test)."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis
import redis_server

from registry.agent_registry import AgentRegistry
from registry.persona import Persona, Source
from workers.fleet import (
    ApiRegistry,
    FleetReport,
    FleetReporter,
    assess_fleet,
    fleet_key,
    loaded_registry,
    persona_differences,
    persona_digest,
    persona_digests,
    read_fleet,
    read_fleet_at,
)
from workers.reload import RegistryFollower, broadcast_reload

REDIS_URL = redis_server.url(7)
T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.02)


def persona_file(folder: Path, name: str, body: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.md"
    path.write_text(
        f"---\nname: {name}\ndescription: Persona {name}.\nwhen_to_use: When {name}.\n---\n"
        f"{body or f'# {name}'}\n",
        encoding="utf-8",
    )
    return path


# -- digests -----------------------------------------------------------------------------------


def _persona(**fields: Any) -> Persona:
    values: dict[str, Any] = {"name": "disk_doctor", "description": "Disks.", "when_to_use": "X."}
    return Persona(**{**values, **fields})


def test_a_persona_digest_covers_source_and_text_but_not_the_path():
    base = _persona(body="# Disks\n", source=Source.DISK, path="/srv/a/disk_doctor.md")
    moved = base.model_copy(update={"path": "/opt/b/disk_doctor.md"})
    edited = base.model_copy(update={"body": "# Disks, v2\n"})
    from_user = base.model_copy(update={"source": Source.USER})

    assert persona_digest(moved) == persona_digest(base)
    assert persona_digest(edited) != persona_digest(base)
    assert persona_digest(from_user) != persona_digest(base)


def test_two_hosts_with_the_same_files_in_other_directories_agree(tmp_path: Path):
    for root in ("host-a/agents", "host-b/deep/er/agents"):
        persona_file(tmp_path / root, "reviewer", "# Review")
        persona_file(tmp_path / root, "triage", "# Triage")
    a = AgentRegistry([tmp_path / "host-a/agents"]).snapshot()
    b = AgentRegistry([tmp_path / "host-b/deep/er/agents"]).snapshot()

    assert a.personas["reviewer"].path != b.personas["reviewer"].path
    assert persona_digests(a) == persona_digests(b)
    assert set(persona_digests(a)) == {"reviewer", "triage"}
    assert a.digest == b.digest

    persona_file(tmp_path / "host-b/deep/er/agents", "triage", "# Triage, edited")
    edited = AgentRegistry([tmp_path / "host-b/deep/er/agents"]).snapshot()
    assert edited.digest != a.digest
    assert persona_differences(persona_digests(a), persona_digests(edited)) == "changed: triage"


def test_persona_differences_names_missing_extra_and_changed():
    expected = {"a": "1", "b": "2", "d": "4", "e": "5"}
    found = {"c": "3", "d": "x", "e": "5"}
    assert persona_differences(expected, found) == "missing: a, b; extra: c; changed: d"
    assert persona_differences(expected, dict(expected)) == ""
    assert persona_differences({}, {"z": "1"}) == "extra: z"


def test_loaded_registry_pairs_the_version_with_its_snapshot(tmp_path: Path):
    persona_file(tmp_path / "agents", "reviewer")
    registry = AgentRegistry([tmp_path / "agents"])
    client = redis.Redis.from_url(REDIS_URL)
    try:
        follower = RegistryFollower(client, registry, seen=3)
        assert loaded_registry(follower) == (3, registry.snapshot())
    finally:
        client.close()


# -- the comparison --------------------------------------------------------------------------


MAP = {"reviewer": "r1", "triage": "t1"}


def report(member: str, version: int = 5, personas: dict[str, str] | None = None, **kw: Any):
    personas = dict(MAP if personas is None else personas)
    digest = kw.pop("digest", "d-" + "-".join(f"{k}={v}" for k, v in sorted(personas.items())))
    return FleetReport(
        member=member,
        host="h",
        pid=1,
        queues=["ongrid.interactive"],
        registry_version=version,
        persona_digest=digest,
        personas=personas,
        started_at=90.0,
        reported_at=kw.pop("reported_at", 99.0),
        **kw,
    )


API = ApiRegistry(5, report("api").persona_digest, MAP)


def by_member(assessment: Any) -> dict[str, Any]:
    return {w.report.member: w for w in assessment.workers}


def test_workers_that_agree_with_the_api_are_ok():
    found = assess_fleet(5, API, [report("w2"), report("w1")], now=100.0)
    assert [w.report.member for w in found.workers] == ["w1", "w2"]
    assert all(w.status == "ok" and w.flags == () for w in found.workers)
    assert found.consistent and found.api_flags == () and found.flagged == {}


def test_a_worker_behind_the_cluster_lags_with_both_versions_and_its_age():
    found = assess_fleet(5, API, [report("old", version=3, reported_at=97.5)], now=100.0)
    (worker,) = found.workers
    assert worker.status == "lagging"
    assert worker.flags == ("registry at version 3, cluster at 5 (reported 2.5 s ago)",)
    assert not found.consistent


def test_a_worker_at_the_api_version_with_other_personas_differs_naming_them():
    theirs = {"reviewer": "r2", "extra_one": "e1"}
    found = assess_fleet(5, API, [report("ok"), report("odd", personas=theirs)], now=100.0)
    workers = by_member(found)
    assert workers["ok"].status == "ok"
    assert workers["odd"].status == "differs"
    assert workers["odd"].flags == (
        "personas differ from the API's at version 5: missing: triage; extra: extra_one; "
        "changed: reviewer",
    )
    assert found.flagged == {"odd": list(workers["odd"].flags)}


def test_same_personas_but_another_digest_is_named_as_plugins_or_mcp():
    found = assess_fleet(5, API, [report("w", digest="other-bundles")], now=100.0)
    (worker,) = found.workers
    assert worker.status == "differs"
    assert "same personas as the API at version 5" in worker.flags[0]
    assert "plugins or configured MCP servers differ" in worker.flags[0]


def test_a_worker_ahead_of_the_api_flags_the_api():
    lagging_api = ApiRegistry(4, API.persona_digest, MAP)
    found = assess_fleet(5, lagging_api, [report("new", version=5)], now=100.0)
    (worker,) = found.workers
    assert worker.status == "ok"  # judged against no one: it is where the cluster is
    assert found.api_flags == (
        "API registry at version 4, cluster at 5",
        "API registry at version 4 is behind new (version 5)",
    )
    assert not found.consistent


def test_workers_disagreeing_at_a_version_the_api_is_not_at_are_flagged_by_majority():
    lagging_api = ApiRegistry(4, "api-digest", {"reviewer": "old"})
    other = {"reviewer": "r1"}
    reports = [report("w1"), report("w2"), report("w3", personas=other)]
    workers = by_member(assess_fleet(5, lagging_api, reports, now=100.0))
    assert workers["w1"].status == workers["w2"].status == "ok"
    assert workers["w3"].status == "differs"
    assert workers["w3"].flags == ("differs from worker w1 at version 5: missing: triage",)


def test_workers_the_api_agrees_with_neither_are_flagged_against_each_other_too():
    a = {"reviewer": "r1", "triage": "t1", "a_only": "a"}
    b = {"reviewer": "r1", "triage": "t1", "b_only": "b"}
    workers = by_member(
        assess_fleet(5, API, [report("wa", personas=a), report("wb", personas=b)], 100.0)
    )
    assert workers["wa"].flags == (
        "personas differ from the API's at version 5: extra: a_only",
        "differs from worker wb at version 5: missing: b_only; extra: a_only",
    )
    assert workers["wb"].flags == (
        "personas differ from the API's at version 5: extra: b_only",
        "differs from worker wa at version 5: missing: a_only; extra: b_only",
    )


def test_when_some_worker_agrees_with_the_api_only_the_others_are_flagged():
    odd = {"reviewer": "r1"}
    workers = by_member(assess_fleet(5, API, [report("w1"), report("w2", personas=odd)], 100.0))
    assert workers["w1"].flags == ()
    assert workers["w2"].flags == ("personas differ from the API's at version 5: missing: triage",)


# -- the reporter against Redis ----------------------------------------------------------------


@pytest.fixture
def r() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.flushdb()
    except redis.ConnectionError as exc:
        pytest.fail(f"no Redis at {REDIS_URL}: {exc}")
    yield client
    client.flushdb()
    client.close()


class ScriptedReport:
    """What a reporter reports: a version a test moves, as a reload would."""

    def __init__(self, member: str) -> None:
        self.member = member
        self.version = 1
        self.calls = 0
        self.fail_next = False

    def report(self) -> FleetReport:
        self.calls += 1
        if self.fail_next:
            self.fail_next = False
            raise ValueError("the registry could not be read")
        return report(self.member, version=self.version).model_copy(
            update={"started_at": 0.0, "reported_at": 0.0}
        )


def test_the_reporter_publishes_in_server_time_and_withdraws_on_stop(r: redis.Redis):
    source = ScriptedReport("w1@host pid 1")
    reporter = FleetReporter(r, source.member, source.report, every=0.2, ttl=5.0)
    reporter.start()
    try:
        now, (found,) = read_fleet_at(r)
        assert found.member == source.member and found.registry_version == 1
        assert 0 < found.started_at <= found.reported_at <= now
        assert r.pttl(f"{fleet_key()}:{source.member}") > 0
        renewed = wait_for(
            lambda: (got := read_fleet(r)) and got[0].reported_at > found.reported_at and got[0],
            30,
            "a renewal",
        )
        assert renewed.started_at == found.started_at
    finally:
        reporter.stop()
    assert read_fleet(r) == []
    assert r.zscore(fleet_key(), source.member) is None
    assert reporter.report_now() is None  # stopped: nothing is written again
    assert read_fleet(r) == []


def test_a_changed_version_is_reported_before_the_next_renewal(r: redis.Redis):
    source = ScriptedReport("w1@host pid 1")
    reporter = FleetReporter(
        r, source.member, source.report, every=600.0, ttl=900.0, watch=lambda: source.version
    )
    reporter.start()
    try:
        assert read_fleet(r)[0].registry_version == 1
        source.version = 2  # a reload: the next look notices, long before 600 s
        wait_for(lambda: read_fleet(r)[0].registry_version == 2, 30, "the new version")
    finally:
        reporter.stop()


def test_a_dead_member_leaves_the_fleet_after_its_ttl(r: redis.Redis):
    alive, dead = ScriptedReport("alive pid 1"), ScriptedReport("dead pid 2")
    keeper = FleetReporter(r, alive.member, alive.report, every=0.2, ttl=5.0)
    keeper.start()
    try:
        # Reports once and never again, as a worker killed right after its report.
        FleetReporter(r, dead.member, dead.report, every=0.2, ttl=0.5).report_now()
        assert [f.member for f in read_fleet(r)] == ["alive pid 1", "dead pid 2"]
        wait_for(lambda: [f.member for f in read_fleet(r)] == ["alive pid 1"], 30, "expiry")
        # The next renewal of a live member sweeps the dead one out of the index too.
        wait_for(lambda: r.zscore(fleet_key(), dead.member) is None, 30, "the index swept")
    finally:
        keeper.stop()


def test_a_failed_report_is_logged_and_tried_again(
    r: redis.Redis, caplog: pytest.LogCaptureFixture
):
    source = ScriptedReport("w1@host pid 1")
    source.fail_next = True
    reporter = FleetReporter(r, source.member, source.report, every=0.1, ttl=5.0)
    with caplog.at_level(logging.ERROR, logger="workers.fleet"):
        reporter.start()  # the first report fails: the worker still starts
        try:
            wait_for(lambda: read_fleet(r), 30, "a report after the failure")
        finally:
            reporter.stop()
    assert "could not build this worker's fleet report" in caplog.text


def test_redis_down_is_logged_and_the_thread_keeps_trying(caplog: pytest.LogCaptureFixture):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dead = redis.Redis(port=port, socket_connect_timeout=0.2)
    source = ScriptedReport("w1@host pid 1")
    reporter = FleetReporter(dead, source.member, source.report, every=0.05, ttl=5.0)
    try:
        with caplog.at_level(logging.WARNING, logger="workers.fleet"):
            reporter.start()
            wait_for(lambda: source.calls >= 3, 30, "retries")
            reporter.stop()
    finally:
        dead.close()
    assert "could not report this worker to the fleet" in caplog.text
    assert "could not renew this worker's fleet report" in caplog.text
    assert "could not withdraw the fleet report" in caplog.text


def test_broadcast_versions_are_what_a_follower_reports(r: redis.Redis, tmp_path: Path):
    persona_file(tmp_path / "agents", "reviewer")
    registry = AgentRegistry([tmp_path / "agents"])
    follower = RegistryFollower(r, registry)
    assert loaded_registry(follower)[0] == 0
    version = broadcast_reload(r)
    assert follower.catch_up()
    seen, snapshot = loaded_registry(follower)
    assert (seen, snapshot) == (version, registry.snapshot())
