"""Schema-driven fuzzing: schemathesis against the app's own OpenAPI document.

Every non-streaming operation gets generated requests (valid and invalid) as an admin; no
response may be a 5xx, and every response must match the document (status code, content type,
body schema). The SSE endpoints (chat turns, the session event stream, the approval feed) are
left out: their responses are streams that end only when a turn does, or never.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hypothesis
import hypothesis.errors
import pytest
import redis
import redis_server
import schemathesis
from fastapi import FastAPI
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from coordinator.api import create_app
from registry.settings import Settings, TokenGrant, token_digest
from workers.celery_app import QUEUES
from workers.consumers import QueueAdvertiser

REDIS_URL = redis_server.url(11)
TOKEN = "fuzz-admin-token-00000001"
STREAMING = r"^/api/v1/(chat(/sessions/[^/]+/(messages|events))?|approvals/events)$"
#: Examples per operation and generation mode: bounded so the whole run takes well under 2 min.
EXAMPLES = 25
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FastAPI]:
    root: Path = tmp_path_factory.mktemp("fuzz")
    (root / "agents").mkdir()
    (root / "agents" / "disk_doctor.md").write_text(
        "---\nname: disk_doctor\ndescription: Disks.\nwhen_to_use: When a disk fills up.\n---\n"
        "# Disk doctor\n"
    )
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    settings = Settings(
        agents_dir=root / "agents",
        marketplace_root=root / "marketplace",
        redis_url=REDIS_URL,
        database_url=f"sqlite:///{root / 'ongrid.db'}",
        token_grants={token_digest(TOKEN): TokenGrant(user="fuzzer", role="admin")},
    )
    made = create_app(settings)
    # /readyz is ready only while every queue has a live consumer: advertise one, as a worker does.
    advertiser = QueueAdvertiser(client, "fuzz", QUEUES.values)
    advertiser.start()
    yield made
    advertiser.stop()
    made.state.services.close()
    client.flushdb()
    client.close()


def _fuzz(operation: Any, mode: schemathesis.GenerationMode) -> None:
    strategy = operation.as_strategy(mode, headers={"Authorization": f"Bearer {TOKEN}"})

    @hypothesis.given(case=strategy)
    @hypothesis.settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=list(hypothesis.HealthCheck),
        database=None,
        phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
    )
    def run(case: schemathesis.Case) -> None:
        case.call_and_validate(checks=CHECKS)

    run()


# One test over every operation, rather than schemathesis' own pytest parametrisation: that
# needs the app at import time, or a lazy fixture that pytest 9 no longer supports.
@pytest.mark.parametrize("mode", list(schemathesis.GenerationMode), ids=str)
def test_no_server_error_and_every_response_matches_the_schema(
    app: FastAPI, mode: schemathesis.GenerationMode
) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", app).exclude(path_regex=STREAMING)
    operations = [result.ok() for result in schema.get_all_operations()]
    documented = [
        (method, path)
        for path, item in app.openapi()["paths"].items()
        for method in item
        if not re.match(STREAMING, path)
    ]
    assert len(operations) == len(documented) >= 15
    failures = []
    for operation in operations:
        try:
            _fuzz(operation, mode)
        except hypothesis.errors.Unsatisfiable:
            # Negative mode: nothing in the operation can be made invalid (e.g. only string
            # path parameters, and the header is fixed). Nothing to test there.
            assert mode is schemathesis.GenerationMode.NEGATIVE, operation.label
        except Exception as exc:  # noqa: BLE001 - collect every operation's failure, then report
            failures.append(f"{operation.label}: {exc}")
    assert not failures, "\n\n".join(failures)
