"""Which model a spawn runs: persona → organisation default → alias → provider mapping, or a
problem that says what to set; the demo only where no model is configured."""

from __future__ import annotations

import pytest

from workers import _litellm
from workers.model import DEMO_MODEL, ModelChoice, ModelError, Readiness, resolve_model

#: What a fake adapter answers: the providers litellm knows, and the keys each one needs.
KEYS = {
    "openai": "OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
    "zai": "ZAI_API_KEY",
    "openrouter": "OPENROUTER_API_KEY",
    "together_ai": "TOGETHERAI_API_KEY",
}


def adapter(*configured: str):
    """A fake ``readiness``: providers of :data:`KEYS`, keys set for ``configured``; it records
    what it was asked."""
    asked: list[str] = []

    def ready(model_id: str) -> Readiness:
        asked.append(model_id)
        provider, slash, _ = model_id.partition("/")
        if not slash and model_id.startswith("gpt-"):
            provider = "openai"
        if provider not in KEYS:
            return Readiness(None)
        return Readiness(provider, () if provider in configured else (KEYS[provider],))

    ready.asked = asked  # type: ignore[attr-defined]
    return ready


def resolve(persona: str, default: str = "", provider: str = "", *configured: str) -> ModelChoice:
    return resolve_model(
        persona, default_model=default, default_provider=provider, readiness=adapter(*configured)
    )


def test_persona_model_wins() -> None:
    chosen = resolve("anthropic/claude-x", "openai/gpt-4o", "openai", "openai", "anthropic")
    assert chosen == ModelChoice("anthropic/claude-x")


def test_empty_persona_model_takes_the_default() -> None:
    assert resolve("", "openai/gpt-4o-mini", "", "openai").model_id == "openai/gpt-4o-mini"


def test_no_model_configured_anywhere_is_the_demo() -> None:
    chosen = resolve("", "", "openai", "openai")
    assert chosen.model_id == DEMO_MODEL and not chosen.problem


def test_the_demo_needs_no_credentials() -> None:
    ready = adapter()
    chosen = resolve_model(DEMO_MODEL, default_model="", default_provider="", readiness=ready)
    assert chosen == ModelChoice(DEMO_MODEL) and ready.asked == []  # type: ignore[attr-defined]


def test_zhipu_is_litellms_zai() -> None:
    assert resolve("zhipu/glm-4.7", "", "", "zai") == ModelChoice("zai/glm-4.7")


def test_zhipu_without_its_key_names_the_variable() -> None:
    chosen = resolve("zhipu/glm-4.7", "anthropic/claude-sonnet-4-6", "", "anthropic")
    assert chosen.model_id == "zhipu/glm-4.7"
    assert chosen.problem == (
        "model zhipu/glm-4.7 (zai/glm-4.7) cannot be used: zai needs ZAI_API_KEY; set "
        "ZAI_API_KEY, or ONGRID_DEFAULT_PROVIDER to a provider that is configured"
    )


def test_provider_without_credentials_maps_to_the_default_provider() -> None:
    ready = adapter("openai")
    chosen = resolve_model(
        "anthropic/claude-x", default_model="", default_provider="openai", readiness=ready
    )
    assert chosen == ModelChoice("openai/claude-x")
    assert ready.asked == ["anthropic/claude-x", "openai/claude-x"]  # type: ignore[attr-defined]


def test_an_unknown_provider_maps_to_the_default_provider() -> None:
    assert resolve("nosuchprovider/gpt-99", "", "openai", "openai").model_id == "openai/gpt-99"


def test_the_default_model_is_mapped_too() -> None:
    chosen = resolve("", "anthropic/claude-x", "openrouter", "openrouter")
    assert chosen.model_id == "openrouter/claude-x"


def test_only_the_provider_prefix_is_replaced() -> None:
    chosen = resolve("together_ai/meta/llama-3", "", "openai", "openai")
    assert chosen.model_id == "openai/meta/llama-3"


