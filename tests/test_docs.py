"""The documentation site builds in strict mode (a broken link or a page left out of the nav
fails it), and its pages load nothing from another host."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MKDOCS = Path(sys.executable).with_name("mkdocs")
#: What a page loads by itself: scripts, style sheets, images, frames.
_LOADS = re.compile(
    r"<(?:script|img|iframe)\b[^>]*\bsrc=\"([^\"]+)\"|<link\b[^>]*\bhref=\"([^\"]+)\""
)


def test_the_site_builds_strictly_and_loads_nothing_from_outside(tmp_path: Path) -> None:
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    built = subprocess.run(
        [str(MKDOCS), "build", "--strict", "--site-dir", str(site)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 15
    for page in pages:
        for match in _LOADS.finditer(page.read_text(encoding="utf-8")):
            url = match.group(1) or match.group(2)
            assert not re.match(r"(?:https?:)?//", url), f"{page.name} loads {url}"


def test_the_readme_is_short_and_maps_the_docs() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    for target in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (REPO / target).is_file(), target
