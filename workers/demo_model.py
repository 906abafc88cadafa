"""The offline demo model: deterministic, not an LLM.

It lets a fresh install run a whole spawn with no credentials. As a specialist, on its first turn
it calls the first host tool it finds in the bag (a real call, real output), on the next it
answers with a summary of what the tool returned. As the coordinator (``spawn_agent`` in the bag)
it routes by word overlap between the question and each catalog line of its system prompt, then
relays the specialist's answer. Every answer says that it comes from the demo model.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator

from workers.messages import Message, ToolCall, Usage
from workers.model import ModelReply, ModelRequest

__all__ = ["DemoModel", "route"]

_BANNER = "[demo model: deterministic, not an LLM — set ONGRID_DEFAULT_MODEL for a real one]"
#: Tools the demo calls when they are in the bag, with the arguments it uses (first match wins).
_PROBES: tuple[tuple[str, dict[str, object]], ...] = (
    ("host_probe", {"section": "disk"}),
    ("get_edge_summary", {}),
)
_AGENT_TOOL = "spawn_agent"
_CATALOG_LINE = re.compile(r"^- `([^`]+)`(?: \(background\))?: (.*)$", re.MULTILINE)
_STOP = frozenset(
    [
        "the",
        "and",
        "for",
        "with",
        "when",
        "user",
        "asks",
        "about",
        "that",
        "this",
        "from",
        "into",
        "what",
        "why",
        "how",
        "are",
        "any",
        "has",
        "have",
        "not",
        "one",
        "use",
        "your",
        "you",
        "its",
        "their",
        "there",
        "them",
        "been",
        "does",
    ]
)


def _words(text: str) -> Iterator[str]:
    parts = text.split(" ")
    for i, part in enumerate(parts):
        yield part if i == len(parts) - 1 else part + " "


def _tokens(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if len(w) > 2 and w not in _STOP}


def route(question: str, system_prompt: str) -> tuple[str, str] | None:
    """(persona, why) of the catalog line sharing most words with ``question``: the reason a
    person reads on the tile, naming the words that matched."""
    wanted = _tokens(question)
    best: tuple[int, str, str] | None = None
    for name, text in _CATALOG_LINE.findall(system_prompt):
        shared = wanted & _tokens(f"{name.replace('_', ' ').replace('-', ' ')} {text}")
        if shared and (best is None or len(shared) > best[0]):
            best = (len(shared), name, ", ".join(f"“{w}”" for w in sorted(shared)))
    if best is None:
        fallback = "generalist" if "- `generalist`" in system_prompt else None
        return (fallback, "no specialist's trigger matched the question") if fallback else None
    words = "word" if best[0] == 1 else "words"
    return best[1], f"the question's {words} {best[2]} match its trigger"


def _question(request: ModelRequest) -> str:
    return next(
        (
            m.content
            for m in reversed(request.messages)
            if m.role == "user" and not m.content.startswith("<system-reminder>")
        ),
        "",
    )


def _reply(text: str) -> Iterator[str | ModelReply]:
    yield from _words(text)
    yield ModelReply(message=Message(role="assistant", content=text), usage=Usage(model_calls=1))


def _call(name: str, args: dict[str, object], turn: int) -> ModelReply:
    call = ToolCall(id=f"demo_{turn}_0", name=name, arguments=json.dumps(args))
    message = Message(role="assistant", content="", tool_calls=[call])
    return ModelReply(message=message, usage=Usage(model_calls=1), finish_reason="tool_calls")


class DemoModel:
    async def stream(self, request: ModelRequest) -> AsyncIterator[str | ModelReply]:
        for item in self._answer(request):
            yield item

    def _answer(self, request: ModelRequest) -> Iterator[str | ModelReply]:
        offered = {t.name for t in request.tools}
        turn = sum(1 for m in request.messages if m.role == "assistant")
        results = [m for m in request.messages if m.role == "tool"]
        if _AGENT_TOOL in offered:
            yield from self._coordinate(request, turn, results)
            return
        probe = next((p for p in _PROBES if p[0] in offered), None)
        if turn == 0 and probe:
            yield _call(probe[0], probe[1], turn)
            return
        lines = [_BANNER, f"Question: {_question(request).strip()[:300]}"]
        for result in results:
            lines.append(f"Evidence from {result.name}: {result.content.strip()[:600]}")
        if not results:
            lines.append("No host tool was in my bag, so I have no evidence to report.")
        yield from _reply("\n".join(lines))

    @staticmethod
    def _coordinate(
        request: ModelRequest, turn: int, results: list[Message]
    ) -> Iterator[str | ModelReply]:
        question = _question(request)
        if results:
            yield from _reply(f"{_BANNER}\n{results[-1].content.strip()}")
            return
        system = request.messages[0].content if request.messages else ""
        choice = route(question, system)
        if choice is None:
            yield from _reply(f"{_BANNER}\nNo specialist in my catalog matches this question.")
            return
        agent, reason = choice
        yield _call(_AGENT_TOOL, {"agent": agent, "prompt": question, "reason": reason}, turn)
