"""A worker retries a failing model call: rate limits and outages scripted on the fake LLM."""

from __future__ import annotations

import re

from harness import Cluster, final, text_of

#: Short waits between attempts, so the tests are quick; the counts are what they check.
QUICK = {"ONGRID_MODEL_RETRY_BASE_SECONDS": "0.01", "ONGRID_MODEL_RETRY_MAX_SECONDS": "0.05"}


def test_a_rate_limited_call_is_retried_until_answered(cluster: Cluster):
    cluster.persona("patient", tools=["count_probe"])
    cluster.fake.script(
        [{"times": 2, "fail": {"status": 429, "retry_after": 0}}, final("Recovered.")]
    )
    cluster.start_worker(env=QUICK)

    record = cluster.client.spawn("patient", "Are you there?")
    done = cluster.client.wait(record.spawn_id, timeout=60)

    assert done.status == "ok", done.error
    assert done.result == "Recovered."
    assert len(cluster.fake.requests()) == 3
    events = cluster.history(record.session_id)
    assert text_of(events) == "Recovered."  # the failed attempts streamed nothing
    assert events[-1].type == "task_notification" and events[-1].usage.model_calls == 1


def test_a_call_that_keeps_failing_fails_the_spawn_naming_each_attempt(cluster: Cluster):
    cluster.persona("doomed", tools=["count_probe"])
    cluster.fake.script(
        [
            {"times": 1, "fail": {"status": 503}},
            {"times": 1, "fail": {"drop": "reset"}},
            {"fail": {"status": 429, "retry_after": 0}},
        ]
    )
    cluster.start_worker(env={**QUICK, "ONGRID_MODEL_RETRIES": "3"})

    record = cluster.client.spawn("doomed", "Are you there?")
    done = cluster.client.wait(record.spawn_id, timeout=60)

    assert done.status == "failed"
    assert re.search(
        r"call failed after 4 attempts over \d+\.\d s: 503 service unavailable, "
        r"connection reset, 429 rate limited ×2; last error: ",
        done.error,
    ), done.error
    assert len(cluster.fake.requests()) == 4
    note = cluster.history(record.session_id)[-1]
    assert note.type == "task_notification"
    assert note.status == "failed" and note.message == done.error
