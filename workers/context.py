"""What a model sees of a long conversation, and how it is kept inside the model's window.

A spawn's messages grow with every turn; a long investigation reading logs window by window
outgrows any context window. :class:`ContextPolicy` keeps every request inside the model's
window, by design rather than by luck:

- **The reply's room is reserved.** Each request asks for at most :meth:`ContextPolicy.max_tokens`
  output tokens (``reply_tokens``, capped by the model's output limit), and the input is kept
  within :meth:`ContextPolicy.input_budget`: the window less that room and a margin.
- **Large tool results are stored, by reference.** A result longer than ``spill_chars`` is put
  in the spawn's :class:`ResultStore` (with the spawn, in Redis) under its call id before the
  checkpoint that records it, and :attr:`StoredResult` notes its size. It enters the
  conversation whole while it is recent (a result too large for that enters as its preview at
  once); the model can read any stored result again, by range or by a pattern, with the
  read-class tool :data:`READ_TOOL`.
- **Older results shrink to their preview** (head and tail, with the reference and how to read
  the rest) once the estimate crosses ``shrink_at`` of the budget: all of them at once, except
  those of the last ``keep_turns`` turns, so a provider's prompt cache is broken rarely and only
  from the first changed message on.
- **Compaction.** When the estimate still crosses ``compact_at``, one model call writes an
  *investigation ledger* (:func:`ledger_instruction`: the question, hypotheses, evidence with the
  exact tool call and excerpt, identifiers, what was ruled out, the user's constraints, next
  steps), which replaces the turns before the last ``keep_turns``. The system prompt and the
  persona's first user message (its context) always stay; the per-turn reminder is added to
  every request after all of this (:mod:`workers.loop`), so it is never compacted away.

Token counts are estimates (characters over the characters per token the provider's own
counts showed for this spawn, :func:`calibrated`), checked against the provider: a refusal as
"prompt is too long" recalibrates from the figures it names and compacts (the loop retries the
call once). What does not fit even then ends the spawn like a reached budget
(:class:`ContextExhausted`).

Every change here is to the loop's state and is checkpointed by the loop: a worker killed
during a compaction resumes from the state before it and compacts again; what a finished
compaction replaced is gone from the state, kept in its ledger and the stored results.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pydantic import BaseModel

from registry.errors import RunError
from workers.messages import Message
from workers.model import ToolSpec

__all__ = [
    "LEDGER_TAG",
    "READ_TOOL",
    "READ_TOOL_SPEC",
    "Compaction",
    "ContextExhausted",
    "ContextPolicy",
    "MemoryResults",
    "ResultStore",
    "StoredResult",
    "Window",
    "calibrated",
    "estimate",
    "exceeded_figures",
    "last_ledger",
    "ledger_instruction",
    "ledger_message",
    "preview",
    "read_stored",
]

#: The read-class tool every spawn with a context policy has: reads a stored result again.
READ_TOOL = "read_stored_result"
#: The wrapper of the ledger message that replaces compacted turns.
LEDGER_TAG = "investigation-ledger"
#: Characters per token assumed before the provider's counts are known: low (counts high), so
#: the first estimates err on the side of a request that fits.
DEFAULT_CHARS_PER_TOKEN = 3.0
#: Tokens a message costs beyond its text (role, separators), as providers count them.
_PER_MESSAGE = 6
#: Longest read of a stored result in one call, and most lines one grep returns.
READ_MAX_CHARS = 12_000
GREP_MAX_LINES = 200

READ_TOOL_SPEC = ToolSpec(
    READ_TOOL,
    "Read a stored tool result again. Large tool results are shown as a preview (their start "
    "and end) with a reference; this reads the full text by character range, or the lines "
    "matching a regular expression.",
    {
        "type": "object",
        "properties": {
            "ref": {"type": "string", "description": "the reference the preview names"},
            "offset": {"type": "integer", "minimum": 0, "description": "first character"},
            "length": {
                "type": "integer",
                "minimum": 1,
                "maximum": READ_MAX_CHARS,
                "description": f"characters to read (at most {READ_MAX_CHARS})",
            },
            "grep": {
                "type": "string",
                "description": "a regular expression: return the matching lines, numbered",
            },
        },
        "required": ["ref"],
    },
)


@dataclass(frozen=True)
class Window:
    """A model's limits, in tokens: the context window (input and output together) and the
    longest reply it can write."""

    context_window: int
    max_output: int


class ResultStore(Protocol):
    """Where a spawn's large tool results are kept, by call id."""

    async def put(self, call_id: str, content: str) -> None: ...

    async def get(self, call_id: str) -> str | None: ...


