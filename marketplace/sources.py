"""Getting the files of a marketplace or a plugin from where they live: a folder or a git repo.

A folder is used in place. A git repository is cloned (``git clone --depth 1``) into a work
folder the caller owns and removes: a local one (a path holding ``.git``, a ``file://`` URL)
always, a remote one (https, ssh, GitHub's ``owner/repo``) only when the admin turned on network
sources (the ``plugins_allow_network`` setting). Git runs as an argv, never through a shell,
with a clean environment: no system or global config, ``HOME`` in the work folder, no hooks,
only the transports the source needs (``GIT_ALLOW_PROTOCOL``; ``ext::`` helpers, which run
commands, never), no terminal prompt (and, in a session of its own, no terminal for ssh to ask
on either). Every git call is bounded by the caller's timeout; on expiry its whole process group
is killed. Nothing cloned is run: the files are only read (:mod:`marketplace.formats`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from marketplace.formats import (
    Marketplace,
    PluginEntry,
    parse_source,
    read_file_bytes,
)
from marketplace.model import MAX_JSON_BYTES, BundleError

__all__ = [
    "NETWORK_SETTING",
    "ResolvedSource",
    "describe_source",
    "materialize_marketplace",
    "resolve_plugin_source",
]

#: The setting that lets marketplaces and plugins be cloned from remote repositories.
NETWORK_SETTING = "plugins_allow_network"
_NETWORK_OFF = f"network sources are off ({NETWORK_SETTING}: true to clone)"
#: Environment variables a remote clone may need (proxies, the ssh agent), passed through.
_REMOTE_ENV = ("SSH_AUTH_SOCK", "HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy")
_STDERR_TAIL = 600
_MARKETPLACE_JSON = Path(".claude-plugin") / "marketplace.json"
_GITHUB_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/(?!\.\.?$)[A-Za-z0-9_.-]+$")
_SCP_URL = re.compile(r"^[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:[^/\s-]\S*$")


class _GitFailed(Exception):
    """A git command that failed or ran out of time; the message is what to show."""


class _GitTimeout(_GitFailed):
    """The clone's deadline passed: no further git command is tried."""


@dataclass(frozen=True)
class _Repo:
    url: str
    local: bool


# -- classifying a source ------------------------------------------------------------------------


