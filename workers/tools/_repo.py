"""``read_repo``: read a file or list a directory inside the configured repository root."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from typing import IO, Annotated

from pydantic import Field

from registry.tools import ToolClass, ToolContext, ToolResult, function_tool
from workers.tools._common import cap_text, error, not_configured, setting

__all__ = ["TOOLS", "resolve_inside"]

MAX_ENTRIES = 500
MAX_LINE_CHARS = 1000
OUTPUT_CHARS = 32_000
#: Past this much of a file (and the window), lines are no longer counted.
MAX_READ_BYTES = 8 * 1024 * 1024
#: The most of one line ever held in memory.
MAX_LINE_BYTES = 64 * 1024


def resolve_inside(root: str, path: str) -> str | None:
    """The real path of ``path`` under ``root``, or ``None`` if it resolves outside (``..``,
    absolute paths elsewhere, symlinks pointing out)."""
    real_root = os.path.realpath(root)
    real = os.path.realpath(os.path.join(real_root, path))  # an absolute path replaces the root
    inside = real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep)
    return real if inside else None


def _list_dir(real: str, shown_as: str) -> ToolResult:
    entries = sorted(os.scandir(real), key=lambda e: e.name)
    lines = [
        f"{e.name}/" if e.is_dir(follow_symlinks=False) else e.name for e in entries[:MAX_ENTRIES]
    ]
    if len(entries) > MAX_ENTRIES:
        lines.append(f"[{len(entries) - MAX_ENTRIES} more entries not shown]")
    return ToolResult(
        content=f"{shown_as}/ ({len(entries)} entries)\n" + "\n".join(lines),
        data=[e.name for e in entries],
    )


def _open_regular(real: str, shown_as: str) -> IO[bytes] | ToolResult:
    """The file opened for reading if it is a regular file; an error result otherwise.

    Opened without blocking and checked on the open descriptor, so a FIFO or a device (or a path
    swapped for one after the check) can never hang the call.
    """
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return error(f"refused: {shown_as} is a symbolic link")
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return error(f"refused: {shown_as} is not a regular file")
    return os.fdopen(fd, "rb")


def _lines(handle: IO[bytes]) -> Iterator[bytes]:
    """Each line's first :data:`MAX_LINE_BYTES`; the rest of a longer line is read past, never
    held, so one enormous line cannot fill the worker's memory either."""
    while line := handle.readline(MAX_LINE_BYTES):
        rest = line
        while not rest.endswith(b"\n") and (rest := handle.readline(MAX_LINE_BYTES)):
            pass
        yield line


def _read_file(real: str, shown_as: str, start_line: int, max_lines: int) -> ToolResult:
    opened = _open_regular(real, shown_as)
    if isinstance(opened, ToolResult):
        return opened
    window: list[str] = []
    total, complete = 0, True
    with opened as handle:
        if b"\0" in handle.read(8192):
            return error(f"{shown_as} is a binary file ({os.fstat(handle.fileno()).st_size} bytes)")
        handle.seek(0)
        for raw in _lines(handle):  # streamed: only the window is kept
            total += 1
            if start_line <= total < start_line + max_lines:
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                window.append(f"{total:>6}  {cap_text(line, MAX_LINE_CHARS, 'line')}")
            if handle.tell() > MAX_READ_BYTES and total >= start_line + max_lines:
                complete = False
                break
    end = start_line + len(window) - 1
    of = f"{total}" if complete else f"more than {total}"
    header = f"{shown_as}: lines {start_line}-{end} of {of}"
    if end < total or not complete:
        header += f" (continue with start_line={end + 1})"
    return ToolResult(
        content=cap_text("\n".join([header, *window]), OUTPUT_CHARS),
        data={
            "path": shown_as,
            "start_line": start_line,
            "end_line": end,
            "total_lines": total if complete else None,
        },
    )


@function_tool(ToolClass.READ, name="read_repo", requires=("repo_root",))
def read_repo(
    path: Annotated[
        str,
        Field(
            description="Path relative to the repository root; '.' lists the root.",
            max_length=4096,
        ),
    ],
    context: ToolContext,
    start_line: Annotated[int, Field(ge=1, description="First line to show (1-based).")] = 1,
    max_lines: Annotated[int, Field(ge=1, le=2000, description="How many lines to show.")] = 200,
) -> ToolResult:
    """Read a file of the configured repository (configs, manifests, runbooks, code) with line
    numbers, or list a directory. Long files come in windows: use start_line/max_lines to page.
    Paths that resolve outside the repository root (.., symlinks) are refused."""
    root = setting(context, "repo_root")
    if not root:
        return not_configured("read_repo", "ONGRID_REPO_ROOT", "the repository checkout to read")
    real = resolve_inside(str(root), path)
    if real is None:
        return error(f"refused: {path} resolves outside the repository root")
    shown_as = os.path.relpath(real, os.path.realpath(str(root)))
    try:
        if os.path.isdir(real):
            return _list_dir(real, shown_as)
        return _read_file(real, shown_as, start_line, max_lines)
    except FileNotFoundError:
        return error(f"{path} does not exist in the repository")
    except OSError as exc:
        return error(f"cannot read {path}: {exc.strerror or exc}")


TOOLS = (read_repo,)
