"""``ongrid plugins`` in process: listings read without creating anything, bad input is refused
with the reason and changes nothing (the full round trip runs as subprocesses in
``tests/integration/test_marketplace.py``)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from coordinator.cli import main


def _env(tmp_path: Path) -> dict[str, str | None]:
    return {
        "ONGRID_CONFIG": None,
        "ONGRID_DATABASE_URL": None,
        "ONGRID_DATA_DIR": str(tmp_path / "data"),
        "ONGRID_MARKETPLACE_ROOT": str(tmp_path / "root"),
        "REDIS_URL": "redis://127.0.0.1:1/0",  # nothing listens: a listing never needs Redis
    }


def test_listings_without_a_database_are_empty_and_create_nothing(tmp_path: Path) -> None:
    runner = CliRunner()
    for args in (["list"], ["available"], ["marketplace", "list"]):
        done = runner.invoke(main, ["plugins", *args, "--json"], env=_env(tmp_path))
        assert done.exit_code == 0, done.output
        assert json.loads(done.output) == []
    human = runner.invoke(main, ["plugins", "list"], env=_env(tmp_path))
    assert "no plugin installed" in human.output
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_bad_references_and_sources_are_refused_with_the_reason(tmp_path: Path) -> None:
    runner = CliRunner()
    env = _env(tmp_path)
    bad_ref = runner.invoke(main, ["plugins", "install", "plugin-dev"], env=env)
    assert bad_ref.exit_code == 1 and "expected PLUGIN@MARKETPLACE" in bad_ref.output
    missing = runner.invoke(main, ["plugins", "marketplace", "add", str(tmp_path / "no")], env=env)
    assert missing.exit_code == 1 and "not found" in missing.output
    unknown = runner.invoke(main, ["plugins", "remove", "nothing"], env=env)
    assert unknown.exit_code == 1 and "unknown installed plugin 'nothing'" in unknown.output
    listed = runner.invoke(main, ["plugins", "marketplace", "list", "--json"], env=env)
    assert json.loads(listed.output) == []
    assert not (tmp_path / "root" / "plugins").exists()
