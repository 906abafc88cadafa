"""marketplace.sources: folders in place, real git repositories cloned (at a ref, a commit, a
subfolder), remote sources off without the setting, a clone that hangs killed at its timeout."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from marketplace.formats import PluginEntry, parse_source, read_marketplace, read_plugin
from marketplace.model import BundleError
from marketplace.sources import (
    describe_source,
    materialize_marketplace,
    resolve_plugin_source,
)

CORPUS = (
    Path(__file__).resolve().parents[3]
    / "shared"
    / "corpus"
    / "marketplaces"
    / "anthropics__claude-plugins-official"
)
NETWORK_OFF = "network sources are off (plugins_allow_network: true to clone)"


def git(cwd: Path, *args: str) -> str:
    """Run git for a fixture, isolated from the machine's configuration."""
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(cwd),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
    }
    ident = ["-c", "user.name=Fixture", "-c", "user.email=fixture@example.invalid"]
    done = subprocess.run(
        ["git", *ident, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def market_files(root: Path, plugins: list[dict[str, Any]], name: str = "team-tools") -> None:
    data = {"name": name, "owner": {"name": "Ops"}, "plugins": plugins}
    write(root / ".claude-plugin" / "marketplace.json", json.dumps(data))


def plugin_files(root: Path, version: str = "1") -> None:
    write(root / ".claude-plugin" / "plugin.json", json.dumps({"name": "p", "version": version}))
    write(root / "agents" / "triage.md", f"---\nname: triage\ndescription: v{version}\n---\n")


def commit_all(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository holding a marketplace and, under plugins/p, a plugin; two commits."""
    path = tmp_path / "repo"
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    market_files(path, [{"name": "p", "source": "./plugins/p"}])
    plugin_files(path / "plugins" / "p", "1")
    commit_all(path, "one")
    plugin_files(path / "plugins" / "p", "2")
    commit_all(path, "two")
    return path


def entry(source: Any, name: str = "p") -> PluginEntry:
    return PluginEntry(name=name, source=source, raw={"name": name, "source": source})


# -- marketplaces --------------------------------------------------------------------------------


def test_a_marketplace_folder_is_used_in_place_with_a_content_hash(tmp_path):
    market_files(tmp_path / "m", [])
    path, kind, ref = materialize_marketplace(
        str(tmp_path / "m"), tmp_path / "work", allow_network=False
    )
    data = (tmp_path / "m" / ".claude-plugin" / "marketplace.json").read_bytes()
    assert (path, kind, ref) == (
        (tmp_path / "m").resolve(),
        "directory",
        "sha256:" + hashlib.sha256(data).hexdigest(),
    )
    assert not (tmp_path / "work").exists()


@pytest.mark.parametrize("as_url", [False, True])
def test_a_local_git_repository_is_cloned_at_its_commit(tmp_path, repo, as_url):
    # the repository's .git folder (no marketplace.json in it), or its file:// URL
    src = repo.as_uri() if as_url else str(repo / ".git")
    path, kind, ref = materialize_marketplace(src, tmp_path / "work", allow_network=False)
    assert kind == "git"
    assert ref == git(repo, "rev-parse", "HEAD")
    assert path.is_relative_to(tmp_path / "work")
    assert read_marketplace(path).name == "team-tools"
    assert (path / "plugins" / "p" / "agents" / "triage.md").read_text().count("v2") == 1


@pytest.mark.parametrize(
    "src", ["https://github.com/acme/market.git", "git@github.com:acme/market.git", "acme/market"]
)
def test_a_remote_marketplace_needs_network_sources_on(tmp_path, src):
    with pytest.raises(BundleError) as err:
        materialize_marketplace(src, tmp_path / "work", allow_network=False)
    assert "plugins_allow_network: true" in str(err.value)
    assert not (tmp_path / "work").exists()


@pytest.mark.parametrize(
    ("src", "reason"),
    [
        ("http://example.invalid/m.git", "unencrypted"),
        ("ext::sh -c 'touch /tmp/x'", "only https, ssh and file"),
        ("", "no source given"),
    ],
)
def test_sources_that_are_not_accepted(tmp_path, src, reason):
    with pytest.raises(BundleError, match=reason):
        materialize_marketplace(src, tmp_path / "work", allow_network=True)


def test_a_folder_that_is_neither_and_a_path_that_is_not_there(tmp_path):
    (tmp_path / "plain").mkdir()
    with pytest.raises(BundleError, match="neither a marketplace folder"):
        materialize_marketplace(str(tmp_path / "plain"), tmp_path / "w", allow_network=False)
    with pytest.raises(BundleError, match="not found: expected a marketplace folder"):
        materialize_marketplace(str(tmp_path / "no" / "such"), tmp_path / "w", allow_network=False)


def test_a_cloned_repository_without_marketplace_json_is_refused_and_removed(tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    git(bare, "init", "-q", "-b", "main")
    write(bare / "README.md", "nothing here")
    commit_all(bare, "one")
    with pytest.raises(BundleError, match="holds no .claude-plugin/marketplace.json"):
        materialize_marketplace(bare.as_uri(), tmp_path / "work", allow_network=False)
    assert list((tmp_path / "work").iterdir()) == []


def test_a_clone_that_does_not_finish_is_killed_at_its_timeout(tmp_path, monkeypatch):
    # An ssh that never answers, first on PATH: git runs it for an ssh:// URL.
    fake = tmp_path / "bin"
    fake.mkdir()
    pid_file = tmp_path / "ssh.pid"
    (fake / "ssh").write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 600\n")
    (fake / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    with pytest.raises(BundleError) as err:
        materialize_marketplace(
            "ssh://git@example.invalid/m.git", tmp_path / "work", allow_network=True, timeout=2
        )
    assert err.value.reason == (
        "git clone of ssh://***@example.invalid/m.git did not finish within 2s"
    )
    pid = int(pid_file.read_text())
    assert not _alive(pid), "the hanging ssh was left running"
    assert list((tmp_path / "work").iterdir()) == []


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie not yet reaped by init counts as gone)."""
    for _ in range(200):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return False
        if state in ("Z", "X"):
            return False
        time.sleep(0.05)  # init reaps the orphan soon after the kill; poll, bounded
    return True


# -- plugin sources ------------------------------------------------------------------------------


def test_a_path_source_resolves_inside_the_marketplace(tmp_path):
    market_files(tmp_path / "m", [{"name": "p", "source": "./plugins/p"}])
    plugin_files(tmp_path / "m" / "plugins" / "p")
    market = read_marketplace(tmp_path / "m")
    resolved = resolve_plugin_source(market, market.plugins[0], tmp_path / "w", allow_network=False)
    assert resolved.path == (tmp_path / "m" / "plugins" / "p").resolve()
    assert (resolved.ref, resolved.unreachable) == ("", None)
    missing = resolve_plugin_source(
        market, entry("./plugins/q"), tmp_path / "w", allow_network=False
    )
    assert missing.path is None
    assert missing.unreachable == "source ./plugins/q: no such folder in the marketplace"


def test_a_path_source_symlinked_out_of_the_marketplace_is_refused(tmp_path):
    market_files(tmp_path / "m", [{"name": "p", "source": "./plugins/p"}])
    (tmp_path / "m" / "plugins").mkdir()
    (tmp_path / "m" / "plugins" / "p").symlink_to("/etc")
    market = read_marketplace(tmp_path / "m")
    with pytest.raises(BundleError, match="outside the marketplace"):
        resolve_plugin_source(market, market.plugins[0], tmp_path / "w", allow_network=False)


def test_a_traversal_source_never_reaches_resolution(tmp_path):
    market_files(tmp_path / "m", [{"name": "p", "source": "../../etc"}])
    market = read_marketplace(tmp_path / "m")
    assert market.plugins == ()
    with pytest.raises(BundleError, match="'..' is refused"):
        resolve_plugin_source(market, entry("../../etc"), tmp_path / "w", allow_network=False)


def test_a_url_source_on_a_local_repository_is_cloned(tmp_path, repo):
    market_files(tmp_path / "m", [])
    market = read_marketplace(tmp_path / "m")
    resolved = resolve_plugin_source(
        market, entry({"source": "url", "url": repo.as_uri()}), tmp_path / "w", allow_network=False
    )
    assert resolved.unreachable is None
    assert resolved.ref == git(repo, "rev-parse", "HEAD")
    assert resolved.path is not None and resolved.path.is_relative_to(tmp_path / "w")
    assert (resolved.path / "plugins" / "p" / ".claude-plugin" / "plugin.json").exists()


def test_a_git_subdir_source_at_a_pinned_commit(tmp_path, repo):
    first = git(repo, "rev-parse", "HEAD~1")
    market_files(tmp_path / "m", [])
    market = read_marketplace(tmp_path / "m")
    source = {"source": "git-subdir", "url": str(repo), "path": "plugins/p", "sha": first}
    resolved = resolve_plugin_source(market, entry(source), tmp_path / "w", allow_network=False)
    assert resolved.unreachable is None
    assert resolved.ref == first
    assert resolved.path is not None and resolved.path.name == "p"
    assert read_plugin(resolved.path).version == "1"
    # and at a branch, with the sha of its tip
    git(repo, "branch", "stable", first)
    source = {"source": "git-subdir", "url": str(repo), "path": "plugins/p", "ref": "stable"}
    resolved = resolve_plugin_source(market, entry(source), tmp_path / "w", allow_network=False)
    assert (resolved.ref, resolved.path and read_plugin(resolved.path).version) == (first, "1")


def test_a_missing_commit_subfolder_or_branch_is_unreachable(tmp_path, repo):
    market_files(tmp_path / "m", [])
    market = read_marketplace(tmp_path / "m")
    work = tmp_path / "w"
    sha = "0123456789" * 4
    cases = {
        "sha": {"source": "url", "url": repo.as_uri(), "sha": sha},
        "path": {"source": "git-subdir", "url": repo.as_uri(), "path": "plugins/none"},
        "ref": {"source": "url", "url": repo.as_uri(), "ref": "no-such-branch"},
        "repo": {"source": "url", "url": str(tmp_path / "nothing")},
        "notgit": {"source": "url", "url": str(tmp_path / "m")},
    }
    reasons = {
        key: resolve_plugin_source(market, entry(src), work, allow_network=False).unreachable
        for key, src in cases.items()
    }
    assert str(reasons["sha"]).endswith(f"commit {sha} is not in the repository")
    assert "no folder plugins/none at " in str(reasons["path"])
    assert "no-such-branch not found" in str(reasons["ref"])
    assert reasons["repo"] == f"source {tmp_path / 'nothing'}: no such local repository"
    assert "does not appear to be a git repository" in str(reasons["notgit"])
    assert list(work.iterdir()) == []  # failed clones leave nothing behind


def test_a_git_subdir_symlinked_out_of_the_clone_is_refused(tmp_path, repo):
    (repo / "plugins" / "out").symlink_to("/etc")
    commit_all(repo, "three")
    market_files(tmp_path / "m", [])
    market = read_marketplace(tmp_path / "m")
    source = {"source": "git-subdir", "url": repo.as_uri(), "path": "plugins/out"}
    with pytest.raises(BundleError, match="leaves the repository"):
        resolve_plugin_source(market, entry(source), tmp_path / "w", allow_network=False)
    assert list((tmp_path / "w").iterdir()) == []


def test_a_remote_plugin_source_with_network_off_is_unreachable(tmp_path):
    market_files(tmp_path / "m", [])
    market = read_marketplace(tmp_path / "m")
    source = {"source": "github", "repo": "acme/tools"}
    resolved = resolve_plugin_source(market, entry(source), tmp_path / "w", allow_network=False)
    assert resolved.path is None
    assert resolved.unreachable == f"remote source https://github.com/acme/tools.git: {NETWORK_OFF}"


def test_describe_source():
    sha = "ab" * 20
    assert describe_source(entry("./plugins/x")) == "./plugins/x"
    assert describe_source(entry({"source": "github", "repo": "o/r", "ref": "v2"})) == (
        "github https://github.com/o/r.git@v2"
    )
    assert describe_source(
        entry({"source": "git-subdir", "url": "https://h/m.git", "path": "p/x", "sha": sha})
    ) == ("git-subdir https://h/m.git#p/x@abababababab")
    assert describe_source(entry({"source": "url", "url": "https://u:tok@h/r.git"})) == (
        "url https://***@h/r.git"
    )
    assert describe_source(entry({"source": "npm"})).startswith("invalid source (npm")


@pytest.mark.skipif(not CORPUS.is_dir(), reason=f"corpus not found at {CORPUS}")
def test_the_official_marketplace_resolves_its_folders_and_lists_the_rest_unreachable(tmp_path):
    market = read_marketplace(CORPUS)
    reached, unreachable = 0, []
    for item in market.plugins:
        resolved = resolve_plugin_source(market, item, tmp_path / "w", allow_network=False)
        if resolved.path is not None:
            reached += 1
            assert parse_source(item.source).kind == "path"
        else:
            unreachable.append(resolved.unreachable)
    assert reached == 53
    assert len(unreachable) == 233
    assert all(str(reason).endswith(NETWORK_OFF) for reason in unreachable)
    assert not (tmp_path / "w").exists()
