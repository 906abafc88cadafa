"""Reading a bundle's files safely: bounded, regular files only, never outside the bundle.

A bundle comes from anyone, so every read here assumes hostility: a file is read only if it is
a regular file (a FIFO would block a reader forever) and no larger than its limit, every path
must stay inside its root once symlinks are resolved, and a whole tree is checked from ``stat``
alone before anything copies it. Every refusal is a :class:`BundleError` naming where and why.
The words for a JSON value's kind live here too: the readers' messages all use them.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path, PurePosixPath
from typing import Any

from marketplace.model import (
    MAX_BUNDLE_BYTES,
    MAX_BUNDLE_FILES,
    MAX_FILE_BYTES,
    MAX_JSON_BYTES,
    BundleError,
)

__all__ = ["check_tree", "read_file_bytes", "read_json_file"]

_JSON_KINDS = {list: "an array", str: "a string", int: "a number", float: "a number"}


# -- bounded reading -----------------------------------------------------------------------------


def read_file_bytes(path: Path, limit: int, what: str) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes; anything else is a BundleError.

    Opened non-blocking, then checked with ``fstat``: a FIFO opens at once instead of waiting for
    a writer, and is refused like a device or a folder; the size comes from the inode, so a huge
    (even sparse) file is refused without reading it.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise BundleError(str(path), f"{what} not found") from None
    except OSError as exc:
        raise BundleError(str(path), f"cannot read {what}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise BundleError(str(path), f"{what} is {_kind(info.st_mode)}, not a regular file")
        if info.st_size > limit:
            raise BundleError(str(path), f"{what} is {_size(info.st_size)}; at most {_size(limit)}")
        data = handle.read(limit + 1)  # never more, whatever the size said
    if len(data) > limit:
        raise BundleError(str(path), f"{what} is larger than {_size(limit)}")
    return data


def read_json_file(path: Path, what: str) -> dict[str, Any]:
    """A JSON object from a file of at most MAX_JSON_BYTES; the error names the line and column."""
    data = read_file_bytes(path, MAX_JSON_BYTES, what)
    try:
        value = json.loads(data.decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise BundleError(str(path), f"{what} is not UTF-8 text (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise BundleError(
            str(path), f"{what} is not valid JSON: line {exc.lineno}, column {exc.colno}: {exc.msg}"
        ) from None
    except RecursionError:
        raise BundleError(str(path), f"{what} nests arrays or objects too deeply") from None
    except ValueError as exc:  # an integer too long to convert
        raise BundleError(str(path), f"{what} holds a value that cannot be read: {exc}") from None
    if not isinstance(value, dict):
        raise BundleError(str(path), f"{what} must be a JSON object, got {_json_kind(value)}")
    return value


# -- a tree of files -----------------------------------------------------------------------------


def check_tree(
    root: Path,
    *,
    max_file: int = MAX_FILE_BYTES,
    max_total: int = MAX_BUNDLE_BYTES,
    max_files: int = MAX_BUNDLE_FILES,
) -> list[Path]:
    """The regular files under ``root`` (relative paths, sorted), or a BundleError naming the
    first one that may not be copied.

    Refused: a symlink whose target is outside ``root`` (or missing, or a loop), a FIFO, socket
    or device, a file over ``max_file``, more than ``max_files`` files and folders, more than
    ``max_total`` bytes. Sizes come from ``stat``: nothing is read. Symlinks that stay inside are
    listed under their own path (the copier copies their target's content); ``.git`` is skipped.
    """
    base = _real_dir(root, "bundle")
    files: list[Path] = []
    seen = total = 0
    stack: list[tuple[str, PurePosixPath, tuple[str, ...]]] = [(base, PurePosixPath(), (base,))]
    while stack:
        folder, rel_folder, chain = stack.pop()
        try:
            with os.scandir(folder) as listing:
                entries = sorted(listing, key=lambda e: e.name)
        except OSError as exc:
            raise BundleError(str(rel_folder), f"cannot list the folder: {exc.strerror}") from None
        for item in entries:
            if item.name == ".git":
                continue
            rel = rel_folder / item.name
            seen += 1
            if seen > max_files:
                raise BundleError(
                    str(rel), f"the bundle has more than {max_files} files and folders"
                )
            try:
                info = item.stat(follow_symlinks=False)
            except OSError as exc:  # removed or replaced while being walked
                raise BundleError(str(rel), f"cannot read: {exc.strerror}") from None
            real = item.path
            if stat.S_ISLNK(info.st_mode):
                real, info = _link_target(base, item.path, str(rel))
                if stat.S_ISDIR(info.st_mode) and real in chain:
                    raise BundleError(str(rel), "a symlink that loops back to a folder above it")
            if stat.S_ISDIR(info.st_mode):
                stack.append((real, rel, (*chain, real)))
            elif stat.S_ISREG(info.st_mode):
                if info.st_size > max_file:
                    raise BundleError(
                        str(rel), f"file is {_size(info.st_size)}; at most {_size(max_file)}"
                    )
                total += info.st_size
                if total > max_total:
                    raise BundleError(str(rel), f"the bundle is larger than {_size(max_total)}")
                files.append(Path(rel))
            else:
                raise BundleError(
                    str(rel), f"is {_kind(info.st_mode)}: a bundle holds only files and folders"
                )
    return sorted(files)


def _link_target(base: str, path: str, rel: str) -> tuple[str, os.stat_result]:
    target = os.path.realpath(path)
    if not _within(base, target):
        raise BundleError(rel, f"a symlink to {os.readlink(path)}, outside the bundle")
    try:
        return target, os.stat(target)
    except OSError:
        raise BundleError(rel, f"a symlink to {os.readlink(path)}, which does not exist") from None


# -- paths ---------------------------------------------------------------------------------------


def _within(base: str, real: str) -> bool:
    return real == base or real.startswith(base.rstrip(os.sep) + os.sep)


def _inside(base: str, path: Path, what: str) -> None:
    """Refuse ``path`` if, symlinks resolved, it lies outside ``base`` (a real path)."""
    real = os.path.realpath(path)
    if not _within(base, real):
        raise BundleError(what, f"resolves to {real}, outside {base}")


def _real_dir(path: Path, what: str) -> str:
    real = os.path.realpath(path)
    if not os.path.isdir(real):
        reason = "is not a folder" if os.path.exists(real) else "does not exist"
        raise BundleError(str(path), f"the {what} folder {reason}")
    return real


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a folder" if stat.S_ISDIR(mode) else "not a regular file"


# -- words for values ----------------------------------------------------------------------------


def _text(value: Any, what: str) -> str:
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise BundleError(what, f"must be a string, got {_json_kind(value)}")
    return str(value)


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return _JSON_KINDS.get(type(value), "an object")


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}".replace(".0 ", " ")
    return f"{n} bytes"
