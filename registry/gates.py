"""Availability gates from ``metadata``: OS, required binaries, configuration keys, version.

A persona whose gate fails is listed as unavailable with the reason and cannot be spawned; it is
not an error of the file (SPEC §2).
"""

from __future__ import annotations

import platform
import re
import shutil
from collections.abc import Callable

from registry.persona import Persona

__all__ = ["RUNTIME_VERSION", "Gate", "check_availability"]

#: The version ``metadata.ongrid.min_ongrid_version`` is compared with.
RUNTIME_VERSION = "0.1.0"

#: (persona) -> None when it may run here, else the reason it may not.
Gate = Callable[[Persona], "str | None"]


def _version_key(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:4])


def check_availability(
    persona: Persona,
    *,
    has_config: Callable[[str], bool],
    system: str | None = None,
    which: Callable[[str], str | None] = shutil.which,
    version: str = RUNTIME_VERSION,
) -> str | None:
    """Return why ``persona`` cannot run on this host, or ``None`` when it can."""
    meta = persona.metadata
    here = (system or platform.system()).lower()
    if meta.os and here not in {name.lower() for name in meta.os}:
        return f"metadata.os allows {', '.join(meta.os)}; this host runs {here}"
    missing_bins = [b for b in meta.requires.bins if not which(b)]
    if missing_bins:
        return f"metadata.requires.bins: not on PATH: {', '.join(missing_bins)}"
    missing_config = [k for k in meta.requires.config if not has_config(k)]
    if missing_config:
        return f"metadata.requires.config: not set: {', '.join(missing_config)}"
    wanted = meta.ongrid.min_ongrid_version
    if wanted and _version_key(wanted) > _version_key(version):
        return f"metadata.ongrid.min_ongrid_version is {wanted}; this runtime is {version}"
    return None
