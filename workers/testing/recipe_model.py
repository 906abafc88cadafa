"""A scripted model that follows a recipe: each reply decided from the conversation it is sent.

The fake OpenAI server (:mod:`workers.testing.fake_openai`) answers every request with what a
*follower* decides. A follower is a plain function of the :class:`Conversation` so far (the task,
the tools offered, each tool call already made and its result) returning the next step: one more
tool call, or the final answer. It parses the previous result to choose the next call (``df``
output → the full mount → ``du`` on it), as a model following a persona's written recipe would,
so the run's evidence comes from the live system, never from the script::

    def follow(conv: Conversation) -> Reply:
        if not conv.observations:
            return call("bash", command="df -hT")
        mount = fullest_mount(conv.last.result)
        return answer(f"Status: critical. {mount} is full.")

    with RecipeModel(follow, max_calls=6) as model:
        ...  # workers reach it at model.base_url, through litellm, over a socket

Requests go over HTTP exactly as to a provider; only the replies are scripted.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workers.testing.fake_openai import FakeOpenAI, Reply, ToolCallReply

__all__ = [
    "Conversation",
    "Follower",
    "Observation",
    "RecipeModel",
    "answer",
    "call",
]


@dataclass(frozen=True)
class Observation:
    """One tool call the model made, and the result the worker sent back."""

    tool: str
    arguments: dict[str, Any]
    result: str
    call_id: str


@dataclass(frozen=True)
class Conversation:
    """What a chat request tells the model: its task, its tools, what it did and saw so far."""

    system: str
    task: str
    """The first user message: the rendered ``initial_prompt`` and the prompt."""
    tools: tuple[str, ...]
    observations: tuple[Observation, ...]

    @classmethod
    def from_request(cls, body: dict[str, Any]) -> Conversation:
        """Read an OpenAI chat request body: the reminders a framework adds on every turn
        (``<system-reminder>`` user messages) are not the task."""
        messages: list[dict[str, Any]] = body.get("messages") or []
        system = "\n".join(_text(m) for m in messages if m.get("role") == "system")
        users = [_text(m) for m in messages if m.get("role") == "user"]
        tasks = [u for u in users if not u.lstrip().startswith("<system-reminder>")]
        results = {m.get("tool_call_id"): _text(m) for m in messages if m.get("role") == "tool"}
        observations = []
        for message in messages:
            if message.get("role") != "assistant":
                continue
            for made in message.get("tool_calls") or ():
                function = made.get("function") or {}
                raw = function.get("arguments") or "{}"
                observations.append(
                    Observation(
                        tool=str(function.get("name", "")),
                        arguments=json.loads(raw) if isinstance(raw, str) else dict(raw),
                        result=results.get(made.get("id"), ""),
                        call_id=str(made.get("id", "")),
                    )
                )
        tools = tuple(
            str((t.get("function") or {}).get("name", "")) for t in body.get("tools") or ()
        )
        return cls(system, tasks[0] if tasks else "", tools, tuple(observations))

    @property
    def last(self) -> Observation:
        """The latest tool call and its result (there must be one)."""
        if not self.observations:
            raise LookupError("no tool has been called yet")
        return self.observations[-1]

    def of(self, tool: str) -> list[Observation]:
        """The calls of ``tool``, in order."""
        return [o for o in self.observations if o.tool == tool]


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


#: Decides the model's next step from the conversation so far.
Follower = Callable[[Conversation], Reply]


def call(tool: str, **arguments: Any) -> Reply:
    """The next step: call ``tool`` with ``arguments``."""
    return Reply(tool_calls=[ToolCallReply(name=tool, arguments=arguments)])


def answer(text: str) -> Reply:
    """The next step: the final answer ``text``."""
    return Reply(content=text)


class RecipeModel:
    """The fake OpenAI server in this process, every reply decided by ``follower``.

    ``max_calls`` bounds the tool calls of one conversation: a follower that asks for more fails
    the request (a 500 the worker reports), so a recipe that loses its way cannot run forever.
    Each decision is appended to ``log_path`` (JSON lines), when given, to read after a failure.
    """

    def __init__(
        self, follower: Follower, *, max_calls: int | None = None, log_path: Path | None = None
    ) -> None:
        self.follower = follower
        self.max_calls = max_calls
        self.log_path = log_path
        self._lock = threading.Lock()
        self._server = FakeOpenAI(policy=self._decide)

    @property
    def base_url(self) -> str:
        return self._server.base_url

    def requests(self) -> list[dict[str, Any]]:
        """Every chat request body received so far, in order."""
        return self._server.requests()

    def _decide(self, body: dict[str, Any]) -> Reply:
        conversation = Conversation.from_request(body)
        reply = self.follower(conversation)
        made = len(conversation.observations) + len(reply.tool_calls)
        if self.max_calls is not None and made > self.max_calls:
            raise RuntimeError(
                f"the recipe asked for tool call {made}, over its budget of {self.max_calls}: "
                f"{[c.name for c in reply.tool_calls]}"
            )
        self._log(conversation, reply)
        return reply

    def _log(self, conversation: Conversation, reply: Reply) -> None:
        if self.log_path is None:
            return
        entry = {
            "after": [o.tool for o in conversation.observations],
            "reply": reply.model_dump(exclude_defaults=True),
        }
        with self._lock, open(self.log_path, "a", encoding="utf-8") as out:
            out.write(json.dumps(entry) + "\n")

    def __enter__(self) -> RecipeModel:
        if self.log_path is not None:
            self.log_path.write_text("", encoding="utf-8")
        self._server.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.__exit__(*exc_info)

    def stop(self) -> None:
        self.__exit__(None, None, None)