def _redact(url: str) -> str:
    """The URL without a password or token in its user part, for messages."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc or "://" not in url:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"***@{host}"))


def _is_remote(url: str) -> bool:
    return not (url.startswith("file://") or url.startswith("/"))


def _local_path(url: str) -> Path:
    if url.startswith("file://"):
        return Path(urllib.parse.unquote(urllib.parse.urlsplit(url).path))
    return Path(url)


def _is_git_repo(path: Path) -> bool:
    """A work tree (``.git`` folder or file) or a bare repository."""
    return os.path.lexists(path / ".git") or (
        (path / "HEAD").is_file() and (path / "objects").is_dir()
    )


def _marketplace_repo(src: str) -> _Repo | None:
    """The repository ``src`` names, or None when it is a local folder to use in place."""
    if src.startswith(("https://", "ssh://")):
        return _Repo(src, local=False)
    if src.startswith("file://"):
        return _Repo(src, local=True)
    if src.startswith(("http://", "git://")):
        raise BundleError(src, "unencrypted git transports are refused; use https")
    if "::" in src or "://" in src or src.startswith("-"):
        raise BundleError(src, "only https, ssh and file git URLs are accepted")
    path = Path(src)
    if not path.exists() and _SCP_URL.match(src):
        return _Repo(src, local=False)  # user@host:path, git's ssh shorthand
    if path.is_dir():
        if (path / _MARKETPLACE_JSON).exists():
            return None
        if _is_git_repo(path):
            return _Repo(path.resolve().as_uri(), local=True)
        raise BundleError(
            src,
            "is neither a marketplace folder (no .claude-plugin/marketplace.json) nor a git "
            "repository",
        )
    if not path.exists() and _GITHUB_REPO.match(src):
        return _Repo(f"https://github.com/{src.removesuffix('.git')}.git", local=False)
    raise BundleError(
        src,
        "not found: expected a marketplace folder, a git repository (a path, file://…, or with "
        "network sources on https://…, ssh://…, owner/repo)",
    )


# -- running git ---------------------------------------------------------------------------------


def _git_env(workdir: Path, local: bool) -> dict[str, str]:
    env = {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": str(workdir),
        "LC_ALL": "C",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_ALLOW_PROTOCOL": "file" if local else "https:ssh",
    }
    if not local:
        env.update({k: os.environ[k] for k in _REMOTE_ENV if k in os.environ})
    return env


def _git_options(local: bool) -> list[str]:
    options = ["-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false"]
    if local:
        options += ["-c", "protocol.file.allow=always"]
    return options


class _Git:
    """Runs the git commands of one clone against one deadline."""

    def __init__(self, repo: _Repo, workdir: Path, timeout: float) -> None:
        self.repo = repo
        self.env = _git_env(workdir, repo.local)
        self.options = _git_options(repo.local)
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout

    def expired(self) -> _GitTimeout:
        return _GitTimeout(
            f"git clone of {_redact(self.repo.url)} did not finish within {self.timeout:g}s"
        )

    def run(self, args: list[str], cwd: Path) -> str:
        """git's standard output; a failure is :class:`_GitFailed` with the tail of its stderr."""
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise self.expired()
        try:
            proc = subprocess.Popen(
                ["git", *self.options, *args],
                cwd=cwd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # its own group, so a timeout kills ssh and helpers too
            )
        except FileNotFoundError:
            raise _GitFailed("git is not installed (it is needed to clone git sources)") from None
        with proc:
            try:
                out, err = proc.communicate(timeout=remaining)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                # Every member of the group is dead, so the pipes close; bounded all the same.
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.communicate(timeout=5)
                raise self.expired() from None
        if proc.returncode != 0:
            tail = err.decode("utf-8", "replace").strip()[-_STDERR_TAIL:]
            raise _GitFailed(" / ".join(tail.splitlines()) or f"git {args[0]} failed")
        return out.decode("utf-8", "replace").strip()

    def clone(self, dest: Path, *, ref: str = "", sha: str = "") -> str:
        """Clone into ``dest`` (at ``ref``; then at commit ``sha`` if given); the commit SHA."""
        branch = ["--branch", ref] if ref else []
        self.run(
            ["clone", "--quiet", "--depth", "1", *branch, "--", self.repo.url, str(dest)],
            dest.parent,
        )
        head = self.run(["rev-parse", "HEAD"], dest)
        if sha and head != sha:
            try:  # fetch just that commit (protocol v2 serves any commit asked for)...
                self.run(["fetch", "--quiet", "--depth", "1", "origin", sha], dest)
            except _GitTimeout:
                raise
            except _GitFailed as exc:
                try:  # ...or, from a server that will not, the whole history
                    self.run(["fetch", "--quiet", "--unshallow", "origin"], dest)
                except _GitFailed:
                    raise exc from None
            try:
                self.run(["checkout", "--quiet", "--detach", sha], dest)
            except _GitFailed:
                where = f" at {ref}" if ref else ""
                raise _GitFailed(f"commit {sha} is not in the repository{where}") from None
            head = self.run(["rev-parse", "HEAD"], dest)
        return head


def _fresh_dir(workdir: Path, prefix: str) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=workdir))


# -- marketplaces --------------------------------------------------------------------------------


def materialize_marketplace(
    src: str, workdir: Path, *, allow_network: bool, timeout: float = 120
) -> tuple[Path, str, str]:
    """(folder to read, ``"directory"`` or ``"git"``, ref) for a marketplace source.

    A folder with ``.claude-plugin/marketplace.json`` is used in place; its ref is the SHA-256
    of that file (``sha256:…``). A git repository is cloned into a new folder under ``workdir``;
    its ref is the commit. Refused with the reason: a remote repository while network sources
    are off, a clone that fails or outlasts ``timeout`` (s), a clone with no marketplace.json.
    """
    text = src.strip()
    if not text:
        raise BundleError("marketplace", "no source given")
    repo = _marketplace_repo(text)
    if repo is None:
        path = Path(text).resolve()
        data = read_file_bytes(path / _MARKETPLACE_JSON, MAX_JSON_BYTES, "marketplace.json")
        return path, "directory", "sha256:" + hashlib.sha256(data).hexdigest()
    label = _redact(repo.url)
    if not repo.local and not allow_network:
        raise BundleError(label, f"a remote repository, and {_NETWORK_OFF}")
    if repo.local and not _local_path(repo.url).exists():
        raise BundleError(label, "no such local repository")
    dest = _fresh_dir(workdir, "marketplace-") / "repo"
    try:
        commit = _Git(repo, workdir, timeout).clone(dest)
    except _GitFailed as exc:
        shutil.rmtree(dest.parent, ignore_errors=True)
        raise BundleError(label, str(exc)) from None
    if not os.path.lexists(dest / _MARKETPLACE_JSON):
        shutil.rmtree(dest.parent, ignore_errors=True)
        raise BundleError(label, "cloned, but it holds no .claude-plugin/marketplace.json")
    return dest, "git", commit


