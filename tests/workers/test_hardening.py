"""What a worker or API process does to itself once its settings are built."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from workers.hardening import ProviderCredentials, is_secret, take_secrets

ROOT = Path(__file__).resolve().parents[2]


def test_secret_variables_leave_the_environment_and_keep_their_values() -> None:
    env = {
        "OPENAI_API_KEY": "sk-1",
        "AWS_SECRET_ACCESS_KEY": "aws-2",
        "AWS_ACCESS_KEY_ID": "AKIA3",
        "REDIS_URL": "redis://:pw@r:6379/0",
        "ONGRID_DATABASE_URL": "postgresql://u:pw@db/o",
        "CLICKHOUSE_PASSWORD": "ch-4",
        "ONGRID_TOKEN": "tok-5",
        "PATH": "/usr/bin",
        "OPENAI_API_BASE": "http://llm:8080/v1",
        "ONGRID_DEFAULT_MODEL": "openai/gpt-4o-mini",
    }
    taken = take_secrets(env)
    assert sorted(env) == ["ONGRID_DEFAULT_MODEL", "OPENAI_API_BASE", "PATH"]
    assert taken.for_provider("openai") == {"api_key": "sk-1"}
    assert taken.for_provider("bedrock") == {
        "aws_access_key_id": "AKIA3",
        "aws_secret_access_key": "aws-2",
    }
    assert taken.for_provider("anthropic") == {}
    assert "sk-1" not in repr(taken) and "OPENAI_API_KEY" in repr(taken)


def test_provider_key_names() -> None:
    creds = ProviderCredentials({"TOGETHERAI_API_KEY": "t", "ANTHROPIC_API_KEY": "a"})
    assert creds.for_provider("together_ai") == {"api_key": "t"}
    assert creds.for_provider("anthropic") == {"api_key": "a"}
    assert not is_secret("ONGRID_LEASE_SECONDS") and is_secret("GITHUB_TOKEN")


def test_a_hardened_process_is_not_dumpable_and_its_environment_is_clean() -> None:
    script = (
        "import ctypes, json, os\n"
        "from workers.hardening import harden_process\n"
        "creds = harden_process()\n"
        "libc = ctypes.CDLL(None)\n"
        "print(json.dumps({'dumpable': libc.prctl(3, 0, 0, 0, 0), 'env': sorted(os.environ),\n"
        "                  'kept': creds.names()}))\n"
    )
    env = {"PATH": os.environ["PATH"], "OPENAI_API_KEY": "sk-canary", "REDIS_URL": "redis://x"}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=ROOT,
        timeout=60, check=True,
    )  # fmt: skip
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["dumpable"] == 0
    assert "OPENAI_API_KEY" not in report["env"] and "REDIS_URL" not in report["env"]
    assert report["kept"] == ["OPENAI_API_KEY", "REDIS_URL"]


def test_skill_secrets_leave_the_environment_into_their_own_holder() -> None:
    env = {
        "ONGRID_SKILL_NODE_AGENT_TOKEN": "agent-1",
        "ONGRID_SKILL_NODE_URL": "http://node:9000",  # not secret-named: a skill secret still
        "OPENAI_API_KEY": "sk-1",
        "PATH": "/usr/bin",
    }
    taken = take_secrets(env)
    assert sorted(env) == ["PATH"]
    assert dict(taken.skill_secrets()) == {
        "ONGRID_SKILL_NODE_AGENT_TOKEN": "agent-1",
        "ONGRID_SKILL_NODE_URL": "http://node:9000",
    }
    assert taken.for_provider("openai") == {"api_key": "sk-1"}
    assert "agent-1" not in repr(taken) and is_secret("ONGRID_SKILL_X")
