"""A plugin's ``source`` as a marketplace entry writes it: a folder or a git repository.

Only the text is checked here (nothing is cloned or opened): a relative path must not leave its
base, a git URL must use a transport that runs no commands, a ref must be a branch or tag name
and a SHA a full commit id. :mod:`marketplace.sources` fetches what this names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from marketplace._files import _json_kind
from marketplace.model import BundleError

__all__ = ["PluginSource", "parse_source"]

#: GitHub's ``owner/repo`` (an owner never starts with a dot: ``./x`` is a path).
_GITHUB_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/(?!\.\.?$)[A-Za-z0-9_.-]+$")
_SCP_URL = re.compile(r"^[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:[^/\s-][^\s]*$")
_GIT_REF = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._/+-]*$")
_GIT_SHA = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _relative(value: Any, what: str) -> str:
    """A relative path that cannot leave its base, normalised (``./a/b/`` is ``a/b``; ``.``)."""
    if not isinstance(value, str) or not value.strip():
        raise BundleError(what, "must be a non-empty relative path (a string)")
    if _CONTROL.search(value) or "\\" in value:
        raise BundleError(what, f"{value[:80]!r}: control characters and backslashes are refused")
    if value.startswith(("/", "~")) or re.match(r"^[A-Za-z]:", value):
        raise BundleError(what, f"{value[:80]!r} is an absolute path; it must be relative (./…)")
    parts = [part for part in value.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise BundleError(what, f"{value[:80]!r}: '..' is refused, the path must stay inside")
    return "/".join(parts) or "."


def _git_url(value: Any, what: str) -> str:
    """A git URL Ongrid may clone: https, ssh (or ``user@host:path``), file, an absolute local
    path, or ``owner/repo`` (GitHub). Transport helpers (``ext::``) run commands: refused."""
    if not isinstance(value, str) or not value.strip():
        raise BundleError(what, "a git URL is required (a string)")
    url = value.strip()
    if len(url) > 2048 or _CONTROL.search(url) or " " in url or url.startswith("-"):
        raise BundleError(what, f"{url[:80]!r} is not a usable git URL")
    if url.startswith(("https://", "ssh://", "file://")):
        if url.startswith(("https://", "ssh://")) and not url.split("://", 1)[1].split("/")[0]:
            raise BundleError(what, f"{url[:80]!r} names no host")
        return url
    if url.startswith(("http://", "git://")):
        raise BundleError(what, f"{url[:80]!r}: unencrypted git transports are refused; use https")
    if "::" in url or "://" in url:
        raise BundleError(what, f"{url[:80]!r}: only https, ssh and file git URLs are accepted")
    if _SCP_URL.match(url) or url.startswith("/"):
        return url
    if _GITHUB_REPO.match(url) and ".." not in url:
        return f"https://github.com/{url.removesuffix('.git')}.git"
    raise BundleError(
        what, f"{url[:80]!r} is not a git URL (https://…, ssh://…, file://…, /path or owner/repo)"
    )


def _ref(value: Any, what: str) -> str:
    if value is None or value == "":
        return ""
    if not isinstance(value, str) or len(value) > 255 or not _GIT_REF.match(value):
        raise BundleError(what, f"{str(value)[:80]!r} is not a branch or tag name")
    if ".." in value or value.endswith((".lock", "/")):
        raise BundleError(what, f"{value[:80]!r} is not a branch or tag name")
    return value


def _sha(value: Any, what: str) -> str:
    if value is None or value == "":
        return ""
    if not isinstance(value, str) or not _GIT_SHA.match(value.lower()):
        raise BundleError(what, f"{str(value)[:80]!r} is not a full commit SHA (40 hex digits)")
    return value.lower()


@dataclass(frozen=True)
class PluginSource:
    """Where a plugin's files are: a folder of the marketplace or a git repository."""

    kind: Literal["path", "github", "url", "git-subdir"]
    #: For ``path``: relative to the marketplace root; for a repository: the subfolder (or "").
    path: str = ""
    #: The repository to clone (``github`` sources: ``https://github.com/<repo>.git``).
    url: str = ""
    ref: str = ""
    sha: str = ""


def parse_source(raw: Any, *, plugin_root: str = "") -> PluginSource:
    """Read an entry's ``source``; ``plugin_root`` is the marketplace's ``metadata.pluginRoot``,
    prepended to a relative source not written as ``./…`` (as Claude Code does)."""
    if isinstance(raw, str):
        path = _relative(raw, "source")
        if plugin_root and plugin_root != "." and not raw.startswith("./"):
            path = _relative(f"{plugin_root}/{path}", "source")
        return PluginSource("path", path=path)
    if not isinstance(raw, dict):
        raise BundleError("source", f"must be a relative path or an object, got {_json_kind(raw)}")
    kind = raw.get("source")
    ref, sha = _ref(raw.get("ref"), "source.ref"), _sha(raw.get("sha"), "source.sha")
    if kind == "github":
        repo = raw.get("repo")
        if not isinstance(repo, str) or not _GITHUB_REPO.match(repo) or ".." in repo:
            raise BundleError("source.repo", "a github source needs repo: owner/name")
        url = f"https://github.com/{repo.removesuffix('.git')}.git"
        return PluginSource("github", url=url, ref=ref, sha=sha)
    if kind in ("url", "git-subdir"):
        url = _git_url(raw.get("url"), "source.url")
        if kind == "git-subdir" and "path" not in raw:
            raise BundleError("source.path", "a git-subdir source needs path: the subfolder")
        # A url source with a path (four entries of the official marketplace) means a subfolder.
        path = _relative(raw["path"], "source.path") if "path" in raw else ""
        return PluginSource(kind, path=path, url=url, ref=ref, sha=sha)
    if kind == "npm":
        raise BundleError("source", "npm sources are not supported (Ongrid installs no packages)")
    raise BundleError(
        "source", f"unknown source kind {str(kind)[:40]!r}: expected github, url or git-subdir"
    )
