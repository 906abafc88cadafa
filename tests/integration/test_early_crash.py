"""A worker killed (SIGKILL) right after it took a spawn, before the spawn's first checkpoint: the
spawn resumes on another worker within about the lease, not after the broker's visibility timeout.

Two points of death: just after the claim, before the runtime prepared the spawn (the worker is
parked there by :mod:`faults`), and inside the first model call (held at the fake LLM).
"""

from __future__ import annotations

from collections import Counter

import pytest
from faults import release
from harness import Cluster, final, turn_of, wait_for

PROMPT = "Why does the uplink of sw3 flap?"
ANSWER = "The uplink of sw3 flaps because its optic reports low receive power."
#: The workers' lease here: short, so that a lost spawn is noticed quickly.
LEASE_SECONDS = 2.0
#: Liveness only (nothing may hang forever): a few leases plus a worker's start on a loaded box.
LIVENESS = 60.0


@pytest.mark.parametrize("where", ["after-the-claim", "in-the-first-model-call"])
def test_a_spawn_whose_worker_dies_before_its_first_checkpoint_resumes(
    cluster: Cluster, where: str
):
    stall_dir = cluster.root / "stalls"
    stall_dir.mkdir()
    env = {"ONGRID_LEASE_SECONDS": str(LEASE_SECONDS)}
    if where == "after-the-claim":
        env |= {"ONGRID_TOOL_MODULES": "site_tools,faults", "ONGRID_TEST_STALL_DIR": str(stall_dir)}
        cluster.fake.script([final(ANSWER)])
    else:
        cluster.fake.script([final(ANSWER, hold="first-call")])
    cluster.persona("prober")
    holder = cluster.start_worker("holder", env=env)

    record = cluster.client.spawn("prober", PROMPT)
    if where == "after-the-claim":
        marker = stall_dir / record.spawn_id
        pid = wait_for(lambda: marker.exists() and marker.read_text(), 60, "the claim")
        assert int(pid) == holder.pid
    else:
        cluster.fake.wait_requests(PROMPT, 1)
    taken = cluster.client.store.get(record.spawn_id)
    assert taken.status == "running" and taken.attempts == 1  # the claim shows at once
    survivor = cluster.start_worker("survivor", env=env)
    holder.kill()
    cluster.fake.script([final(ANSWER)])  # the resumed attempt's call answers at once
    release(cluster.fake, "first-call")  # the dead worker's held request goes nowhere

    done = cluster.wait_status(record.spawn_id, "ok", "failed", "cancelled", timeout=LIVENESS)

    assert done.status == "ok", done.error
    assert done.result == ANSWER
    assert (done.attempts, done.lost_attempts) == (2, 1)
    survivor.wait_log(f"'spawn_id': '{record.spawn_id}', 'persona': 'prober', 'status': 'ok'")
    turns = Counter(turn_of(r) for r in cluster.fake.requests_for(PROMPT))
    # Parked after the claim, the first attempt never reached the model; held in the call, it
    # did, and the unanswered call is made again.
    assert turns == ({0: 1} if where == "after-the-claim" else {0: 2})
    events = cluster.history(record.session_id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    kinds = Counter(e.type for e in events)
    assert (kinds["agent_tile"], kinds["task_notification"]) == (1, 1)
    assert events[-1].type == "task_notification" and events[-1].status == "ok"