@dataclass
class MemoryResults:
    """A :class:`ResultStore` in memory (tests, benchmarks)."""

    results: dict[str, str] = field(default_factory=dict)

    async def put(self, call_id: str, content: str) -> None:
        self.results[call_id] = content

    async def get(self, call_id: str) -> str | None:
        return self.results.get(call_id)


class StoredResult(BaseModel):
    """A tool result kept in the result store: its size, and whether the conversation now
    holds only its preview."""

    chars: int
    lines: int
    shrunk: bool = False


class Compaction(BaseModel):
    """One compaction of a spawn's conversation, for the transcript and the figures."""

    turn: int
    reason: str
    replaced: int
    """Messages the ledger replaced."""
    tokens_before: int
    tokens_after: int


class ContextExhausted(RunError):
    """The conversation cannot be made to fit the model's window: the spawn stops with its
    best partial answer, like a reached budget."""

    def __init__(self, tokens: int, window: int, why: str) -> None:
        self.tokens, self.window = tokens, window
        super().__init__(why)


@dataclass(frozen=True)
class ContextPolicy:
    """How one spawn's conversation is kept inside its model's window (see the module)."""

    window: Window
    store: ResultStore
    reply_tokens: int = 8192
    """The output limit asked for each reply (the model's own limit caps it)."""
    spill_chars: int = 6000
    """Results longer than this are stored and may shrink to their preview."""
    head_chars: int = 1500
    tail_chars: int = 500
    shrink_at: float = 0.5
    compact_at: float = 0.8
    keep_turns: int = 2
    """Turns (an assistant message and its tool results) at the end that are never shrunk, and
    are kept as they are by a compaction."""
    ledger_tokens: int = 4096
    """The output limit of the call that writes the ledger."""

    def max_tokens(self) -> int:
        return max(1, min(self.reply_tokens, self.window.max_output))

    def input_budget(self) -> int:
        """The most input tokens a request may carry: the window less the reply's room and a
        margin for the estimate's error."""
        margin = max(256, self.window.context_window // 50)
        return max(1, self.window.context_window - self.max_tokens() - margin)


# -- estimates ---------------------------------------------------------------------------------


def _message_chars(message: Message) -> int:
    chars = len(message.content)
    for call in message.tool_calls:
        chars += len(call.name) + len(call.arguments) + len(call.id)
    return chars


def tool_chars(tools: Sequence[ToolSpec]) -> int:
    """The characters the tool list costs (as JSON, the way providers receive it)."""
    return sum(
        len(t.name) + len(t.description) + len(json.dumps(t.parameters, separators=(",", ":")))
        for t in tools
    )


def request_chars(messages: Sequence[Message], tools: Sequence[ToolSpec]) -> int:
    return sum(_message_chars(m) for m in messages) + tool_chars(tools)


def estimate(messages: Sequence[Message], tools: Sequence[ToolSpec], chars_per_token: float) -> int:
    """The tokens a request of ``messages`` and ``tools`` is expected to count."""
    per_token = chars_per_token or DEFAULT_CHARS_PER_TOKEN
    chars = request_chars(messages, tools)
    return math.ceil(chars / per_token) + _PER_MESSAGE * len(messages)


def calibrated(chars: int, messages: int, tokens: int) -> float:
    """Characters per token, from a request of ``chars`` characters in ``messages`` messages
    that the provider counted as ``tokens`` input tokens; bounded to what text tokenizers do."""
    text_tokens = tokens - _PER_MESSAGE * messages
    if text_tokens <= 0 or chars <= 0:
        return 0.0
    return min(max(chars / text_tokens, 1.0), 8.0)


_EXCEEDED = re.compile(r"(\d[\d,]*)\s*tokens?\s*>\s*(\d[\d,]*)", re.IGNORECASE)
#: OpenAI's: "maximum context length is 128000 tokens. However, your messages resulted in
#: 130532 tokens".
_EXCEEDED_OPENAI = re.compile(
    r"maximum context length is (\d[\d,]*) tokens.*?"
    r"(?:resulted in (\d[\d,]*) tokens|\((\d[\d,]*) in the messages)",
    re.IGNORECASE | re.DOTALL,
)
#: Input and reply together past the window: Anthropic's "input length and `max_tokens` exceed
#: context limit: 188240 + 21333 > 200000".
_EXCEEDED_SUM = re.compile(r"(\d[\d,]*)\s*\+\s*\d[\d,]*\s*>\s*(\d[\d,]*)")


def exceeded_figures(message: str) -> tuple[int, int] | None:
    """``(tokens, maximum)`` from a provider's refusal as too long (Anthropic's "prompt is too
    long: 60396 tokens > 60000 maximum", or its input plus ``max_tokens`` past the limit,
    OpenAI's "maximum context length is…" either way); ``None`` when the message names no such
    figures."""

    def number(text: str) -> int:
        return int(text.replace(",", ""))

    if match := _EXCEEDED.search(message):
        return number(match.group(1)), number(match.group(2))
    if match := _EXCEEDED_SUM.search(message):
        return number(match.group(1)), number(match.group(2))
    if match := _EXCEEDED_OPENAI.search(message):
        return number(match.group(2) or match.group(3)), number(match.group(1))
    return None


# -- stored results and their previews ---------------------------------------------------------


def preview(content: str, ref: str, head: int, tail: int) -> str:
    """What the conversation holds of a stored result: its head and tail, and how to read the
    rest. ``content`` no longer than ``head + tail`` is returned as it is."""
    if len(content) <= head + tail:
        return content
    lines = content.count("\n") + 1
    left_out = len(content) - head - tail
    return (
        f"[stored result {ref}: {len(content):,} characters, {lines:,} lines. Shown: the first "
        f"{head:,} and the last {tail:,} characters. {READ_TOOL}(ref={ref!r}, offset=…, "
        f"length=…) reads any part, {READ_TOOL}(ref={ref!r}, grep=…) the matching lines.]\n"
        f"{content[:head]}\n[… {left_out:,} characters not shown …]\n{content[-tail:]}"
    )


async def read_stored(
    store: ResultStore, stored: dict[str, StoredResult], arguments: str
) -> tuple[str, bool]:
    """Run one :data:`READ_TOOL` call: ``(content, is_error)``."""
    try:
        args = json.loads(arguments or "{}")
    except json.JSONDecodeError as exc:
        return f"arguments of {READ_TOOL} are not valid JSON: {exc}", True
    if not isinstance(args, dict):
        return f"arguments of {READ_TOOL} must be a JSON object", True
    ref = args.get("ref")
    if not isinstance(ref, str) or ref not in stored:
        known = ", ".join(sorted(stored)[-20:]) or "none"
        return f"no stored result {ref!r}; stored results: {known}", True
    content = await store.get(ref)
    if content is None:
        return f"stored result {ref!r} is no longer available", True
    pattern = args.get("grep")
    if pattern:
        return _grep(content, str(pattern), ref)
    offset, length = args.get("offset", 0), args.get("length", READ_MAX_CHARS)
    if not isinstance(offset, int) or not isinstance(length, int) or offset < 0 or length < 1:
        return "offset must be an integer ≥ 0 and length an integer ≥ 1", True
    length = min(length, READ_MAX_CHARS)
    part = content[offset : offset + length]
    end = offset + len(part)
    return f"[{ref}: characters {offset:,}-{end:,} of {len(content):,}]\n{part}", False


def _grep(content: str, pattern: str, ref: str) -> tuple[str, bool]:
    try:
        expression = re.compile(pattern[:500])
    except re.error as exc:
        return f"grep is not a valid regular expression: {exc}", True
    matches = [
        f"{number}: {line[:500]}"
        for number, line in enumerate(content.splitlines(), 1)
        if expression.search(line)
    ]
    shown = matches[:GREP_MAX_LINES]
    more = len(matches) - len(shown)
    head = f"[{ref}: {len(matches)} matching line{'s' if len(matches) != 1 else ''}"
    head += f", first {len(shown)} shown]" if more else "]"
    return "\n".join([head, *shown]), False


# -- turns, shrinking, the ledger ---------------------------------------------------------------


def turn_starts(messages: Sequence[Message]) -> list[int]:
    """Indices of the assistant messages: each starts a turn (it and its tool results)."""
    return [i for i, m in enumerate(messages) if m.role == "assistant"]


def recent_start(messages: Sequence[Message], keep_turns: int) -> int:
    """The index from which the last ``keep_turns`` turns run (``len`` when none are kept)."""
    starts = turn_starts(messages)
    if keep_turns <= 0 or not starts:
        return len(messages)
    return starts[-keep_turns] if len(starts) >= keep_turns else starts[0]


def first_shrinkable(messages: Sequence[Message], stored: dict[str, StoredResult]) -> int:
    """The index of the first message a shrink could still change (a stored result not yet
    shrunk); 0 when there is none."""
    for i, message in enumerate(messages):
        entry = stored.get(message.tool_call_id or "") if message.role == "tool" else None
        if entry is not None and not entry.shrunk:
            return i
    return 0


def shrink(
    messages: list[Message],
    stored: dict[str, StoredResult],
    policy: ContextPolicy,
    *,
    until: int,
) -> int:
    """Replace the stored results among ``messages[:until]`` by their previews, in place;
    the number replaced."""
    count = 0
    for i in range(min(until, len(messages))):
        message = messages[i]
        ref = message.tool_call_id
        if message.role != "tool" or ref is None:
            continue
        entry = stored.get(ref)
        if entry is None or entry.shrunk:
            continue
        short = preview(message.content, ref, policy.head_chars, policy.tail_chars)
        messages[i] = message.model_copy(update={"content": short})
        entry.shrunk = True
        count += 1
    return count


def ledger_instruction(omitted: int) -> str:
    """The request that makes the model write its investigation ledger."""
    gap = (
        f" The {omitted} oldest messages are not shown here; an earlier ledger above, if any, "
        "covers them."
        if omitted
        else ""
    )
    return (
        "The conversation is about to outgrow your context window. Do not call any tool now. "
        "Write the investigation ledger that will replace the turns so far; you will continue "
        "from it and from the last turns, which stay as they are. Be complete and exact: what "
        "is not in the ledger is lost to you (large tool results stay readable by their "
        f"reference with {READ_TOOL}).{gap} Use these headings:\n"
        "## Question — what was asked, in the user's words, and what a finished answer needs.\n"
        "## Constraints — what the user or the task allows and forbids.\n"
        "## Hypotheses — each with its status: open, supported or ruled out, and why.\n"
        "## Evidence — each finding with the exact tool call that produced it (tool name and "
        "arguments), the stored result reference when there is one, and a short verbatim "
        "excerpt.\n"
        "## Identifiers — hosts, services, paths, ids, times, versions met so far.\n"
        "## Ruled out — what was checked and found not to matter.\n"
        "## Next steps — what to do next, in order."
    )


_LEDGER_INTRO = (
    "Earlier turns of this task were compacted into this ledger, which you wrote. Continue the "
    "task from it and from the turns that follow.\n\n"
)


def ledger_message(ledger: str, number: int, replaced: int) -> Message:
    """The user message that carries a ledger in place of the turns it replaced."""
    return Message(
        role="user",
        content=(
            f"<{LEDGER_TAG} number={number} replaced_messages={replaced}>\n{_LEDGER_INTRO}"
            f"{ledger.strip()}\n</{LEDGER_TAG}>"
        ),
    )


def is_ledger(message: Message) -> bool:
    return message.role == "user" and message.content.startswith(f"<{LEDGER_TAG} ")


def last_ledger(messages: Sequence[Message]) -> str:
    """The text of the last ledger among ``messages`` (without its wrapper); empty if none."""
    for message in reversed(messages):
        if is_ledger(message):
            body = message.content.split("\n", 1)[1] if "\n" in message.content else ""
            return body.removeprefix(_LEDGER_INTRO).removesuffix(f"</{LEDGER_TAG}>").strip()
    return ""


def ledger_input(
    messages: Sequence[Message],
    tools: Sequence[ToolSpec],
    policy: ContextPolicy,
    stored: dict[str, StoredResult],
    chars_per_token: float,
) -> tuple[list[Message], int]:
    """The messages the ledger call reads (every stored result as its preview, the oldest
    turns left out until the request fits), and how many were left out."""
    view = list(messages)
    shrink(view, {k: v.model_copy() for k, v in stored.items()}, policy, until=len(view))
    instruction = Message(role="user", content=ledger_instruction(0))
    budget = policy.input_budget() - policy.ledger_tokens
    head = 2  # the system prompt and the first user message
    while len(view) > 1 and is_ledger(view[min(head, len(view) - 1)]):
        head += 1
    omitted = 0
    while estimate([*view, instruction], tools, chars_per_token) > budget:
        starts = [i for i in turn_starts(view) if i >= head]
        if len(starts) < 2:
            break  # only the last turn is left: the caller finds it too long
        cut = starts[1] - starts[0]
        del view[starts[0] : starts[1]]
        omitted += cut
    return view, omitted


def first_kept(messages: Sequence[Message], keep_turns: int) -> int:
    """Where the turns a compaction keeps start: the last ``keep_turns`` turns (at least one
    message is always replaced, when there is anything to replace)."""
    return recent_start(messages, keep_turns)


def compacted(messages: Sequence[Message], ledger: Message, keep_from: int) -> list[Message]:
    """The conversation after a compaction: the system prompt and the first user message, the
    ledger, and the kept turns."""
    return [*messages[:2], ledger, *messages[keep_from:]]
