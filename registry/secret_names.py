"""Which environment variables hold secrets, by name: keys, tokens, passwords, URLs with one.

The worker's hardening takes them out of ``os.environ`` (:mod:`workers.hardening`), and the
settings refuse to let bundle configurations expand them (``mcp_env_allow``). Variables named
``ONGRID_SKILL_<NAME>`` are secrets too: they are the skill secrets an administrator hands to
skill manifests' HTTP headers and to the config file's MCP servers, kept by the worker in a
holder of their own rather than in its environment.
"""

from __future__ import annotations

import re

__all__ = ["SKILL_SECRET_PREFIX", "is_secret", "is_skill_secret"]

#: The prefix of the variables that hold skill secrets.
SKILL_SECRET_PREFIX = "ONGRID_SKILL_"
_SECRET = re.compile(
    r"(?i)(_API_KEY|_KEY_ID|_ACCESS_KEY|_TOKEN|_SECRET|_PASSWORD|_PASSWD|_CREDENTIALS?)$"
    r"|^(REDIS_URL|ONGRID_DATABASE_URL|DATABASE_URL|CELERY_BROKER_URL|CELERY_RESULT_BACKEND)$"
    rf"|^{SKILL_SECRET_PREFIX}"
)


def is_secret(name: str) -> bool:
    """Whether an environment variable of this name is treated as a secret."""
    return _SECRET.search(name) is not None


def is_skill_secret(name: str) -> bool:
    """Whether the variable is a skill secret (``ONGRID_SKILL_<NAME>``)."""
    return name.startswith(SKILL_SECRET_PREFIX) and len(name) > len(SKILL_SECRET_PREFIX)
