"""A restart of the only worker (a deploy, an OOM kill, a node drain) throws nothing away.

The person waiting (``ongrid spawn``, run from a directory that is not the checkout) is told that
no worker consumes the queue, and how to start one; the spawn keeps its place, and the worker
that arrives half a minute later resumes it from its last checkpoint: the tool it had run is
not run again.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from harness import Cluster, call, final, wait_for

ONGRID = str(Path(sys.executable).with_name("ongrid"))
PROMPT = "Probe db1 and say whether it is healthy."
#: How long the queue goes without a worker: longer than the notice's grace (15 s).
DOWN_SECONDS = 30.0


def test_the_only_worker_killed_and_replaced_later_resumes_the_awaited_spawn(cluster: Cluster):
    cluster.persona("prober", tools=["count_probe"], max_turns=4)
    cluster.fake.script(
        [
            call("count_probe", {"target": "db1"}, turn=0),
            # The first worker parks on its second model call, and is killed there.
            final("too late", turn=1, times=1, delay=300),
            final("db1 probed once: healthy.", turn=1),
        ]
    )
    cluster.start_worker("only")
    waiter = subprocess.Popen(
        [ONGRID, "spawn", "prober", "--prompt", PROMPT],
        cwd=cluster.root,
        env=cluster.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        cluster.fake.wait_requests(PROMPT, 2)  # the tool has run; the next call is parked
        cluster.workers[0].kill()
        killed = time.monotonic()
        (spawn_id,) = cluster.client.store.active()
        record = cluster.client.store.get(spawn_id)
        assert record is not None
        session = record.session_id

        def told() -> bool:
            return any(e.type == "queue_waiting" for e in cluster.history(session))

        wait_for(
            told, DOWN_SECONDS * 2, "the waiting person to be told no worker consumes the queue"
        )
        time.sleep(max(0.0, DOWN_SECONDS - (time.monotonic() - killed)))
        cluster.start_worker("replacement")
        out, err = waiter.communicate(timeout=120)
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.communicate()

    assert waiter.returncode == 0, out + err
    assert "no worker consumes ongrid.interactive: start one with" in out
    assert "The spawn keeps its place and runs when a worker arrives" in out
    assert "■ prober: ok" in out and "db1 probed once: healthy." in out
    assert cluster.tool_runs() == ["count_probe"]  # done once, before the kill
    done = cluster.client.store.get(spawn_id)
    assert done is not None and (done.status, done.attempts) == ("ok", 2)
    notices = [e for e in cluster.history(session) if e.type == "queue_waiting"]
    assert notices[0].queue == "ongrid.interactive" and notices[0].fails_in_seconds
