"""A scripted investigator for the fake provider servers: it reads a log window by window.

The long-investigation tests and ``bench/long_investigation.py`` need a model that behaves as a
careful one does on a long task: it pages through a log with ``read_repo``, notes what it finds
in its own words as it goes (each finding quotes the tool call and the line), writes an
investigation ledger when the runtime asks for one, and answers from its notes once every window
is read. :func:`investigator` returns such a policy (a function of the provider request body,
as the fake servers call it) for Anthropic's Messages bodies and OpenAI's chat bodies alike.

It remembers nothing between requests: what it knows is what the request shows it. A finding
that the runtime's compaction lost, or a window it shows twice, changes its answer, which is
what the tests look at.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from workers.testing.fake_anthropic import block_text, blocks
from workers.testing.fake_openai import Reply, ToolCallReply

__all__ = ["Seen", "investigator", "log_file", "read"]

#: Lines of one window (``read_repo``'s ``max_lines``), and the width of each log line.
WINDOW_LINES = 200
LINE_WIDTH = 80
#: The ledger instruction of :mod:`workers.context` contains this.
LEDGER_ASK = "investigation ledger"
_LAST = re.compile(r"last window read: (\d+)")
_FINDING = re.compile(r"^Finding: .+$", re.MULTILINE)


def log_file(windows: int, culprit: int) -> str:
    """A log of ``windows`` windows of ``WINDOW_LINES`` lines (about 16 KB each); window
    ``culprit`` holds the one ERROR line."""
    lines = []
    for n in range(windows * WINDOW_LINES):
        window = n // WINDOW_LINES + 1
        second = n % 3600
        stamp = f"2026-12-01T{window % 24:02d}:{second // 60:02d}:{second % 60:02d}Z"
        event = (
            "ERROR disk /var on db-1 is 100% full: write failed (ENOSPC)"
            if window == culprit and n % WINDOW_LINES == 120
            else f"INFO GET /api/orders/{n} 200 {n % 97} ms"
        )
        lines.append(f"{stamp} db-1 postgres[{4000 + n % 50}] {event}".ljust(LINE_WIDTH - 1, " "))
    return "\n".join(lines) + "\n"


@dataclass
class Seen:
    """What one request shows: the windows read so far, the findings noted, the last
    results, and whether it asks for a ledger."""

    done: int = 0
    findings: list[str] = field(default_factory=list)
    latest: list[tuple[dict[str, Any], str]] = field(default_factory=list)
    """The calls answered by the last user message, with their results."""
    wants_ledger: bool = False


def read(body: dict[str, Any]) -> Seen:
    """What a request body (Anthropic's or OpenAI's) shows the investigator."""
    seen = Seen()
    calls: dict[str, dict[str, Any]] = {}
    latest: list[tuple[dict[str, Any], str]] = []
    for message in body.get("messages", []):
        role, content = message.get("role"), message.get("content")
        text = block_text(content)
        if role == "assistant":
            latest = []
            seen.findings += _FINDING.findall(text)
            uses = [
                (b.get("id", ""), b.get("input") or {})
                for b in blocks(content)
                if b.get("type") == "tool_use"
            ]
            uses += [
                (c.get("id", ""), json.loads(c["function"].get("arguments") or "{}"))
                for c in message.get("tool_calls") or []
            ]
            for call_id, arguments in uses:
                calls[call_id] = arguments
                start = int(arguments.get("start_line", 1))
                seen.done = max(seen.done, (start - 1) // WINDOW_LINES + 1)
        elif role == "tool":
            latest.append((calls.get(message.get("tool_call_id", ""), {}), text))
        elif role == "user":
            results = [b for b in blocks(content) if b.get("type") == "tool_result"]
            latest += [
                (calls.get(b.get("tool_use_id", ""), {}), block_text(b.get("content", "")))
                for b in results
            ]
            seen.findings += _FINDING.findall(text)
            seen.done = max([seen.done, *(int(n) for n in _LAST.findall(text))])
            seen.wants_ledger = LEDGER_ASK in text
    seen.findings = list(dict.fromkeys(seen.findings))
    seen.latest = latest
    return seen


def _new_findings(seen: Seen, path: str) -> list[str]:
    found = []
    for arguments, result in seen.latest:
        for line in result.splitlines():
            if "ERROR" in line and "Finding:" not in line:
                start = arguments.get("start_line", 1)
                found.append(
                    f"Finding: read_repo(path={path!r}, start_line={start}) shows "
                    f"{line.strip()[:160]}"
                )
    return [f for f in found if f not in seen.findings]


def investigator(windows: int, path: str = "logs/db-1.log") -> Callable[[dict[str, Any]], Reply]:
    """The policy: read ``windows`` windows of ``path`` one call a turn, then answer."""

    def decide(body: dict[str, Any]) -> Reply:
        seen = read(body)
        new = _new_findings(seen, path)
        findings = [*seen.findings, *new]
        if seen.wants_ledger:
            evidence = "\n".join(findings) or "none yet"
            return Reply(
                content=(
                    f"## Question\nWhen and why did db-1 fail? Read {path} window by window.\n"
                    f"## Evidence\n{evidence}\n"
                    f"## Next steps\nRead window {seen.done + 1} of {windows}.\n"
                    f"last window read: {seen.done}"
                )
            )
        if seen.done >= windows:
            evidence = "\n".join(findings) or "no ERROR line in any window"
            return Reply(content=f"Read all {windows} windows of {path}.\n{evidence}")
        start = seen.done * WINDOW_LINES + 1
        arguments = {"path": path, "start_line": start, "max_lines": WINDOW_LINES}
        return Reply(
            content="\n".join(new) or None,
            tool_calls=[ToolCallReply(name="read_repo", arguments=arguments)],
        )

    return decide
