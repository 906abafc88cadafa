"""A non-streamed OpenAI-protocol call through litellm's provider adapter, without the rest of
``litellm.acompletion``: the adapter's cheapest path for a background spawn's turns.

``acompletion`` builds a logging object, resolves its settings and runs the synchronous
``completion()`` in a thread before the request leaves, and the OpenAI SDK builds the request
again: 4.1–4.8 ms of CPU per call against 1.4 ms this way (``bench/litellm_paths.py``, 200
concurrent calls). This module sends the same request with the same pieces litellm's own
HTTP handler uses for most providers: ``get_optional_params`` maps the parameters, the provider's
chat config (``OpenAIGPTConfig``) builds headers, URL and body and turns the reply into a
``ModelResponse``, litellm's shared async client (its aiohttp transport) posts it, and a failure
becomes the exception litellm raises for it (``exception_type``). tests/workers/
test_litellm_direct.py checks, against the OpenAI fake, that both paths send the same body and
return the same reply and the same errors.

It is taken only where nothing is lost: no litellm callback registered (see the lean call in
:mod:`workers._litellm`), no streaming, and the ``openai`` provider (OpenAI and every
OpenAI-compatible server addressed as ``openai/<model>``) with a key and base resolved as
litellm's own dispatch resolves them. Any other call goes through ``acompletion``.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from types import ModuleType
from typing import Any, NoReturn

__all__ = ["DirectRoute", "complete", "route"]

#: Where litellm's OpenAI dispatch looks for a base URL and a key, in its order, after the
#: call's own and litellm's module settings.
_BASE_VARIABLES = ("OPENAI_BASE_URL", "OPENAI_API_BASE")
_KEY_VARIABLES = ("OPENAI_API_KEY",)
_DEFAULT_BASE = "https://api.openai.com/v1"


@dataclass(frozen=True)
class DirectRoute:
    """How one model id is called directly: the provider's model name and chat config, and the
    base and key ``get_llm_provider`` supplies for it (OpenAI-compatible hosts)."""

    model: str
    provider: str
    config: Any
    api_base: str | None
    api_key: str | None


class _NoLogging:
    """What a provider config's ``transform_response`` reports to: nobody (no callback is
    registered on this path)."""

    def post_call(self, *args: Any, **kwargs: Any) -> None:
        return None

    def pre_call(self, *args: Any, **kwargs: Any) -> None:
        return None


_NO_LOGGING = _NoLogging()


@functools.lru_cache(maxsize=1024)
def _cached_route(litellm: ModuleType, model_id: str, api_base: str | None) -> DirectRoute | None:
    from litellm.types.utils import LlmProviders
    from litellm.utils import ProviderConfigManager

    try:
        model, provider, key, base = litellm.get_llm_provider(model_id, api_base=api_base)
    except Exception:  # noqa: BLE001 - an unknown provider: the full path reports it
        return None
    if provider != "openai":
        return None
    config = ProviderConfigManager.get_provider_chat_config(
        model=model, provider=LlmProviders(provider)
    )
    if config is None:
        return None
    return DirectRoute(model, provider, config, base, key)


def route(litellm: ModuleType, model_id: str, api_base: str | None) -> DirectRoute | None:
    """The direct route of ``model_id``; ``None``: it goes through ``acompletion``."""
    return _cached_route(litellm, model_id, api_base)


def _first(*values: Any) -> Any:
    return next((v for v in values if v), None)


def _settings(
    litellm: ModuleType, chosen: DirectRoute, api_base: str | None, api_key: str | None
) -> tuple[str, str | None]:
    """``(base, key)`` as litellm's OpenAI dispatch resolves them; ``None`` for a missing key."""
    base = _first(
        api_base,
        chosen.api_base,
        litellm.api_base,
        *(os.environ.get(v) for v in _BASE_VARIABLES),
        _DEFAULT_BASE,
    )
    key = _first(
        api_key,
        chosen.api_key,
        litellm.api_key,
        litellm.openai_key,
        *(os.environ.get(v) for v in _KEY_VARIABLES),
    )
    return str(base), (str(key) if key else None)


@functools.cache
def _handler(litellm: ModuleType) -> Any:
    from litellm.llms.custom_httpx.llm_http_handler import BaseLLMHTTPHandler

    return BaseLLMHTTPHandler()


def _raise_provider_error(litellm: ModuleType, exc: Exception, config: Any) -> NoReturn:
    """Raise the provider's error for a failed post, as litellm's HTTP handler does."""
    _handler(litellm)._handle_error(exc, config)  # raises
    raise exc  # not reached: the handler always raises


async def complete(
    litellm: ModuleType,
    chosen: DirectRoute,
    *,
    messages: list[dict[str, Any]],
    params: dict[str, Any],
    seconds: float,
    api_base: str | None = None,
    api_key: str | None = None,
) -> Any | None:
    """The provider's reply as litellm's ``ModelResponse``, within ``seconds``; ``None`` when
    this call cannot go the direct way (no key resolved: the full path reports that as litellm
    does). Failures raise litellm's exceptions, as ``acompletion`` does."""
    import httpx
    import openai
    from litellm.litellm_core_utils.exception_mapping_utils import exception_type
    from litellm.llms.custom_httpx.http_handler import get_async_httpx_client
    from litellm.types.utils import LlmProviders, ModelResponse

    base, key = _settings(litellm, chosen, api_base, api_key)
    if key is None:
        return None
    model, provider, config = chosen.model, chosen.provider, chosen.config
    try:
        optional = litellm.get_optional_params(
            model=model, custom_llm_provider=provider, messages=messages, **params
        )
        # As litellm's OpenAI handler: no stream options on a whole reply, and the SDK's own
        # request options taken out of the body (extra_body merged in, extra_headers sent).
        optional.pop("stream", None)
        optional.pop("stream_options", None)
        if optional.get("extra_query"):
            return None  # query parameters: only the SDK's path sends them
        extra_headers = optional.pop("extra_headers", None) or {}
        extra_body = optional.pop("extra_body", None) or {}
        optional.pop("extra_query", None)
        settings = {"custom_llm_provider": provider, "api_base": base}
        headers = config.validate_environment(
            headers={},
            model=model,
            messages=messages,
            optional_params=optional,
            litellm_params=settings,
            api_key=key,
            api_base=base,
        )
        url = config.get_complete_url(base, key, model, optional, settings, stream=False)
        body = {
            **config.transform_request(model, messages, optional, settings, headers),
            **extra_body,
        }
        headers.update(extra_headers)
        client = get_async_httpx_client(LlmProviders(provider), params={"ssl_verify": None})
        try:
            try:
                response = await client.post(
                    url=url, headers=headers, data=json.dumps(body), timeout=seconds
                )
            except httpx.TransportError as exc:
                # No answer at all: the OpenAI SDK (the full path) calls it a connection error.
                # (The SDK types the request with its own HTTP client's class; nothing reads it.)
                request = httpx.Request("POST", url)
                raise openai.APIConnectionError(request=request) from exc  # type: ignore[arg-type]
        except Exception as exc:  # noqa: BLE001 - becomes the provider's error, as litellm's own
            _raise_provider_error(litellm, exc, config)
        return config.transform_response(
            model=model,
            raw_response=response,
            model_response=ModelResponse(),
            logging_obj=_NO_LOGGING,
            request_data=body,
            messages=messages,
            optional_params=optional,
            litellm_params=settings,
            encoding=None,
            api_key=key,
        )
    except Exception as exc:  # noqa: BLE001 - mapped to litellm's exception for it, as acompletion
        raise exception_type(
            model=model, original_exception=exc, custom_llm_provider=provider
        ) from exc
