"""Shared fixtures for the registry tests: the persona fixture folders and byte-exact files.

Files whose bytes matter (CRLF line endings, a UTF-8 byte-order mark, non-UTF-8 bytes) are written
here into ``tmp_path`` rather than committed, so git's end-of-line handling cannot normalise them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "personas"

CRLF_TEXT = (
    "---\r\n"
    "name: windows_host_checker\r\n"
    "description: Check a Windows host for failing services.\r\n"
    "when_to_use: |\r\n"
    "  When a Windows host stops answering health checks.\r\n"
    "  Also when its event log fills with service errors.\r\n"
    "tools: [host_probe, query_promql]\r\n"
    "---\r\n"
    "# Windows host checker\r\n"
    "\r\n"
    "List the stopped services first.  \r\n"
    "Then read the System event log.\r\n"
)
CRLF_BODY = (
    "# Windows host checker\r\n"
    "\r\n"
    "List the stopped services first.  \r\n"
    "Then read the System event log.\r\n"
)

BOM_TEXT = (
    "\ufeff---\n"
    "name: bom_persona\n"
    "description: Saved by an editor that writes a byte-order mark.\n"
    "when_to_use: When a file was saved on Windows.\n"
    "---\n"
    "Body after a BOM.\n"
)


@pytest.fixture
def crlf_body() -> str:
    return CRLF_BODY


@pytest.fixture
def valid_dir() -> Path:
    return FIXTURES / "valid"


@pytest.fixture
def broken_dir() -> Path:
    return FIXTURES / "broken"


@pytest.fixture
def byte_files(tmp_path: Path) -> dict[str, Path]:
    """CRLF, BOM, BOM+CRLF and non-UTF-8 persona files, written byte for byte."""
    folder = tmp_path / "bytes"
    folder.mkdir()
    contents = {
        "crlf.md": CRLF_TEXT.encode("utf-8"),
        "bom.md": BOM_TEXT.encode("utf-8"),
        "bom_crlf.md": ("\ufeff" + CRLF_TEXT).encode("utf-8"),
        # "Café" in Latin-1: 0xE9 is not valid UTF-8 on its own.
        "latin1.md": (
            b"---\nname: cafe_checker\ndescription: Caf\xe9 menu service.\n"
            b"when_to_use: When the caf\xe9 is down.\n---\nBody.\n"
        ),
    }
    out = {}
    for name, data in contents.items():
        path = folder / name
        path.write_bytes(data)
        out[name] = path
    return out


PersonaWriter = Callable[..., Path]


@pytest.fixture
def write_persona() -> PersonaWriter:
    """``write_persona(directory, name, description=..., extra=..., body=..., filename=...)``."""

    def write(
        directory: Path,
        name: str,
        *,
        description: str | None = None,
        when_to_use: str = "When the test needs it.",
        extra: str = "",
        body: str = "Body.\n",
        filename: str | None = None,
    ) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / (filename or f"{name}.md")
        text = (
            f"---\nname: {name}\ndescription: {description or f'The {name} persona.'}\n"
            f"when_to_use: {when_to_use}\n{extra}---\n{body}"
        )
        path.write_bytes(text.encode("utf-8"))
        return path

    return write
