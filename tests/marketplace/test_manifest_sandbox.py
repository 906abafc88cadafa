"""A skill manifest's script in the worker's sandbox (bubblewrap): it sees its own folder,
read-only, and none of the worker's files or processes.

Skipped, saying why, where the kernel or the host refuses bubblewrap's namespaces."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from marketplace.manifest import load_manifest
from registry.tools import ToolContext
from workers.sandbox import Sandbox

SCRIPT = """#!/bin/sh
echo "arg=[$1] cwd=$(pwd) user=$(id -un) home=$HOME"
ls "$2" 2>&1 | head -3
echo secret > "$HOME/out" 2>&1 || echo "no write"
"""


def _tool(bundle: Path):
    scripts = bundle / "scripts"
    scripts.mkdir(parents=True)
    (scripts / "probe.sh").write_text(SCRIPT)
    (scripts / "probe.sh").chmod(0o755)
    for folder in (bundle, scripts):
        folder.chmod(0o755)
    manifest = {
        "tools": [
            {
                "name": "probe_skill",
                "description": "Shows where it runs.",
                "class": "read",
                "parameters": {
                    "type": "object",
                    "properties": {"text": {"type": "string"}, "look": {"type": "string"}},
                    "required": ["text", "look"],
                },
                "run": {"command": "scripts/probe.sh", "args": ["{text}", "{look}"]},
            }
        ]
    }
    (bundle / "ongrid-tools.yaml").write_text(json.dumps(manifest))
    (tool,) = load_manifest(bundle / "ongrid-tools.yaml", bundle)
    return tool


@pytest.fixture
def secret() -> Iterator[Path]:
    """A folder of "the worker's own" outside /tmp (the sandbox has its own /tmp anyway)."""
    folder = Path(tempfile.mkdtemp(prefix="ongrid-worker-data-", dir="/var/tmp"))
    (folder / "token").write_text("do not read")
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


def test_a_script_runs_confined_in_the_workers_sandbox(tmp_path: Path, secret: Path) -> None:
    sandbox = Sandbox(hide=[secret])
    why = sandbox.unavailable()
    if why is not None:
        pytest.skip(f"no sandbox on this host: {why}")
    tool = _tool(tmp_path / "bundle")

    arguments = tool.validate_arguments({"text": "a b; rm -rf /", "look": str(secret)})
    result = tool.run(arguments, ToolContext(sandbox=sandbox))

    assert not result.is_error, result.content
    assert "arg=[a b; rm -rf /] cwd=/tmp/bundle" in result.content
    if os.geteuid() == 0:  # root's worker drops to sandbox_user
        assert "user=nobody home=/tmp" in result.content
    assert (secret / "token").exists() and "token" not in result.content  # hidden: empty
    assert "no write" in result.content and "Read-only file system" in result.content


def test_without_a_sandbox_the_script_runs_plainly(tmp_path: Path) -> None:
    tool = _tool(tmp_path / "bundle")
    arguments = tool.validate_arguments({"text": "x", "look": "/"})
    result = tool.run(arguments, ToolContext())
    assert f"cwd={(tmp_path / 'bundle')}" in result.content, result.content


class _Unavailable:
    bundle_dir = "/tmp/bundle"

    def confine(self, argv, *, workdir):
        raise RuntimeError("no sandbox: bubblewrap is not installed on this host")


def test_an_unavailable_sandbox_runs_nothing_and_says_why(tmp_path: Path) -> None:
    tool = _tool(tmp_path / "bundle")
    arguments = tool.validate_arguments({"text": "x", "look": "/"})
    result = tool.run(arguments, ToolContext(sandbox=_Unavailable()))
    assert result.is_error
    assert "not run: no sandbox: bubblewrap is not installed" in result.content
