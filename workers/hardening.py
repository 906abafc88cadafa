"""What a long-running process does once its settings are built, so that secrets stay inside it.

* :func:`set_non_dumpable`: no other process of the same user may read this one's memory or
  ``/proc/<pid>/environ`` (nor attach a debugger); core dumps are off.
* :func:`take_secrets`: secret-bearing variables leave ``os.environ`` (so no code that prints
  the environment, and no child started without an explicit environment, carries them). They
  are kept in a :class:`ProviderCredentials`: model provider keys, which the litellm adapter
  passes to each call explicitly, and the skill secrets (``ONGRID_SKILL_*``), which the worker
  hands to tools through their context (:meth:`ProviderCredentials.skill_secrets`): a skill
  manifest's HTTP header reads them there, never from the environment.

The settings object already holds the other secrets it needs (Redis and database URLs, the
ClickHouse password, token digests). ``/proc/<pid>/environ`` shows the environment the process
was started with whatever ``os.environ`` becomes; being non-dumpable is what closes it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from collections.abc import Mapping, MutableMapping
from types import MappingProxyType

from registry.secret_names import is_secret, is_skill_secret

__all__ = ["ProviderCredentials", "harden_process", "is_secret", "set_non_dumpable", "take_secrets"]

log = logging.getLogger(__name__)

_PR_SET_DUMPABLE = 4
#: Provider (litellm's name) → the variable holding its key, where it is not ``<NAME>_API_KEY``.
_KEY_VARIABLE = {"together_ai": "TOGETHERAI_API_KEY"}
#: Providers that sign with AWS credentials, and litellm's argument for each variable.
_AWS_PROVIDERS = {"bedrock", "sagemaker"}
_AWS_ARGUMENTS = {
    "AWS_ACCESS_KEY_ID": "aws_access_key_id",
    "AWS_SECRET_ACCESS_KEY": "aws_secret_access_key",
    "AWS_SESSION_TOKEN": "aws_session_token",
}


class ProviderCredentials:
    """Model provider keys taken out of the environment; printing it shows names, not values."""

    def __init__(self, values: Mapping[str, str] | None = None) -> None:
        self._values = {k: v for k, v in (values or {}).items() if v}

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> ProviderCredentials:
        """A copy of the secret variables of ``environ`` (``os.environ``), which stays as it is."""
        env = os.environ if environ is None else environ
        return cls({k: v for k, v in env.items() if is_secret(k)})

    def for_provider(self, provider: str) -> dict[str, str]:
        """The keyword arguments that give litellm ``provider``'s credentials ({} if none)."""
        if provider in _AWS_PROVIDERS:
            return {
                arg: self._values[var] for var, arg in _AWS_ARGUMENTS.items() if var in self._values
            }
        variable = _KEY_VARIABLE.get(provider, f"{provider.upper()}_API_KEY")
        key = self._values.get(variable)
        return {"api_key": key} if key else {}

    def skill_secrets(self) -> Mapping[str, str]:
        """The skill secrets (``ONGRID_SKILL_*``) by variable name, read-only."""
        return MappingProxyType({k: v for k, v in self._values.items() if is_skill_secret(k)})

    def names(self) -> list[str]:
        return sorted(self._values)

    def __repr__(self) -> str:
        return f"ProviderCredentials({', '.join(self.names())})"


def set_non_dumpable() -> bool:
    """``prctl(PR_SET_DUMPABLE, 0)``; False where the call is not available (not Linux)."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return False
    libc = ctypes.CDLL(libc_name, use_errno=True)
    return bool(libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0)


def take_secrets(environ: MutableMapping[str, str] | None = None) -> ProviderCredentials:
    """Remove every secret variable from ``environ`` (``os.environ``); return them."""
    env = os.environ if environ is None else environ
    taken = {name: env.pop(name) for name in [n for n in env if is_secret(n)]}
    return ProviderCredentials(taken)


def harden_process() -> ProviderCredentials:
    """Both steps, for a worker or API process whose settings are built."""
    if not set_non_dumpable():
        log.warning("could not mark the process non-dumpable; /proc/<pid>/environ stays readable")
    credentials = take_secrets()
    if credentials.names():
        log.info("secrets moved out of the environment: %s", ", ".join(credentials.names()))
    return credentials
