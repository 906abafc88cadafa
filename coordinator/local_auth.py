"""Credentials ``ongrid up`` makes for the person at this machine: an admin token for the API, a
login for Flower, and the password of the Redis it embeds (with that Redis's URL, for the
``ongrid`` commands run in the same directory).

Each is generated once and kept in a file under the data directory that only its owner can read:
the file appears whole (written under a temporary name, then hard-linked into place, so a second
``ongrid up`` starting at the same moment reads the first one's value, never half of it) and is
reused on every later start. A file that other users could read is refused, not used.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

from registry.errors import UserError
from registry.settings import LOCAL_ADMIN_USER, Settings

__all__ = [
    "FLOWER_FILE",
    "FLOWER_USER",
    "LOCAL_ADMIN_USER",
    "REDIS_PASSWORD_FILE",
    "REDIS_URL_FILE",
    "TOKEN_FILE",
    "flower_login",
    "local_admin_token",
    "read_local_token",
    "read_or_create",
    "redis_password",
    "with_local_redis",
    "write_redis_url",
]

#: The local admin token's file, under the data directory.
TOKEN_FILE = "local-admin-token"
#: Flower's ``user:password``, under the data directory.
FLOWER_FILE = "flower-basic-auth"
#: The user name of the generated Flower login.
FLOWER_USER = "ongrid"
#: The password of the Redis ``ongrid up`` embeds, under the data directory.
REDIS_PASSWORD_FILE = "redis-password"
#: That Redis's URL (with the password), written at each start: its port may change.
REDIS_URL_FILE = "redis-url"


def local_admin_token(data_dir: Path, given: str | None = None) -> tuple[Path, str, bool]:
    """(file, token, created): the token the API accepts for the local admin.

    ``given`` (an operator's ``ONGRID_ADMIN_TOKEN``) replaces what the file held; otherwise the
    file's token is kept, or one is generated and stored the first time.
    """
    path = data_dir / TOKEN_FILE
    if given is None:
        token, created = read_or_create(path, lambda: secrets.token_urlsafe(32))
        return path, token, created
    if len(given) < 16 or not given.isprintable() or given != given.strip():
        raise UserError(
            "ONGRID_ADMIN_TOKEN must be at least 16 printable characters without surrounding "
            "spaces (`openssl rand -base64 32` makes one)"
        )
    try:
        if _read_private(path) == given:
            return path, given, False
    except FileNotFoundError:
        pass
    _private_dir(path.parent)
    partial = _write_partial(path, given)
    try:
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path, given, True


def read_local_token(data_dir: Path) -> str | None:
    """The local admin token ``ongrid up`` made in ``data_dir``, or None when there is none."""
    try:
        return _read_private(data_dir / TOKEN_FILE)
    except FileNotFoundError:
        return None


def flower_login(data_dir: Path) -> tuple[Path, str, bool]:
    """(file, ``user:password``, created): the basic-auth login Flower is started with."""
    path = data_dir / FLOWER_FILE
    login, created = read_or_create(path, lambda: f"{FLOWER_USER}:{secrets.token_urlsafe(18)}")
    user, sep, password = login.partition(":")
    if not (user and sep and password) or "," in login:
        raise UserError(f"{path} must hold one 'user:password' line; delete it to make a new one")
    return path, login, created


def redis_password(data_dir: Path) -> str:
    """The password of the runtime's user on the Redis ``ongrid up`` embeds."""
    password, _ = read_or_create(data_dir / REDIS_PASSWORD_FILE, lambda: secrets.token_urlsafe(24))
    return password


def write_redis_url(data_dir: Path, url: str) -> Path:
    """Keep ``url`` owner-only in ``data_dir``, replacing whatever was there in one rename."""
    _private_dir(data_dir)
    path = data_dir / REDIS_URL_FILE
    partial = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(url + "\n")
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path


def with_local_redis(settings: Settings) -> Settings:
    """``settings`` with the URL of the Redis ``ongrid up`` runs from this directory when
    ``REDIS_URL`` sets none: an ``ongrid`` command run beside ``up`` finds it, password
    included, without the password ever being printed or exported."""
    if settings.redis_url:
        return settings
    try:
        url = _read_private(settings.data_dir / REDIS_URL_FILE)
    except FileNotFoundError:
        return settings
    return settings.model_copy(update={"redis_url": url})


def read_or_create(path: Path, make: Callable[[], str]) -> tuple[str, bool]:
    """The secret kept in ``path``, made by ``make`` and stored first when there is none."""
    try:
        return _read_private(path), False
    except FileNotFoundError:
        pass
    _private_dir(path.parent)
    value = make()
    partial = _write_partial(path, value)
    try:
        try:
            os.link(partial, path)
        except FileExistsError:  # another start made it in the meantime: theirs wins
            return _read_private(path), False
    finally:
        partial.unlink(missing_ok=True)
    return value, True


def _write_partial(path: Path, value: str) -> Path:
    """``value`` written owner-only and synced to a new file beside ``path``, to be linked or
    renamed into place (a reader never sees half a secret)."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)  # exactly owner-only, whatever the umask
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(value + "\n")
            out.flush()
            os.fsync(out.fileno())
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return partial


def _private_dir(directory: Path) -> None:
    """Create ``directory`` owner-only when it is missing; an existing one is left as it is."""
    if directory.is_dir():
        return
    try:
        directory.mkdir(parents=True, mode=0o700)
        os.chmod(directory, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise UserError(f"cannot create the data directory {directory}: {exc.strerror}") from None


def _read_private(path: Path) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror}") from None
    with os.fdopen(fd, encoding="utf-8") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise UserError(f"{path} is not a regular file")
        if info.st_uid != os.geteuid():
            raise UserError(f"{path} belongs to another user (uid {info.st_uid})")
        if info.st_mode & 0o077:
            raise UserError(
                f"{path} can be read by other users (mode {stat.S_IMODE(info.st_mode):04o}): "
                f"run chmod 600 {path}, or delete it to make a new one"
            )
        value = file.read().strip()
    if not value:
        raise UserError(f"{path} is empty; delete it to make a new one")
    return value
