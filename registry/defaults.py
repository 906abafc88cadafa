"""The registry as the runtime builds it: the builtin personas and the configured disk roots."""

from __future__ import annotations

from registry.agent_registry import AgentRegistry, UserStore
from registry.gates import check_availability
from registry.persona import Persona
from registry.settings import DEFAULT_MARKETPLACE_ROOT, Settings

__all__ = ["BUILTIN_PERSONAS", "build_registry"]

#: Personas registered in code. They cannot be deleted; a user persona of the same name overrides.
BUILTIN_PERSONAS: tuple[Persona, ...] = (
    Persona(
        name="generalist",
        description="Answer an operational question with read-only tools when no specialist fits.",
        when_to_use=(
            "When no specialist's trigger matches the question, or it spans several areas.\n"
            "Prefer a specialist whenever one matches: this persona has no playbook of its own."
        ),
        max_turns=12,
        critical_reminder="Cite the tool output behind every claim; say so when you cannot verify.",
        body=(
            "# Generalist\n\n"
            "You answer operational questions about the user's infrastructure. Use the tools "
            "in your bag to gather evidence before you answer; never guess what you can measure."
            "\n\n"
            "## Output\n\n"
            "- Answer: one or two sentences.\n"
            "- Evidence: the tool calls and the lines of their output that support the answer.\n"
            "- Next step: what a specialist or a person should look at next, if anything.\n"
        ),
    ),
)


def build_registry(settings: Settings, user_store: UserStore | None = None) -> AgentRegistry:
    """Builtins, then ``settings.agent_dirs``, then ``user_store``, with the availability gate."""
    optional = {settings.agents_dir}
    if settings.marketplace_root == DEFAULT_MARKETPLACE_ROOT:
        optional.add(DEFAULT_MARKETPLACE_ROOT)
    return AgentRegistry(
        settings.agent_dirs,
        user_store,
        builtins=BUILTIN_PERSONAS,
        gate=lambda p: check_availability(p, has_config=settings.has_config),
        optional_dirs=optional,
    )
