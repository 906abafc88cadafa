"""What a spawn's model is told: the system prompt, the per-turn reminder, the first message.

SPEC §5: system prompt = the framework's base prompt (unless ``omit_claude_md``) + the persona's
body + its critical reminder in ``<critical-reminder>``; before every model call the framework's
reminders (locale, model, tools) and the critical reminder again; the first user message is the
rendered ``initial_prompt`` followed by the prompt.
"""

from __future__ import annotations

from typing import Any

from registry.persona import Persona
from registry.policy import ToolBag
from registry.template import Rendered, render

__all__ = ["BASE_PROMPT", "first_message", "system_prompt", "turn_reminder"]

BASE_PROMPT = (
    "You are a specialist of Ongrid, an operations platform for SRE teams. You investigate with "
    "the tools you are given and report what they show. Cite the tool output behind each claim. "
    "When a tool fails, say so and work with what you have; never invent data."
)


def system_prompt(persona: Persona, skills: str = "") -> str:
    """The framework's base prompt, the persona's body, ``skills`` (the section naming the
    skills it may load: names and descriptions only), then its critical reminder."""
    parts = [] if persona.omit_claude_md else [BASE_PROMPT]
    parts.append(persona.body.strip())
    parts.append(skills.strip())
    if persona.critical_reminder.strip():
        parts.append(
            f"<critical-reminder>\n{persona.critical_reminder.strip()}\n</critical-reminder>"
        )
    return "\n\n".join(p for p in parts if p)


def turn_reminder(persona: Persona, model_id: str, bag: ToolBag, locale: str) -> str:
    """The framework's reminders, then the persona's critical reminder (SPEC §5)."""
    tools = ", ".join(bag.names()) or "none"
    lines = [
        f"Answer in the locale {locale}.",
        f"You are running on the model {model_id}.",
        f"Tools available: {tools}.",
    ]
    if persona.critical_reminder.strip():
        lines.append(persona.critical_reminder.strip())
    return "\n".join(lines)


def first_message(persona: Persona, prompt: str, context: dict[str, Any]) -> Rendered:
    """The spawn's first user message: the rendered ``initial_prompt``, then the prompt; with
    the context keys the template lacked."""
    if not persona.initial_prompt:
        return Rendered(prompt, [])
    opening = render(persona.initial_prompt, context)
    return Rendered(f"{opening.text.rstrip()}\n\n{prompt}", opening.missing)