def test_an_unknown_provider_is_a_problem_never_the_demo() -> None:
    chosen = resolve("nosuchprovider/gpt-99", "openai/gpt-4o", "", "openai")
    assert chosen.model_id == "nosuchprovider/gpt-99"
    assert chosen.problem.startswith(
        "model nosuchprovider/gpt-99 cannot be used: litellm knows no provider 'nosuchprovider'"
    )


def test_a_missing_key_names_it_and_the_default_providers() -> None:
    chosen = resolve("anthropic/claude-sonnet-4-6", "", "openai")
    assert chosen.problem == (
        "model anthropic/claude-sonnet-4-6 cannot be used: anthropic needs ANTHROPIC_API_KEY, "
        "and the default provider's openai/claude-sonnet-4-6 needs OPENAI_API_KEY; set "
        "ANTHROPIC_API_KEY (or OPENAI_API_KEY)"
    )


def test_a_bare_model_name_litellm_routes_is_used_as_it_is() -> None:
    assert resolve("gpt-4o-mini", "", "zai", "openai", "zai").model_id == "gpt-4o-mini"


def test_a_bare_model_name_maps_to_the_default_provider() -> None:
    assert resolve("glm-4.7", "", "zai", "zai").model_id == "zai/glm-4.7"


def test_a_bare_name_nobody_routes_is_a_problem() -> None:
    chosen = resolve("glm-4.7")
    assert "names no provider litellm can route it to" in chosen.problem


# --- the litellm side: real environment ------------------------------------------------------


def test_readiness_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert _litellm.readiness("openai/gpt-4o-mini").usable is False
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    assert _litellm.readiness("openai/gpt-4o-mini").usable is True


def test_readiness_of_a_bare_openai_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    assert _litellm.readiness("gpt-4o-mini").usable is True


@pytest.mark.parametrize("model_id", ["zhipu/glm-4.7", "", "no-such-model-xyz", "/x"])
def test_readiness_of_an_unknown_provider(monkeypatch: pytest.MonkeyPatch, model_id: str) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("ZHIPU_API_KEY", "zk-test")
    assert _litellm.readiness(model_id).usable is False


def test_readiness_names_the_missing_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ZAI_API_KEY", raising=False)
    assert _litellm.readiness("anthropic/claude-sonnet-4-6") == Readiness(
        "anthropic", ("ANTHROPIC_API_KEY",)
    )
    # litellm itself reports no key for zai; its calls fail without one.
    assert _litellm.readiness("zai/glm-4.7") == Readiness("zai", ("ZAI_API_KEY",))
    monkeypatch.setenv("ZAI_API_KEY", "zk-test")
    assert _litellm.readiness("zai/glm-4.7").usable
    assert _litellm.readiness("nosuchprovider/gpt-99") == Readiness(None)
    # Ollama runs on this machine by default: litellm's wish for its URL is not a problem.
    assert _litellm.readiness("ollama/llama3").usable


def test_the_real_adapter_resolves_zhipu_to_zai(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZAI_API_KEY", "zk-test")
    chosen = resolve_model(
        "zhipu/glm-4.7", default_model="", default_provider="", readiness=_litellm.readiness
    )
    assert chosen == ModelChoice("zai/glm-4.7")


def test_model_error_message_names_the_model() -> None:
    error = ModelError("openai/gpt-4o-mini", "rate limited", status=429, retryable=True)
    assert str(error) == "model openai/gpt-4o-mini: rate limited (status 429)"
    assert error.retryable and error.status == 429


def test_a_default_provider_litellm_does_not_know_is_named() -> None:
    chosen = resolve("anthropic/claude-x", "", "opnai", "openai")
    assert chosen.problem == (
        "model anthropic/claude-x cannot be used: anthropic needs ANTHROPIC_API_KEY, and "
        "ONGRID_DEFAULT_PROVIDER=opnai is no provider litellm knows; set ANTHROPIC_API_KEY"
    )
