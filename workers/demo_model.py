"""The offline demo model: deterministic, not an LLM.

It lets a fresh install run a whole spawn with no credentials: on its first turn it calls the
host tools it finds in the bag (real calls, real output), on the next it answers with a summary
of what the tools returned. Every answer says that it comes from the demo model.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from workers.messages import Message, ToolCall, Usage
from workers.model import ModelReply, ModelRequest

__all__ = ["DemoModel"]

_BANNER = "[demo model: deterministic, not an LLM — set ONGRID_DEFAULT_MODEL for a real one]"
#: Tools the demo calls when they are in the bag, with the arguments it uses.
_PROBES: tuple[tuple[str, dict[str, object]], ...] = (
    ("host_probe", {"section": "disk"}),
    ("get_edge_summary", {}),
)


def _words(text: str) -> Iterator[str]:
    parts = text.split(" ")
    for i, part in enumerate(parts):
        yield part if i == len(parts) - 1 else part + " "


class DemoModel:
    def stream(self, request: ModelRequest) -> Iterator[str | ModelReply]:
        offered = {t["function"]["name"] for t in request.tools}
        turn = sum(1 for m in request.messages if m.role == "assistant")
        calls = [
            ToolCall(id=f"demo_{turn}_{i}", name=name, arguments=json.dumps(args))
            for i, (name, args) in enumerate(p for p in _PROBES if p[0] in offered)
        ]
        if turn == 0 and calls:
            message = Message(role="assistant", content="", tool_calls=calls[:1])
            yield ModelReply(
                message=message, usage=Usage(model_calls=1), finish_reason="tool_calls"
            )
            return
        text = self._answer(request)
        yield from _words(text)
        yield ModelReply(
            message=Message(role="assistant", content=text), usage=Usage(model_calls=1)
        )

    @staticmethod
    def _answer(request: ModelRequest) -> str:
        question = next(
            (
                m.content
                for m in reversed(request.messages)
                if m.role == "user" and not m.content.startswith("<system-reminder>")
            ),
            "",
        )
        results = [m for m in request.messages if m.role == "tool"]
        lines = [_BANNER, f"Question: {question.strip()[:300]}"]
        for result in results:
            lines.append(f"Evidence from {result.name}: {result.content.strip()[:600]}")
        if not results:
            lines.append("No host tool was in my bag, so I have no evidence to report.")
        return "\n".join(lines)
