"""Which model a spawn runs: persona → organisation default → provider mapping → demo."""

from __future__ import annotations

import pytest

from workers import _litellm
from workers.model import DEMO_MODEL, ModelError, resolve_model_id


def credentials(*configured: str):
    """A fake ``has_credentials``: true for the given providers; records what it was asked."""
    asked: list[str] = []

    def has(model_id: str) -> bool:
        asked.append(model_id)
        return model_id.partition("/")[0] in configured

    has.asked = asked  # type: ignore[attr-defined]
    return has


def resolve(persona: str, default: str = "", provider: str = "", *configured: str) -> str:
    return resolve_model_id(
        persona,
        default_model=default,
        default_provider=provider,
        has_credentials=credentials(*configured),
    )


def test_persona_model_wins() -> None:
    assert resolve("anthropic/claude-x", "openai/gpt-4o", "openai", "openai", "anthropic") == (
        "anthropic/claude-x"
    )


def test_empty_persona_model_takes_the_default() -> None:
    assert resolve("", "openai/gpt-4o-mini", "", "openai") == "openai/gpt-4o-mini"


def test_nothing_configured_is_the_demo() -> None:
    assert resolve("", "", "openai", "openai") == DEMO_MODEL


def test_the_demo_needs_no_credentials() -> None:
    has = credentials()
    chosen = resolve_model_id(
        DEMO_MODEL, default_model="", default_provider="", has_credentials=has
    )
    assert chosen == DEMO_MODEL and has.asked == []  # type: ignore[attr-defined]


def test_provider_without_credentials_maps_to_the_default_provider() -> None:
    has = credentials("openai")
    chosen = resolve_model_id(
        "zhipu/glm-4.7", default_model="", default_provider="openai", has_credentials=has
    )
    assert chosen == "openai/glm-4.7"
    assert has.asked == ["zhipu/glm-4.7", "openai/glm-4.7"]  # type: ignore[attr-defined]


def test_the_default_model_is_mapped_too() -> None:
    assert resolve("", "anthropic/claude-x", "openrouter", "openrouter") == "openrouter/claude-x"


def test_only_the_provider_prefix_is_replaced() -> None:
    assert resolve("together_ai/meta/llama-3", "", "openai", "openai") == "openai/meta/llama-3"


def test_neither_provider_configured_is_the_demo() -> None:
    assert resolve("zhipu/glm-4.7", "", "openai") == DEMO_MODEL


def test_no_default_provider_is_the_demo() -> None:
    assert resolve("zhipu/glm-4.7", "", "", "openai") == DEMO_MODEL


def test_a_bare_model_name_maps_to_the_default_provider() -> None:
    assert resolve("gpt-4o-mini", "", "openai", "openai") == "openai/gpt-4o-mini"


# --- the litellm side: real environment ------------------------------------------------------


def test_has_credentials_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert _litellm.has_credentials("openai/gpt-4o-mini") is False
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    assert _litellm.has_credentials("openai/gpt-4o-mini") is True


def test_has_credentials_of_a_bare_openai_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    assert _litellm.has_credentials("gpt-4o-mini") is True


@pytest.mark.parametrize("model_id", ["zhipu/glm-4.7", "", "no-such-model-xyz", "/x"])
def test_has_credentials_of_an_unknown_provider(
    monkeypatch: pytest.MonkeyPatch, model_id: str
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("ZHIPU_API_KEY", "zk-test")
    assert _litellm.has_credentials(model_id) is False


def test_model_error_message_names_the_model() -> None:
    error = ModelError("openai/gpt-4o-mini", "rate limited", status=429, retryable=True)
    assert str(error) == "model openai/gpt-4o-mini: rate limited (status 429)"
    assert error.retryable and error.status == 429
