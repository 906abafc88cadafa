"""Record a worker's tool calls to files, or serve them back: ``ONGRID_TOOL_TAPE``.

``record:<dir>`` runs every tool for real and writes each call to ``<dir>`` as one JSON file
(the spawn and call ids, the tool, its validated arguments, the result and whether it was an
error). ``replay:<dir>`` runs nothing: a call gets the result recorded for the same tool and
the same arguments, the recorded calls of each such pair served in the order they were made, so
a run made against live systems can be evaluated again later, with another model, once those
systems are gone. A call the tape does not hold ends the spawn with :class:`TapeMiss`, which
names the call and what the tape does hold for that tool.

Each spawn replays the tape from its start (spawn ids differ between the recorded run and the
replay). Files are read and written on the worker's tool threads, never on its event loop.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from registry.errors import RunError, UserError
from registry.tools import BaseTool, ToolContext, ToolResult

__all__ = ["TapeEntry", "TapeMiss", "ToolTape", "parse_tape", "tape_for"]

Mode = Literal["record", "replay"]


class TapeMiss(RunError):
    """A replayed spawn made a call the tape does not hold: the run diverged from the recording."""


class TapeEntry(BaseModel):
    """One recorded tool call: the file ``<recorded_ns>-<spawn_id>-<call_id>.json``."""

    recorded_ns: int
    """When the call finished (``time.time_ns()``); replays serve calls in this order."""
    session_id: str
    spawn_id: str
    call_id: str
    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    """The validated arguments, defaults filled in, as JSON."""
    result: str
    is_error: bool = False

    @property
    def key(self) -> str:
        return _key(self.tool, self.arguments)


def _key(tool: str, arguments: dict[str, Any]) -> str:
    return f"{tool} {json.dumps(arguments, sort_keys=True, separators=(',', ':'))}"


def parse_tape(setting: str) -> tuple[Mode, Path] | None:
    """``record:<dir>`` / ``replay:<dir>`` → the mode and directory; ``""`` → ``None``."""
    if not setting:
        return None
    mode, _, directory = setting.partition(":")
    if mode not in ("record", "replay") or not directory:
        raise UserError(
            f"tool_tape (ONGRID_TOOL_TAPE) is {setting!r}: write record:<dir> to record every "
            "tool call to <dir>, or replay:<dir> to serve the calls recorded there"
        )
    return ("record" if mode == "record" else "replay"), Path(directory)


@dataclass
class ToolTape:
    """Runs tool calls through the tape: :meth:`run` in a worker's tool thread."""

    mode: Mode
    directory: Path
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    #: Replay: how many calls of each key every spawn has been served.
    _served: dict[str, Counter[str]] = field(default_factory=dict, repr=False)

    def run(self, tool: BaseTool, arguments: BaseModel, context: ToolContext) -> ToolResult:
        """The result of one call: run and recorded, or served from the tape."""
        dumped = arguments.model_dump(mode="json")
        if self.mode == "replay":
            return self._replay(tool.name, dumped, context)
        try:
            result = tool.run(arguments, context)
        except RunError:
            raise  # the run stops (its worker shuts down): not an observation to replay
        except Exception as exc:
            # Recorded as the loop words a raising tool to the model, so a replay reads the same.
            failed = ToolResult(f"{tool.name} failed: {type(exc).__name__}: {exc}", is_error=True)
            self._record(tool.name, dumped, context, failed)
            raise
        self._record(tool.name, dumped, context, result)
        return result

    def _record(
        self, tool: str, arguments: dict[str, Any], context: ToolContext, result: ToolResult
    ) -> None:
        entry = TapeEntry(
            recorded_ns=time.time_ns(),
            session_id=context.session_id,
            spawn_id=context.spawn_id,
            call_id=context.call_id,
            tool=tool,
            arguments=arguments,
            result=result.content,
            is_error=result.is_error,
        )
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{entry.recorded_ns}-{context.spawn_id}-{context.call_id}.json"
        partial = path.with_suffix(".partial")
        partial.write_text(entry.model_dump_json(indent=1), encoding="utf-8")
        os.replace(partial, path)  # a replay never reads half a call

    def entries(self) -> list[TapeEntry]:
        """Every recorded call, in the order the calls finished."""
        if not self.directory.is_dir():
            raise TapeMiss(f"tool tape {self.directory}: no such directory to replay")
        entries = [
            TapeEntry.model_validate_json(path.read_text(encoding="utf-8"))
            for path in self.directory.glob("*.json")
        ]
        return sorted(entries, key=lambda e: (e.recorded_ns, e.spawn_id, e.call_id))

    def _replay(self, tool: str, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        key = _key(tool, arguments)
        matching = [e for e in self.entries() if e.key == key]
        with self._lock:
            served = self._served.setdefault(context.spawn_id, Counter())
            number = served[key]
            if number < len(matching):
                served[key] += 1
        if number >= len(matching):
            raise TapeMiss(self._miss(tool, key, number, len(matching)))
        entry = matching[number]
        return ToolResult(content=entry.result, is_error=entry.is_error)

    def _miss(self, tool: str, key: str, number: int, recorded: int) -> str:
        shown = key.removeprefix(f"{tool} ")
        if recorded:
            return (
                f"tool tape {self.directory}: {tool} {shown} was recorded {recorded} time(s); "
                f"this spawn asks for it once more (call {number + 1})"
            )
        others = sorted({e.key.removeprefix(f"{tool} ") for e in self.entries() if e.tool == tool})
        held = "; ".join(others) if others else "no call of it at all"
        return (
            f"tool tape {self.directory}: {tool} {shown} was not recorded; "
            f"the tape holds for {tool}: {held}"
        )


@functools.lru_cache(maxsize=8)
def tape_for(setting: str) -> ToolTape | None:
    """The tape of a ``tool_tape`` setting (one per setting and process), ``None`` when unset."""
    parsed = parse_tape(setting)
    return None if parsed is None else ToolTape(*parsed)
