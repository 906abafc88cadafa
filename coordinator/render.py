"""How the CLI shows a session's events to a person.

A persona's tile, its tool calls, its streamed answer and its end. Tool results are folded to
their first lines (``full`` shows them whole). An answer is shown once: when a specialist's answer
has been streamed, a later repeat of it, verbatim, in a tool result or in another spawn's text
(the coordinator relaying it) is replaced by a one-line pointer to where it was shown. Text from
the model is printed as it is: never read as console markup.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.text import Text

__all__ = ["FOLD_LINES", "EventPrinter", "show_event"]

#: Lines of a tool result shown before the rest is folded away.
FOLD_LINES = 6
#: Characters of one line of a folded tool result; the rest of the line is cut.
FOLD_WIDTH = 200
#: Answers shorter than this are not worth a pointer: repeating them is clearer.
_MIN_REPEAT = 24


def _folded(content: str, full: bool, more_hint: str) -> tuple[list[str], str]:
    """The lines of a tool result to show, and the note saying what was left out."""
    lines = content.strip("\n").splitlines()
    if full:
        return lines, ""
    cut = [line if len(line) <= FOLD_WIDTH else line[:FOLD_WIDTH] + "…" for line in lines]
    if len(cut) <= FOLD_LINES:
        return cut, ""
    rest = len(cut) - FOLD_LINES
    return cut[:FOLD_LINES], f"… {rest} more line{'s' if rest > 1 else ''}{more_hint}"


def _tool_result(console: Console, event: Any, full: bool, more_hint: str) -> None:
    colour = "red" if event.is_error else "green"
    lines, note = _folded(event.content, full, more_hint)
    head = Text(f"← {event.name}", style=colour)
    if len(lines) == 1 and not note:
        console.print(head + Text(" ") + Text(lines[0]))
        return
    console.print(head)
    for line in lines:
        console.print(Text("    " + line))
    if note:
        console.print(Text("    " + note, style="dim"))


def show_event(console: Console, event: Any, *, full: bool = False, more_hint: str = "") -> None:
    """Print one event on its own, without the state :class:`EventPrinter` keeps."""
    kind = event.type
    if kind == "text":
        console.print(Text(event.text), end="")
    elif kind == "agent_tile":
        tools = ", ".join(t["name"] for t in event.tools) or "none"
        console.print()
        console.print(Text.assemble((f"▶ {event.persona}", "bold cyan"), f" — {event.description}"))
        console.print(Text(f"  tools: {tools}"))
        if event.model:
            note = f" — {event.model_note}" if event.model_note else ""
            console.print(Text(f"  model: {event.model}{note}"))
    elif kind == "tool_call":
        console.print()
        console.print(Text.assemble((f"→ {event.name}", "magenta"), f" {event.arguments}"))
    elif kind == "tool_result":
        _tool_result(console, event, full, more_hint)
    elif kind == "confirmation_required":
        console.print()
        console.print(
            Text(f"? {event.name} needs confirmation ({event.confirmation})", style="yellow")
        )
    elif kind == "queue_waiting":
        console.print()
        console.print(Text(f"… waited {event.waited_seconds:.0f} s: {event.message}", "yellow"))
    elif kind == "context_compacted":
        console.print()
        console.print(
            Text(
                f"⋯ context compacted (#{event.number}): {event.replaced} earlier messages "
                f"replaced by the investigation ledger, about {event.tokens_before:,} → "
                f"{event.tokens_after:,} tokens ({event.reason})",
                style="dim",
            )
        )
        lines, note = _folded(event.ledger, full, more_hint)
        for line in lines:
            console.print(Text("    " + line, style="dim"))
        if note:
            console.print(Text("    " + note, style="dim"))
    elif kind == "task_notification":
        colour = "green" if event.status == "ok" else "red"
        usage = event.usage
        cost = f", ${usage.cost:.4f}" if usage.cost else ""
        if usage.cache_read_tokens or usage.cache_write_tokens:
            cost = (
                f" of which {usage.cache_read_tokens} read from and {usage.cache_write_tokens} "
                f"written to the prompt cache{cost}"
            )
        console.print()
        console.print(
            Text.assemble(
                (f"■ {event.persona}: {event.status}", colour),
                f" ({event.usage.model_calls} model calls, {event.usage.total_tokens} tokens"
                f"{cost})",
            )
        )
        if event.status != "ok" and event.message:
            console.print(Text(event.message))


@dataclass
class _Answer:
    persona: str
    text: str


@dataclass
class _Stream:
    """One spawn's streamed text: what was received, and what is held back while it may turn
    out to be the start of an answer already shown."""

    persona: str
    received: str = ""
    held: str = ""


class EventPrinter:
    """Prints a session's events in order, keeping what it needs to show each answer once.

    ``full`` prints tool results whole; ``more_hint`` ends the line that counts folded lines
    (e.g. ``"; --full shows them"``). Call :meth:`close` after the last event.
    """

    def __init__(self, console: Console, *, full: bool = False, more_hint: str = "") -> None:
        self.console = console
        self.full = full
        self.more_hint = more_hint
        self._personas: dict[str, str] = {}
        self._streams: dict[str, _Stream] = {}
        self._answers: list[_Answer] = []
        self._last_text_spawn = ""
        self._mid_line = False
        self._after_pointer = False

    def show(self, event: Any) -> None:
        if event.type == "agent_tile":
            self._personas[event.spawn_id] = event.persona
        if event.type == "text":
            self._text(event.spawn_id, event.text)
            return
        self._flush(event.spawn_id)
        self._end_line()
        self._last_text_spawn = ""
        if event.type == "tool_result" and (answer := self._repeated(event.content)):
            colour = "red" if event.is_error else "green"
            self.console.print(
                Text.assemble(
                    (f"← {event.name}", colour), (f" {answer.persona}'s answer, shown above", "dim")
                )
            )
        else:
            show_event(self.console, event, full=self.full, more_hint=self.more_hint)
        if event.type == "task_notification":
            self._finished(event)

    def close(self) -> None:
        for spawn_id in list(self._streams):
            self._flush(spawn_id)
        self._end_line()

    # -- text ----------------------------------------------------------------------------------

    def _stream(self, spawn_id: str) -> _Stream:
        if spawn_id not in self._streams:
            self._streams[spawn_id] = _Stream(self._personas.get(spawn_id, ""))
        return self._streams[spawn_id]

    def _text(self, spawn_id: str, delta: str) -> None:
        stream = self._stream(spawn_id)
        stream.received += delta
        stream.held += delta
        pieces, stream.held = _split(stream.held, self._answers)
        self._emit(spawn_id, pieces)

    def _flush(self, spawn_id: str) -> None:
        stream = self._streams.get(spawn_id)
        if stream is not None and stream.held:
            held, stream.held = stream.held, ""
            self._emit(spawn_id, [held])

    def _emit(self, spawn_id: str, pieces: list[str | _Answer]) -> None:
        for piece in pieces:
            if not piece:
                continue
            if spawn_id != self._last_text_spawn:
                # Text of parallel spawns interleaves: say whose text follows.
                previous, self._last_text_spawn = self._last_text_spawn, spawn_id
                persona = self._personas.get(spawn_id)
                if previous and persona:
                    self._end_line()
                    self.console.print(Text(f"[{persona}]", style="cyan"))
            if isinstance(piece, _Answer):
                self._end_line()
                self.console.print(Text(f"({piece.persona}'s answer, shown above)", style="dim"))
                self._after_pointer = True
                continue
            if self._after_pointer:  # the pointer ended its line: the text's own break goes
                self._after_pointer = False
                piece = piece.removeprefix("\n")
                if not piece:
                    continue
            self.console.print(Text(piece), end="")
            self._mid_line = not piece.endswith("\n")

    def _end_line(self) -> None:
        if self._mid_line:
            self.console.print()
            self._mid_line = False

    # -- answers -------------------------------------------------------------------------------

    def _finished(self, event: Any) -> None:
        stream = self._streams.get(event.spawn_id)
        answer = event.message.strip()
        if (
            event.status == "ok"
            and stream is not None
            and len(answer) >= _MIN_REPEAT
            and answer in stream.received
        ):
            self._answers.append(_Answer(event.persona or stream.persona, answer))

    def _repeated(self, content: str) -> _Answer | None:
        text = content.strip()
        return next((a for a in self._answers if a.text == text), None)


def _split(held: str, answers: list[_Answer]) -> tuple[list[str | _Answer], str]:
    """Cut ``held`` into text to print now and answers it repeats, keeping back its end while
    that end could still grow into one of ``answers``."""
    pieces: list[str | _Answer] = []
    while True:
        hit = _first_repeat(held, answers)
        if hit is None:
            break
        at, answer = hit
        pieces += [held[:at], answer]
        held = held[at + len(answer.text) :]
    keep = max((_open_prefix(held, a.text) for a in answers), default=0)
    pieces.append(held[: len(held) - keep])
    return pieces, held[len(held) - keep :]


def _first_repeat(text: str, answers: list[_Answer]) -> tuple[int, _Answer] | None:
    found = [(at, a) for a in answers if (at := text.find(a.text)) >= 0]
    return min(found, key=lambda hit: hit[0]) if found else None


def _open_prefix(text: str, answer: str) -> int:
    """Length of the longest end of ``text`` that ``answer`` starts with (0 when none)."""
    start = text.find(answer[0]) if answer else -1
    while start >= 0:
        if answer.startswith(text[start:]):
            return len(text) - start
        start = text.find(answer[0], start + 1)
    return 0
