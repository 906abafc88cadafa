"""The installed layout: the shipped personas inside the wheel, and the CLI from any directory.

``ongrid agents list --json`` runs as a subprocess, twice over: through this virtualenv's
console script (the editable install ./dev makes), and from a wheel built out of a copy of the
tree and installed into a tmp directory. Each run gets its own data directory and an empty
marketplace root, so neither the working directory nor the host's state leaks in.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from registry.defaults import SHIPPED_PERSONA_FILES

REPO = Path(__file__).resolve().parents[2]
ONGRID = Path(sys.executable).with_name("ongrid")
SHIPPED = sorted(SHIPPED_PERSONA_FILES)
#: The folders of the importable packages, whose every file a wheel must carry.
PACKAGE_FOLDERS = ("registry", "workers", "coordinator", "marketplace")
#: A liveness bound only: a build or a CLI start on a loaded 2-core machine takes seconds.
DEADLINE = 180.0
PIP = (sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet")


@dataclass(frozen=True)
class Installed:
    wheel: Path
    site: Path
    #: ``python -P -m coordinator`` with the wheel's directory first on the path: -P keeps the
    #: working directory (the checkout, in one test) off sys.path, so the wheel's code runs.
    command: tuple[str, ...]
    env: dict[str, str]


def _run(command: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, capture_output=True, text=True, timeout=DEADLINE, **kwargs)
    assert done.returncode == 0, f"{' '.join(command)} exited {done.returncode}:\n{done.stderr}"
    return done


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONGRID_")}
    market = tmp_path / "marketplace"
    market.mkdir(exist_ok=True)
    env.update(ONGRID_DATA_DIR=str(tmp_path / "data"), ONGRID_MARKETPLACE_ROOT=str(market))
    env.update(extra)
    return env


def _list(command: Sequence[str], cwd: Path, env: dict[str, str]) -> dict[str, Any]:
    listing: dict[str, Any] = json.loads(
        _run([*command, "agents", "list", "--json"], cwd=cwd, env=env).stdout
    )
    return listing


def _by_name(listing: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {agent["name"]: agent for agent in listing["agents"]}


def _without_own_files(listing: dict[str, Any]) -> dict[str, Any]:
    """``listing`` without what comes from files a person dropped into the checkout's agents/
    (theirs, loaded as disk personas when run from the checkout): the suite reads only what it
    made and what ships."""

    def own(path: str | None) -> bool:
        return (
            bool(path)
            and Path(str(path)).parent.name == "agents"
            and (Path(str(path)).name not in SHIPPED)
        )

    return {
        **listing,
        "agents": [a for a in listing["agents"] if not own(a["path"])],
        "warnings": [w for w in listing["warnings"] if not own(w["path"])],
    }


def _shipped_files(listing: dict[str, Any]) -> list[str]:
    """The file names of the listed personas that come from a shipped file."""
    names = [Path(a["path"]).name for a in listing["agents"] if a["path"]]
    return [n for n in names if n in SHIPPED]


def _assert_shipped_and_generalist(listing: dict[str, Any], root: Path) -> None:
    agents = _by_name(listing)
    assert agents.pop("generalist")["source"] == "builtin"
    assert sorted(Path(a["path"]).name for a in agents.values()) == SHIPPED
    for name, agent in agents.items():
        assert agent["source"] == "disk", name
        assert Path(agent["path"]).parent == root, agent["path"]


# -- the console script of this virtualenv -----------------------------------------------------


@pytest.fixture(scope="module")
def console_script() -> Path:
    if not ONGRID.is_file():
        pytest.fail(f"no console script {ONGRID}: install the package (./dev test does)")
    return ONGRID


def test_the_console_script_lists_the_shipped_personas_from_an_empty_directory(
    tmp_path: Path, console_script: Path
) -> None:
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    listing = _list([str(console_script)], cwd, _env(tmp_path))
    assert listing["warnings"] == []
    shipped_root = Path(_by_name(listing)["disk_specialist"]["path"]).parent
    assert cwd not in shipped_root.parents
    _assert_shipped_and_generalist(listing, shipped_root)


def test_the_console_script_run_from_the_checkout_warns_about_nothing(
    tmp_path: Path, console_script: Path
) -> None:
    listing = _without_own_files(_list([str(console_script)], REPO, _env(tmp_path)))
    assert listing["warnings"] == []
    assert sorted(_shipped_files(listing)) == SHIPPED  # each once


def test_the_switch_turns_the_shipped_personas_off(tmp_path: Path, console_script: Path) -> None:
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    listing = _list([str(console_script)], cwd, _env(tmp_path, ONGRID_SHIPPED_AGENTS="false"))
    assert [a["name"] for a in listing["agents"]] == ["generalist"]
    assert listing["warnings"] == []


# -- a wheel, installed apart ------------------------------------------------------------------


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """A wheel built from a copy of the tree (the build writes build/ and *.egg-info beside its
    sources) without build isolation or an index, installed with ``pip --target``."""
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for folder in PACKAGE_FOLDERS:
        shutil.copytree(REPO / folder, src / folder, ignore=skip)
    (src / "agents").mkdir()
    for name in SHIPPED:  # a person's own files in the checkout's agents/ are not shipped
        shutil.copy2(REPO / "agents" / name, src / "agents" / name)
    out = root / "dist"
    _run(
        [*PIP, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(out), str(src)]
    )
    (wheel,) = out.glob("*.whl")
    site = root / "site"
    _run([*PIP, "install", "--no-deps", "--no-index", "--target", str(site), str(wheel)])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)
    return Installed(wheel, site, (sys.executable, "-P", "-m", "coordinator"), env)


def test_the_wheel_holds_every_package_file_and_the_shipped_personas(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = set(wheel.namelist())
        for persona in SHIPPED:
            member = f"ongrid_agents/{persona}"
            assert member in names, f"{member} is not in {installed.wheel.name}"
            assert wheel.read(member) == (REPO / "agents" / persona).read_bytes(), member
    tree = {
        path.relative_to(REPO).as_posix()
        for folder in PACKAGE_FOLDERS
        for path in (REPO / folder).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    missing = sorted(tree - names)
    assert not missing, (
        f"files of the tree missing from the wheel: {missing}; list new packages under "
        "[tool.setuptools] packages and data files under package-data in pyproject.toml"
    )
    assert not any(n.startswith(("agents/", "tests/")) for n in names)


def test_the_image_copies_every_package_folder() -> None:
    """The Dockerfile builds the image from copies of the package folders: a folder it leaves
    out is an image whose every process fails at its first import."""
    copied = {
        line.split()[1]
        for line in (REPO / "Dockerfile").read_text().splitlines()
        if line.startswith("COPY ") and len(line.split()) == 3
    }
    assert set(PACKAGE_FOLDERS) | {"agents"} <= copied


def test_the_wheel_carries_the_built_console(installed: Installed) -> None:
    dist = REPO / "coordinator" / "web" / "dist"
    if not (dist / "index.html").is_file():
        pytest.skip(f"no console build in {dist} yet (node web/build.mjs makes it)")
    built = sorted(p.relative_to(REPO).as_posix() for p in dist.rglob("*") if p.is_file())
    assert "coordinator/web/dist/assets/app.js" in built, built
    assert "coordinator/web/dist/assets/app.css" in built, built
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = set(wheel.namelist())
        missing = [name for name in built if name not in names]
        assert not missing, f"console files missing from {installed.wheel.name}: {missing}"
        for name in built:
            assert wheel.read(name) == (REPO / name).read_bytes(), name


def test_the_installed_wheel_lists_the_shipped_personas_from_an_empty_directory(
    tmp_path: Path, installed: Installed
) -> None:
    code = _run(
        [sys.executable, "-P", "-c", "import registry; print(registry.__file__)"],
        env=installed.env,
        cwd=tmp_path,
    )
    assert Path(code.stdout.strip()).parent == installed.site / "registry"
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    listing = _list(installed.command, cwd, {**_env(tmp_path), **installed.env})
    assert listing["warnings"] == []
    _assert_shipped_and_generalist(listing, installed.site / "ongrid_agents")


def test_the_installed_wheel_run_from_the_checkout_loads_the_identical_copies_once(
    tmp_path: Path, installed: Installed
) -> None:
    # ./agents of the checkout is another directory than the installed package, with files
    # byte-identical to it: they are the same personas, not duplicates.
    listing = _list(installed.command, REPO, {**_env(tmp_path), **installed.env})
    listing = _without_own_files(listing)
    assert listing["warnings"] == []
    _assert_shipped_and_generalist(listing, installed.site / "ongrid_agents")


def test_a_team_file_of_a_shipped_name_overrides_it_with_one_warning(
    tmp_path: Path, installed: Installed
) -> None:
    team = tmp_path / "team"
    (team / "agents").mkdir(parents=True)
    for name in SHIPPED:
        shutil.copy2(REPO / "agents" / name, team / "agents" / name)
    edited = team / "agents" / "specialist-disk.md"
    edited.write_text(edited.read_text(encoding="utf-8") + "\nOur runbook first.\n", "utf-8")
    listing = _list(installed.command, team, {**_env(tmp_path), **installed.env})
    shipped = installed.site / "ongrid_agents" / "specialist-disk.md"
    assert listing["warnings"] == [
        {
            "path": str(shipped),
            "reason": "shipped persona 'disk_specialist' is overridden by "
            "agents/specialist-disk.md; this file is ignored",
        }
    ]
    disk_specialist = _by_name(listing)["disk_specialist"]
    assert disk_specialist["path"] == "agents/specialist-disk.md"
    assert disk_specialist["body"].endswith("Our runbook first.\n")
    assert disk_specialist["shadows"] == "disk"
    others = {n: a for n, a in _by_name(listing).items() if n not in {"disk_specialist"}}
    assert {Path(a["path"]).parent for a in others.values() if a["path"]} == {shipped.parent}
