"""Helpers of the marketplace tests: writing marketplaces and plugins, running ``ongrid plugins``.

The CLI runs as a process of its own (forked from the test process's zygote) in the cluster's
directory, with the workers' environment, so it reads the same database and writes the same
marketplace root as they do.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
import zygote
from harness import Cluster

REPO = Path(__file__).resolve().parents[2]
#: The real marketplace of the shared corpus, beside the checkout when it is there.
CORPUS_MARKETPLACE = (
    REPO.parent / "shared" / "corpus" / "marketplaces" / "anthropics__claude-plugins-official"
)


def ongrid(cluster: Cluster, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``ongrid ARGS`` in the cluster's directory; ``check``: fail showing its output."""
    done = zygote.run([sys.executable, "-m", "coordinator", *args], cluster.root, cluster.env, 180)
    if check and done.returncode != 0:
        raise AssertionError(f"ongrid {' '.join(args)} exited {done.returncode}:\n{done.stderr}")
    return done


def ongrid_json(cluster: Cluster, *args: str) -> Any:
    return json.loads(ongrid(cluster, *args, "--json").stdout)


def agent_file(directory: Path, name: str, body: str = "", **fields: Any) -> Path:
    """A Claude Code subagent file ``<directory>/<name>.md``."""
    directory.mkdir(parents=True, exist_ok=True)
    front = {"name": name, "description": f"Test agent {name}.", **fields}
    path = directory / f"{name}.md"
    path.write_text(f"---\n{yaml.safe_dump(front, sort_keys=False)}---\n\n{body or f'# {name}'}\n")
    return path


def skill_dir(plugin: Path, name: str, body: str, description: str = "") -> Path:
    folder = plugin / "skills" / name
    folder.mkdir(parents=True, exist_ok=True)
    front = {"name": name, "description": description or f"The {name} skill."}
    (folder / "SKILL.md").write_text(f"---\n{yaml.safe_dump(front)}---\n\n{body}\n")
    return folder


def marketplace(root: Path, name: str, plugins: list[dict[str, Any]]) -> Path:
    """``<root>/.claude-plugin/marketplace.json`` listing ``plugins``."""
    meta = root / ".claude-plugin"
    meta.mkdir(parents=True, exist_ok=True)
    data = {"name": name, "owner": {"name": "Test"}, "plugins": plugins}
    (meta / "marketplace.json").write_text(json.dumps(data, indent=2))
    return root


def plugin_manifest(plugin: Path, name: str, version: str = "1.0.0", **fields: Any) -> None:
    meta = plugin / ".claude-plugin"
    meta.mkdir(parents=True, exist_ok=True)
    data = {"name": name, "version": version, "description": f"The {name} plugin.", **fields}
    (meta / "plugin.json").write_text(json.dumps(data))


def marketplace_root(cluster: Cluster) -> Path:
    return cluster.root / "marketplace"


def installed_tree(cluster: Cluster) -> list[str]:
    """Every path under the marketplace root but the lock file (what an install leaves)."""
    root = marketplace_root(cluster)
    return sorted(
        str(p.relative_to(root)) for p in root.rglob("*") if p.name != ".lock" and p != root
    )