# -- plugins -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResolvedSource:
    """Where a plugin's files are now, or why they cannot be had.

    ``ref`` is the commit of a cloned source, "" for a folder of the marketplace (the installer
    hashes its content).
    """

    path: Path | None
    ref: str = ""
    unreachable: str | None = None


def _within(base: str, real: str) -> bool:
    return real == base or real.startswith(base.rstrip(os.sep) + os.sep)


def resolve_plugin_source(
    market: Marketplace,
    entry: PluginEntry,
    workdir: Path,
    *,
    allow_network: bool,
    timeout: float = 120,
) -> ResolvedSource:
    """The folder holding ``entry``'s plugin: in the marketplace, or cloned under ``workdir``.

    A source that cannot be had (a remote one with network sources off, a failed clone, a
    missing folder or commit) is ``unreachable`` with the reason; one that escapes its base (a
    symlink out of the marketplace or the clone) is refused with a BundleError.
    """
    source = parse_source(entry.source, plugin_root=market.plugin_root)
    where = f"plugin {entry.name}"
    if source.kind == "path":
        base = os.path.realpath(market.root)
        real = os.path.realpath(os.path.join(base, source.path))
        if not _within(base, real):
            raise BundleError(
                where,
                f"source {describe_source(entry)} resolves to {real}, outside the marketplace",
            )
        if not os.path.isdir(real):
            return ResolvedSource(
                None, "", f"source {describe_source(entry)}: no such folder in the marketplace"
            )
        return ResolvedSource(Path(real))
    # A local path is cloned as file://, the transport that honours --depth (and copies,
    # instead of hard-linking, the objects of a repository Ongrid does not own).
    url = Path(source.url).as_uri() if source.url.startswith("/") else source.url
    repo = _Repo(url, local=not _is_remote(source.url))
    label = _redact(source.url)
    if not repo.local and not allow_network:
        return ResolvedSource(None, "", f"remote source {label}: {_NETWORK_OFF}")
    if repo.local and not _local_path(source.url).exists():
        return ResolvedSource(None, "", f"source {label}: no such local repository")
    dest = _fresh_dir(workdir, f"plugin-{entry.name}-") / "repo"
    try:
        commit = _Git(repo, workdir, timeout).clone(dest, ref=source.ref, sha=source.sha)
    except _GitFailed as exc:
        shutil.rmtree(dest.parent, ignore_errors=True)
        return ResolvedSource(None, "", f"source {describe_source(entry)}: {exc}")
    if not source.path:
        return ResolvedSource(dest, commit)
    base = os.path.realpath(dest)
    real = os.path.realpath(os.path.join(base, source.path))
    if not _within(base, real):
        shutil.rmtree(dest.parent, ignore_errors=True)
        raise BundleError(where, f"path {source.path} of {label} leaves the repository ({real})")
    if not os.path.isdir(real):
        shutil.rmtree(dest.parent, ignore_errors=True)
        return ResolvedSource(
            None, "", f"source {describe_source(entry)}: no folder {source.path} at {commit[:12]}"
        )
    return ResolvedSource(Path(real), commit)


def describe_source(entry: PluginEntry) -> str:
    """A short text for listings: ``./plugins/x``, ``git-subdir https://…#path@ref``."""
    raw: Any = entry.source
    try:
        source = parse_source(raw)
    except BundleError as exc:
        return f"invalid source ({exc.reason})"
    if source.kind == "path":
        return raw if isinstance(raw, str) else source.path
    text = f"{source.kind} {_redact(source.url)}"
    if source.path:
        text += f"#{source.path}"
    pin = source.ref or source.sha[:12]
    return f"{text}@{pin}" if pin else text
