"""Hostile personas against the CLI and the API, and the API's persona bodies derived from the
persona model.

- ``ongrid agents validate --json`` runs as a subprocess from a directory of its own.
- The API runs under uvicorn on a free port, on a Redis database claimed for this run (the
  integration suite's lock files) and a SQLite file; requests go over HTTP.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

from redis_server import claim_database  # noqa: E402

from coordinator.api import create_app  # noqa: E402
from coordinator.api.schemas import (  # noqa: E402
    RESPONSE_ONLY_FIELDS,
    AgentChange,
    AgentOut,
    PersonaIn,
    PersonaPatch,
)
from registry.parser import MAX_FRONTMATTER_DEPTH, MAX_FRONTMATTER_VALUES  # noqa: E402
from registry.persona import FILE_FIELDS, Persona  # noqa: E402
from registry.settings import Settings, TokenGrant, token_digest  # noqa: E402

TOKEN = "hostile-admin-token-000001"
#: Only so nothing hangs forever: a hostile file must not stall a command or a request.
LIVENESS = 60.0
ALIASES = "through YAML aliases (anchors and aliases used as a 'billion laughs')"
GOOD = "---\nname: good\ndescription: Fine.\nwhen_to_use: Always.\n---\n# Good\n"


def laughs_file() -> str:
    lines = ["metadata:", f"  l0: &l0 [{', '.join(['lol'] * 9)}]"]
    lines += [f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]
    return "---\nname: laughs\ndescription: Hostile.\nwhen_to_use: Never.\n" + (
        "\n".join(lines) + "\n---\nBody.\n"
    )


LAUGHS_REASON = (
    f"metadata: frontmatter expands to more than {MAX_FRONTMATTER_VALUES} values {ALIASES}"
)


@pytest.fixture
def agents(tmp_path: Path) -> Path:
    folder = tmp_path / "agents"
    folder.mkdir()
    (folder / "good.md").write_text(GOOD, encoding="utf-8")
    (folder / "laughs.md").write_text(laughs_file(), encoding="utf-8")
    return folder


# -- the CLI -----------------------------------------------------------------------------------


def test_validate_json_answers_with_the_warning_and_exit_1(agents: Path, tmp_path: Path):
    exe = shutil.which("ongrid", path=str(Path(sys.executable).parent))
    assert exe, "the ongrid console script is not installed next to this interpreter"
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    proc = subprocess.run(
        [exe, "agents", "validate", "--json", str(agents)],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        timeout=LIVENESS,
    )
    assert proc.returncode == 1, proc.stderr
    out = json.loads(proc.stdout)
    assert [a["name"] for a in out["agents"]] == ["good"]
    assert out["warnings"] == [{"path": str(agents / "laughs.md"), "reason": LAUGHS_REASON}]


# -- the API over HTTP -------------------------------------------------------------------------


class Api:
    """The app under uvicorn in a thread, on a free port."""

    def __init__(self, settings: Settings) -> None:
        self.app = create_app(settings)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        config = uvicorn.Config(self.app, log_config=None, access_log=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + LIVENESS
        while not self._server.started:
            assert time.monotonic() < deadline, "the API server did not start"
            time.sleep(0.05)
        self.client = httpx.Client(
            base_url=f"http://127.0.0.1:{sock.getsockname()[1]}",
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=LIVENESS,
        )

    def close(self) -> None:
        self.client.close()
        self._server.should_exit = True
        self._thread.join(timeout=15)
        self.app.state.services.close()


@pytest.fixture
def api(agents: Path, tmp_path: Path) -> Iterator[httpx.Client]:
    with claim_database() as url:
        store = redis.Redis.from_url(url)
        store.flushdb()
        settings = Settings(
            agents_dir=agents,
            marketplace_root=tmp_path / "marketplace",
            redis_url=url,
            database_url=f"sqlite:///{tmp_path / 'ongrid.db'}",
            data_dir=tmp_path / ".ongrid",
            token_grants={token_digest(TOKEN): TokenGrant(user="alice", role="admin")},
        )
        server = Api(settings)
        try:
            yield server.client
        finally:
            server.close()
            store.flushdb()
            store.close()


def _persona(**extra: Any) -> dict[str, Any]:
    return {"name": "custom", "description": "d", "when_to_use": "w", **extra}


def test_a_hostile_disk_file_is_a_warning_and_the_api_keeps_answering(
    api: httpx.Client, agents: Path
):
    warnings = api.get("/api/v1/agents/warnings")
    assert warnings.status_code == 200
    loads = [(w["path"], w["reason"]) for w in warnings.json() if w["kind"] == "load"]
    assert (str(agents / "laughs.md"), LAUGHS_REASON) in loads
    names = [a["name"] for a in api.get("/api/v1/agents").json()]
    assert "good" in names and "laughs" not in names
    reload = api.post("/api/v1/agents/reload")
    assert reload.status_code == 200, reload.text
    assert api.get("/api/v1/agents/good").json()["description"] == "Fine."


def _nested(levels: int) -> dict[str, Any]:
    root: dict[str, Any] = {}
    node = root
    for _ in range(levels):
        node["x"] = node = {}
    return root


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ({"hooks": list(range(MAX_FRONTMATTER_VALUES))}, "hooks: frontmatter holds more than"),
        (
            {"hooks": _nested(MAX_FRONTMATTER_DEPTH)},
            f"hooks: frontmatter nests deeper than {MAX_FRONTMATTER_DEPTH} levels",
        ),
        # Deeper than the recursion limit of a recursive walk: refused by the bound first.
        ({"hooks": _nested(900)}, "nests deeper than"),
        ({"tools": ["a"] * MAX_FRONTMATTER_VALUES}, "tools: frontmatter holds more than"),
    ],
    ids=["wide", "deep", "deeper", "tools"],
)
def test_create_and_patch_refuse_bodies_past_the_bounds_with_422(
    api: httpx.Client, extra: dict[str, Any], reason: str
):
    created = api.post("/v1/agents/custom", json=_persona(**extra))
    assert created.status_code == 422, created.text
    assert reason in created.json()["error"]["message"]
    assert api.get("/api/v1/agents/custom").status_code == 404  # nothing was stored

    assert api.post("/v1/agents/custom", json=_persona()).status_code == 201
    patched = api.patch("/v1/agents/custom/custom", json=extra)
    assert patched.status_code == 422, patched.text
    assert reason in patched.json()["error"]["message"]
    assert api.get("/api/v1/agents/custom").json()["tools"] == []  # unchanged


def test_a_long_system_prompt_is_not_frontmatter(api: httpx.Client):
    # The body is the system prompt, kept verbatim: the frontmatter's bounds do not apply to it.
    body = "Check the disks.\n" * 10_000
    created = api.post("/v1/agents/custom", json=_persona(body=body))
    assert created.status_code == 201, created.text
    assert api.get("/api/v1/agents/custom").json()["body"] == body


# -- the persona bodies follow the persona model -----------------------------------------------


def test_request_and_response_fields_are_the_personas():
    assert list(PersonaIn.model_fields) == [*FILE_FIELDS, "body"]
    assert list(PersonaPatch.model_fields) == [*FILE_FIELDS, "body"]
    assert list(AgentOut.model_fields) == [
        *Persona.model_fields, "available", "unavailable_reason", "shadows", "editable",
        "read_only_reason", "resolved_model", "model_problem", "model_checked_by",
    ]  # fmt: skip
    response_only = {
        "unknown_fields", "source", "path", "plugin", "available", "unavailable_reason",
        "shadows", "editable", "read_only_reason", "resolved_model", "model_problem",
        "model_checked_by", "notice", "registry_version", "findings",
    }  # fmt: skip
    assert response_only == RESPONSE_ONLY_FIELDS
    assert set(AgentChange.model_fields) - set(AgentOut.model_fields) == {
        "notice",
        "registry_version",
        "findings",
    }


def test_the_openapi_document_keeps_types_constraints_and_descriptions():
    schemas = {
        "in": PersonaIn.model_json_schema(),
        "patch": PersonaPatch.model_json_schema(),
        "out": AgentOut.model_json_schema(),
    }
    create = schemas["in"]["properties"]
    assert schemas["in"]["required"] == ["name", "description", "when_to_use"]
    assert create["name"]["pattern"] == r"^[a-z0-9]+(?:[_-][a-z0-9]+)*$"
    assert create["description"]["pattern"] == create["when_to_use"]["pattern"] == r"\S"
    assert create["max_turns"] == {
        "default": 15,
        "description": "0 means the default.",
        "minimum": 0,
        "title": "Max Turns",
        "type": "integer",
    }
    assert [t["type"] for t in create["tools"]["anyOf"]] == ["array", "string"]
    assert create["metadata"]["type"] == "object"
    assert create["permission_mode"]["default"] == "read-only"
    patch = schemas["patch"]["properties"]
    assert "required" not in schemas["patch"]
    assert patch["max_turns"]["anyOf"] == [{"minimum": 0, "type": "integer"}, {"type": "null"}]
    out = schemas["out"]["properties"]
    for name, info in Persona.model_fields.items():
        if info.description and name not in {"source", "path"}:
            assert out[name]["description"] == info.description, name
    assert out["metadata"]["type"] == "object"
    assert set(schemas["out"]["required"]) == set(out)  # every field, as before
