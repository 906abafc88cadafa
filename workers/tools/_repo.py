"""``read_repo``: read a file or list a directory inside the configured repository root."""

from __future__ import annotations

import os
from typing import Annotated

from pydantic import Field

from registry.tools import ToolClass, ToolContext, ToolResult, function_tool
from workers.tools._common import cap_text, error, not_configured, setting

__all__ = ["TOOLS", "resolve_inside"]

MAX_ENTRIES = 500
MAX_LINE_CHARS = 1000
OUTPUT_CHARS = 32_000


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


def _read_file(real: str, shown_as: str, start_line: int, max_lines: int) -> ToolResult:
    with open(real, "rb") as handle:
        if b"\0" in handle.read(8192):
            return error(f"{shown_as} is a binary file ({os.path.getsize(real)} bytes)")
    with open(real, encoding="utf-8", errors="replace") as handle:
        lines = handle.read().splitlines()
    end = min(len(lines), start_line - 1 + max_lines)
    numbered = [
        f"{n:>6}  {cap_text(lines[n - 1], MAX_LINE_CHARS, 'line')}"
        for n in range(start_line, end + 1)
    ]
    header = f"{shown_as}: lines {start_line}-{end} of {len(lines)}"
    if end < len(lines):
        header += f" (continue with start_line={end + 1})"
    return ToolResult(
        content=cap_text("\n".join([header, *numbered]), OUTPUT_CHARS),
        data={
            "path": shown_as,
            "start_line": start_line,
            "end_line": end,
            "total_lines": len(lines),
        },
    )


@function_tool(ToolClass.READ, name="read_repo")
def read_repo(
    path: Annotated[
        str, Field(description="Path relative to the repository root; '.' lists the root.")
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
