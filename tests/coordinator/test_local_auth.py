"""The local admin token and Flower login: made once, owner-only, whole; read by the settings."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from coordinator.auth import Unauthorized, authenticate
from coordinator.local_auth import (
    FLOWER_USER,
    flower_login,
    local_admin_token,
    read_local_token,
    read_or_create,
)
from registry.errors import UserError
from registry.settings import LOCAL_TOKEN_ENV, Settings


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_token_is_made_once_owner_only_in_a_private_directory(tmp_path):
    data = tmp_path / "data"
    path, token, created = local_admin_token(data)
    assert created and path == data / "local-admin-token"
    assert _mode(path) == 0o600 and _mode(data) == 0o700
    assert path.read_text() == token + "\n" and len(token) >= 40
    again = local_admin_token(data)
    assert again == (path, token, False)
    assert read_local_token(data) == token
    assert read_local_token(tmp_path / "elsewhere") is None
    assert [p.name for p in data.iterdir()] == ["local-admin-token"]  # no partial file left


def test_an_operators_token_replaces_the_generated_one_and_a_short_one_changes_nothing(tmp_path):
    data = tmp_path / "data"
    path, generated, _ = local_admin_token(data)
    mine = "operator-chosen-token-0123456789"
    assert local_admin_token(data, mine) == (path, mine, True)
    assert path.read_text() == mine + "\n" and _mode(path) == 0o600
    assert local_admin_token(data, mine) == (path, mine, False)
    assert local_admin_token(data) == (path, mine, False)  # kept once it is there
    with pytest.raises(UserError, match="ONGRID_ADMIN_TOKEN must be at least 16"):
        local_admin_token(data, "short")
    assert read_local_token(data) == mine != generated
    assert [p.name for p in data.iterdir()] == ["local-admin-token"]


def test_an_existing_directory_keeps_its_mode_and_the_umask_does_not_widen_the_file(tmp_path):
    tmp_path.chmod(0o755)
    old = os.umask(0)
    try:
        path, _, _ = local_admin_token(tmp_path)
    finally:
        os.umask(old)
    assert _mode(path) == 0o600 and _mode(tmp_path) == 0o755


def test_a_file_others_can_read_is_refused_not_used(tmp_path):
    path = tmp_path / "local-admin-token"
    path.write_text("a-token-someone-else-could-read\n")
    path.chmod(0o644)
    with pytest.raises(UserError, match=r"can be read by other users \(mode 0644\): run chmod 600"):
        local_admin_token(tmp_path)
    assert path.read_text() == "a-token-someone-else-could-read\n"  # left as it was


def test_an_empty_file_and_a_symlink_are_refused(tmp_path):
    empty = tmp_path / "empty"
    empty.touch(mode=0o600)
    with pytest.raises(UserError, match="is empty; delete it"):
        read_or_create(empty, lambda: "x" * 20)
    target = tmp_path / "target"
    target.write_text("y" * 20)
    target.chmod(0o600)
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(UserError, match="cannot read"):
        read_or_create(link, lambda: "x" * 20)


def test_starts_at_the_same_moment_all_get_the_one_token(tmp_path):
    script = (
        "import sys; from pathlib import Path; "
        "from coordinator.local_auth import local_admin_token; "
        "print(local_admin_token(Path(sys.argv[1]))[1])"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(tmp_path / "d")], stdout=subprocess.PIPE, text=True
        )
        for _ in range(8)
    ]
    tokens = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert tokens == {(tmp_path / "d" / "local-admin-token").read_text().strip()}


def test_the_flower_login_is_user_colon_password(tmp_path):
    path, login, created = flower_login(tmp_path)
    user, _, password = login.partition(":")
    assert created and user == FLOWER_USER and len(password) >= 20 and _mode(path) == 0o600
    assert flower_login(tmp_path) == (path, login, False)
    path.write_text("no-colon-here\n")
    with pytest.raises(UserError, match="one 'user:password' line"):
        flower_login(tmp_path)


def test_settings_accept_the_token_file_as_the_local_admin(tmp_path):
    path, token, _ = local_admin_token(tmp_path)
    settings = Settings.load({LOCAL_TOKEN_ENV: str(path)})
    who = authenticate(settings, f"Bearer {token}")
    assert (who.user, who.role, who.permissions.edit_personas) == ("local-admin", "admin", True)
    with pytest.raises(Unauthorized):
        authenticate(settings, "Bearer " + token[:-1] + ("A" if token[-1] != "A" else "B"))
    assert token not in repr(settings)
    with pytest.raises(Unauthorized):  # without the variable, the file means nothing
        authenticate(Settings.load({}), f"Bearer {token}")


def test_settings_name_a_missing_or_short_token_file(tmp_path):
    with pytest.raises(UserError, match=f"cannot read {LOCAL_TOKEN_ENV} .*nope"):
        Settings.load({LOCAL_TOKEN_ENV: str(tmp_path / "nope")})
    short = tmp_path / "short"
    short.write_text("abc\n")
    with pytest.raises(UserError, match="at least 16 characters"):
        Settings.load({LOCAL_TOKEN_ENV: str(short)})
